#!/usr/bin/env bash
# tests/data_errors.sh - bad or missing data files, wrong dtype or shape, a
# dataset smaller than the global batch: dpexec exits non-zero with a message
# naming the file, and leaves no partial --save-full output behind.
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
raw = open(f"{d}/x.npy", "rb").read()
open(f"{d}/x_trunc.npy", "wb").write(raw[: len(raw) // 2])
open(f"{d}/x_junk.npy", "wb").write(b"this is not an npy file at all" * 4)
PYEOF

model() { # model NAME XFILE YFILE [XDECL]
	cat >"$T/$1.dp" <<DP
mesh dp_replicate=1, dp_shard=1
data {
  x: f32[batch, ${4:-6}] from npy("$2")
  y: i32[batch]    from npy("$3")
}
model {
  block fc {
    param w: f32[${4:-6}, 5] init normal(0, 0.1)
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
	"$DPC" "$T/$1.dp" -o "$T/$1.bin" || fail "$1: dpc"
}
expect_fail() { # expect_fail NAME SUBSTRING
	local name=$1 sub=$2
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
if env $MPI_ASAN "$DPEXEC" "$T/good.bin" --steps 2 --save-full "$T/good.st" >"$T/good.out" 2>&1 && [ -s "$T/good.st" ]; then
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
IDX=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
if [ -e "$IDX" ]; then
	sed -e "s|npy(\"$T/x.npy\")|idx(\"$IDX\")|" "$T/good.dp" >"$T/idxshape.dp"
	"$DPC" "$T/idxshape.dp" -o "$T/idxshape.bin" && expect_fail idxshape "train-images-idx3-ubyte.gz"
fi
finish data_errors
