#!/usr/bin/env bash
# tests/data_errors.sh - bad or missing data files, wrong dtype or shape, a
# dataset smaller than the global batch, a label out of range: dpexec exits
# non-zero with a message
# naming the file, and leaves no partial --save-full output behind. Then llm.c
# token shards through dpexec (bad magic, wrong size, a glob without a match), and
# tools/text2shard: token counts, the entropy against Python's, nothing left
# behind on an error.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT

$PY - "$T" <<'PYEOF'
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(0)
np.save(f"{d}/x.npy", rng.standard_normal((64, 6)).astype(np.float32))
np.save(f"{d}/y.npy", rng.integers(0, 5, 64).astype(np.int64))
np.save(f"{d}/x_f64.npy", rng.standard_normal((64, 6)))
np.save(f"{d}/x_shape.npy", rng.standard_normal((64, 7)).astype(np.float32))
np.save(f"{d}/y_short.npy", rng.integers(0, 5, 60).astype(np.int32))
np.save(f"{d}/y_float.npy", rng.standard_normal(64).astype(np.float32))
np.save(f"{d}/x_tiny.npy", rng.standard_normal((4, 6)).astype(np.float32))
np.save(f"{d}/y_tiny.npy", rng.integers(0, 5, 4).astype(np.int32))
y = rng.integers(0, 5, 64).astype(np.int32); y[37] = 200 # a label of 200 among 5 classes
np.save(f"{d}/y_range.npy", y)
raw = open(f"{d}/x.npy", "rb").read()
open(f"{d}/x_trunc.npy", "wb").write(raw[: len(raw) // 2])
open(f"{d}/x_junk.npy", "wb").write(b"this is not an npy file at all" * 4)
PYEOF

# dpc checks every data file it can see when it compiles (tests/errors.sh);
# these cases are about dpexec's own checks, for a job that runs where the
# files are not what dpc saw. So each model names its files under
# $T/at_NAME, which does not exist while dpc runs (a warning) and is made a
# link to the data right after: compiled NAME [DIR].
compiled() {
	"$DPC" "$T/$1.dp" -o "$T/$1.bin" >"$T/$1.dpc" 2>&1 || return 1
	ln -s "${2:-$T}" "$T/at_$1"
}
body() { # body N: the model and train sections of a model with N inputs per sample
	cat <<DP
model {
  block fc {
    param w: f32[$1, 5] init normal(0, 0.1)
    param b: f32[5]
    logits = linear(x, w, b)
  }
  loss = cross_entropy(logits, y)
}
train {
  strategy ddp
  optimizer sgd(lr=0.1)
  micro_batch 8
}
DP
}
model() { # model NAME XFILE YFILE [XDECL]
	{ cat <<DP
mesh dp_replicate=1, dp_shard=1
data {
  x: f32[batch, ${4:-6}] from npy("$T/at_$1/$(basename "$2")")
  y: i32[batch]    from npy("$T/at_$1/$(basename "$3")")
}
DP
	body "${4:-6}"; } >"$T/$1.dp"
	compiled "$1" || { fail "$1: dpc"; cat "$T/$1.dpc"; }
}
expect_fail() { # expect_fail NAME SUBSTRING
	local name=$1 sub=$2
	case_on "$name" || return 0
	rm -f "$T/out.st"
	env $MPI_ASAN timeout 120 "$DPEXEC" "$T/$name.bin" --steps 2 --save-full "$T/out.st" >"$T/$name.out" 2>&1
	local rc=$?
	if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "$sub" "$T/$name.out" && [ ! -e "$T/out.st" ] &&
		! grep -q "AddressSanitizer\|runtime error:" "$T/$name.out"; then
		ok "$name: exit $rc, '$sub'"
	else
		fail "$name: want non-zero exit and '$sub', got exit $rc:"
		sed 's/^/      /' "$T/$name.out" | head -n 5
	fi
	# no temp files from the atomic writer either
	ls "$T" | grep -q "^out.st" && fail "$name: left $(ls "$T" | grep '^out.st')"
}

model good "$T/x.npy" "$T/y.npy"
if ! case_on good; then
	:
elif env $MPI_ASAN "$DPEXEC" "$T/good.bin" --steps 2 --save-full "$T/good.st" >"$T/good.out" 2>&1 && [ -s "$T/good.st" ]; then
	ok "the well-formed npy model trains"
else
	fail "the well-formed npy model trains"; sed 's/^/      /' "$T/good.out" | head
fi

model missing "$T/nope.npy" "$T/y.npy";      expect_fail missing "nope.npy"
model dtype "$T/x_f64.npy" "$T/y.npy";       expect_fail dtype "x_f64.npy"
model shape "$T/x_shape.npy" "$T/y.npy";     expect_fail shape "x_shape.npy"
model count "$T/x.npy" "$T/y_short.npy";     expect_fail count "y_short.npy"
model labels "$T/x.npy" "$T/y_float.npy";    expect_fail labels "y_float.npy"
model trunc "$T/x_trunc.npy" "$T/y.npy";     expect_fail trunc "x_trunc.npy"
model junk "$T/x_junk.npy" "$T/y.npy";       expect_fail junk "x_junk.npy"
model tiny "$T/x_tiny.npy" "$T/y_tiny.npy";  expect_fail tiny "global batch"
# found at load (not when its sample is drawn), naming the file, the sample and the .dp line
model range "$T/x.npy" "$T/y_range.npy"
expect_fail range "y_range.npy: label 200 of sample 37 is outside the 5 classes of the model ($T/range.dp:4)"
IDX=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
if [ -e "$IDX" ]; then
	sed -e "s|npy(\"$T/at_good/x.npy\")|idx(\"$T/at_good/$(basename "$IDX")\")|" \
		-e "s|$T/at_good/|$T/at_idxshape/|g" "$T/good.dp" >"$T/idxshape.dp"
	mkdir "$T/idx" && ln -s "$IDX" "$T/y.npy" "$T/idx/"
	compiled idxshape "$T/idx" && expect_fail idxshape "train-images-idx3-ubyte.gz"
fi
# ---- one copy per node (runtime/data_share.c): the node's first rank loads
# each IDX and .npy file into shared memory, the others map it ----
$PY - "$T" <<'PYEOF'
import sys, gzip, struct, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(2)
def idx(path, a):
    gzip.open(path, "wb").write(bytes([0, 0, 8, a.ndim]) + b"".join(struct.pack(">I", n) for n in a.shape) + a.tobytes())
idx(f"{d}/sx.gz", rng.integers(0, 256, (512, 6)).astype(np.uint8))
idx(f"{d}/sy.gz", rng.integers(0, 5, 512).astype(np.uint8))
idx(f"{d}/ex.gz", rng.integers(0, 256, (100, 6)).astype(np.uint8))
idx(f"{d}/ey.gz", rng.integers(0, 5, 100).astype(np.uint8))
g = open(f"{d}/sx.gz", "rb").read()
open(f"{d}/sx_trunc.gz", "wb").write(g[: len(g) // 2])
PYEOF
sharemodel() { # sharemodel NAME XFILE [DIR]: 2 ranks, gzip IDX train and eval data
	{ cat <<DP
mesh dp_replicate=1, dp_shard=2
data {
  x: f32[batch, 6] from idx("$T/at_$1/$2")
  y: i32[batch]    from idx("$T/at_$1/sy.gz")
}
eval {
  x from idx("$T/at_$1/ex.gz")
  y from idx("$T/at_$1/ey.gz")
}
DP
	body 6; } >"$T/$1.dp"
	compiled "$1" "${3:-}" || { fail "$1: dpc"; cat "$T/$1.dpc"; }
}
sharemodel share sx.gz
if case_on share-same; then
	env $MPI_ASAN timeout 120 mpirun --oversubscribe -np 2 "$DPEXEC" "$T/share.bin" --steps 40 \
		--no-timestamps --verbose --losses "$T/share.loss" >"$T/share.out" 2>&1
	rc1=$?
	env $MPI_ASAN DP_DATA_SHARE=0 timeout 120 mpirun --oversubscribe -np 2 "$DPEXEC" "$T/share.bin" \
		--steps 40 --no-timestamps --verbose --losses "$T/own.loss" >"$T/own.out" 2>&1
	rc2=$?
	if [ $rc1 = 0 ] && [ $rc2 = 0 ] && [ "$(wc -l <"$T/share.loss")" = 41 ] &&
		cmp -s "$T/share.loss" "$T/own.loss" &&
		[ "$(grep -c '^eval' "$T/share.out")" -ge 1 ] &&
		cmp -s <(grep '^eval' "$T/share.out") <(grep '^eval' "$T/own.out") &&
		grep -q "^data: the train split's 0.0 MB (5120 bytes) loaded once, mapped by 2 of the 2 ranks of rank 0's node" "$T/share.out" &&
		grep -q "^data: the eval split's 0.0 MB (1000 bytes) loaded once, mapped by 2 of the 2" "$T/share.out" &&
		! grep -q "^data:" "$T/own.out"; then
		ok "share-same: 2 ranks on one node load the gzip IDX files once: losses and eval bitwise those of a copy per rank (DP_DATA_SHARE=0)"
	else
		fail "share-same: exit $rc1/$rc2, losses or eval differ, or no 'data:' lines"
		sed 's/^/      /' "$T/share.out" | head -n 8; diff "$T/share.loss" "$T/own.loss" | head -n 4
	fi
fi
# the leader's read fails: every rank's error, the message naming the file once, no rank waits
sharemodel sharetrunc sx_trunc.gz
if case_on share-trunc; then
	t0=$(now)
	env $MPI_ASAN timeout 120 mpirun --oversubscribe -np 2 "$DPEXEC" "$T/sharetrunc.bin" --steps 2 \
		--no-timestamps >"$T/sharetrunc.out" 2>&1
	rc=$?
	took=$(echo "$(now) - $t0" | bc)
	if [ $rc -ne 0 ] && [ $rc -lt 124 ] && [ "$(grep -c "sx_trunc.gz" "$T/sharetrunc.out")" = 1 ] &&
		grep -q "^dpexec: error: .*data file $T/at_sharetrunc/sx_trunc.gz.*($T/sharetrunc.dp:3)" "$T/sharetrunc.out" &&
		! grep -q "AddressSanitizer\|runtime error:" "$T/sharetrunc.out" &&
		[ "$(echo "$took < 60" | bc)" = 1 ]; then
		ok "share-trunc: a truncated .gz read by the node's first rank ends both ranks (exit $rc, ${took%.*} s), the file named once"
	else
		fail "share-trunc: exit $rc after ${took%.*} s, want non-zero and the file named once"
		sed 's/^/      /' "$T/sharetrunc.out" | head -n 8
	fi
fi
# a rank whose path names another file (its own working directory) reads its own:
# rank 1's sx.gz is cut short, so the job fails, where mapping rank 0's would train;
# rank 1 maps rank 0's sy.gz, the same file
if case_on share-own; then
	mkdir -p "$T/wa/d" "$T/wb/d"
	for f in sx.gz sy.gz ex.gz ey.gz; do ln -s "$T/$f" "$T/wa/d/$f"; ln -s "$T/$f" "$T/wb/d/$f"; done
	rm "$T/wb/d/sx.gz" && cp "$T/sx_trunc.gz" "$T/wb/d/sx.gz"
	sed "s|$T/at_share/|d/|" "$T/share.dp" >"$T/wa/own.dp"
	(cd "$T/wa" && "$DPC" own.dp -o "$T/own.bin" >"$T/ownc.out" 2>&1) || { fail "share-own: dpc"; cat "$T/ownc.out"; }
	env $MPI_ASAN timeout 120 mpirun --oversubscribe -np 1 -wdir "$T/wa" "$DPEXEC" "$T/own.bin" --steps 2 \
		--no-timestamps --verbose : -np 1 -wdir "$T/wb" "$DPEXEC" "$T/own.bin" --steps 2 --no-timestamps \
		--verbose >"$T/ownrun.out" 2>&1
	rc=$?
	if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q "dpexec: error: .*data file d/sx.gz is truncated" "$T/ownrun.out" &&
		grep -q "^data: the train split's .* mapped by 1 of the 2 ranks" "$T/ownrun.out"; then
		ok "share-own: a rank whose path is another file loads that file (exit $rc)"
	else
		fail "share-own: exit $rc, want non-zero naming d/sx.gz, and sy.gz mapped by 1 of 2"; sed 's/^/      /' "$T/ownrun.out" | head -n 8
	fi
fi
# ---- token shards through dpexec ----
TEXT2SHARD=$ROOT/$BUILD/text2shard
$PY - "$T" <<'PYEOF'
import sys, numpy as np
d = sys.argv[1]
def shard(path, toks, magic=20240520, version=1, n=None, cut=0):
    h = np.zeros(256, np.int32); h[0], h[1], h[2] = magic, version, len(toks) if n is None else n
    b = h.tobytes() + np.asarray(toks, np.uint16).tobytes()
    open(path, "wb").write(b[: len(b) - cut] if cut else b)
rng = np.random.default_rng(1)
toks = rng.integers(0, 11, 600)
shard(f"{d}/tok_a.bin", toks[:300]); shard(f"{d}/tok_b.bin", toks[300:])
shard(f"{d}/s_badmagic.bin", toks, magic=1234)
shard(f"{d}/s_badsize.bin", toks, cut=3)
PYEOF
tokmodel() { # tokmodel NAME PATTERN
	cat >"$T/$1.dp" <<DP
mesh dp_replicate=1, dp_shard=1
data {
  x: i32[batch, 8] from tokens("$T/at_$1/$(basename "$2")")
  y: i32[batch, 8] from tokens("$T/at_$1/$(basename "$2")", shift=1)
}
model {
  block emb {
    param wte: f32[11, 4] init normal(0, 0.1)
    h = embedding(x, wte)
  }
  block head {
    param w: f32[4, 11] init normal(0, 0.1)
    logits = matmul(h, w)
  }
  loss = cross_entropy(logits, y)
}
train {
  strategy ddp
  optimizer sgd(lr=0.1)
  micro_batch 4
}
DP
	compiled "$1"
}
if tokmodel tokgood "$T/tok_*.bin"; then
	if ! case_on tokgood; then
		:
	elif env $MPI_ASAN "$DPEXEC" "$T/tokgood.bin" --steps 3 --save-full "$T/tokgood.st" >"$T/tokgood.out" 2>&1 &&
		[ -s "$T/tokgood.st" ]; then
		ok "a model on two token shards trains"
	else
		fail "a model on two token shards trains"; sed 's/^/      /' "$T/tokgood.out" | head
	fi
	tokmodel badmagic "$T/s_badmagic.bin" && expect_fail badmagic "s_badmagic.bin has a bad header"
	tokmodel badsize "$T/s_badsize.bin" && expect_fail badsize "s_badsize.bin has the wrong size"
	tokmodel nomatch "$T/none_*.bin" && expect_fail nomatch "none_\\*.bin matches no file"
else
	fail "dpc compiles a tokens() model:"; sed 's/^/      /' "$T/tokgood.dpc" | head -n 3
fi

# ---- tools/text2shard ----
printf 'the cat sat on the mat.\nthe dog ate the hat!\n' >"$T/a.txt"
printf 'A second file: \x01\xff bytes too.\n' >"$T/b.txt"
if ! case_on text2shard; then
	:
elif out=$("$TEXT2SHARD" -o "$T/t.bin" --val "$T/v.bin" --val-frac 0.25 "$T/a.txt" "$T/b.txt" 2>&1); then
	if $PY - "$T" "$out" <<'PYEOF'; then
import sys, math, re, collections
d, out = sys.argv[1], sys.argv[2]
data = open(f"{d}/a.txt", "rb").read() + open(f"{d}/b.txt", "rb").read()
nval = int(len(data) * 0.25); train, val = data[: len(data) - nval], data[len(data) - nval :]
def shard(path):
    b = open(path, "rb").read()
    h = [int.from_bytes(b[4 * i : 4 * i + 4], "little", signed=True) for i in range(256)]
    toks = [int.from_bytes(b[1024 + 2 * i : 1026 + 2 * i], "little") for i in range(h[2])]
    assert h[:2] == [20240520, 1] and not any(h[3:]), h[:4]
    assert len(b) == 1024 + 2 * h[2], (len(b), h[2])
    return bytes(toks)
assert shard(f"{d}/t.bin") == train, "train tokens are not the bytes"
assert shard(f"{d}/v.bin") == val, "val tokens are not the last 25%"
c = collections.Counter(train)
H = -sum(k / len(train) * math.log(k / len(train)) for k in c.values())
m = re.search(r"train: .*: (\d+) tokens", out); assert m and int(m.group(1)) == len(train), out
m = re.search(r"val: .*: (\d+) tokens", out); assert m and int(m.group(1)) == len(val), out
m = re.search(r"entropy.*: ([0-9.]+) nats/token, ([0-9.]+) bits/byte", out)
assert m and abs(float(m.group(1)) - H) < 1e-4 and abs(float(m.group(2)) - H / math.log(2)) < 1e-4, (out, H)
PYEOF
		ok "text2shard: tokens, counts and entropy match Python"
	else
		fail "text2shard: tokens, counts and entropy match Python"; echo "$out" | sed 's/^/      /'
	fi
else
	fail "text2shard on two files: $out"
fi
t2s_fail() { # t2s_fail NAME WANT_RC SUBSTRING ARGS...: fails, says SUBSTRING, leaves no output
	local name=$1 want=$2 sub=$3; shift 3
	case_on "text2shard-$name" || return 0
	rm -f "$T"/o.bin* "$T"/ov.bin*
	"$TEXT2SHARD" "$@" >"$T/t2s.out" 2>&1
	local rc=$?
	if [ $rc -eq "$want" ] && grep -q -- "$sub" "$T/t2s.out" && ! ls "$T" | grep -q "^o.bin\|^ov.bin"; then
		ok "text2shard $name: exit $rc, '$sub'"
	else
		fail "text2shard $name: want exit $want and '$sub', got $rc:"; sed 's/^/      /' "$T/t2s.out" | head -n 3
		ls "$T" | grep "^o.bin\|^ov.bin" | sed 's/^/      left /'
	fi
}
t2s_fail missing 1 "nope.txt" -o "$T/o.bin" --val "$T/ov.bin" --val-frac 0.1 "$T/a.txt" "$T/nope.txt"
t2s_fail nodir 1 "nodir/v.bin" -o "$T/o.bin" --val "$T/nodir/v.bin" --val-frac 0.1 "$T/a.txt"
t2s_fail isdir 1 "cannot rename" -o "$T/o.bin" --val "$T" --val-frac 0.1 "$T/a.txt"
t2s_fail frac 2 "between 0 and 1" -o "$T/o.bin" --val "$T/ov.bin" --val-frac 1.5 "$T/a.txt"
t2s_fail noval 2 "needs --val-frac" -o "$T/o.bin" --val "$T/ov.bin" "$T/a.txt"
t2s_fail noout 2 "-o OUT.bin is required" "$T/a.txt"
t2s_fail tiny 1 "at least 2" -o "$T/o.bin" --val "$T/ov.bin" --val-frac 0.5 /dev/null
case_on text2shard-help && { "$TEXT2SHARD" --help | grep -q "usage: text2shard -o OUT.bin" && ok "text2shard --help" || fail "text2shard --help"; }
finish data_errors
