#!/usr/bin/env bash
# tests/outputs.sh - every output path is safe (util/outfile.h): dpc -o and
# dpexec --save-full onto a character device made with mknod (it stays a
# device) and onto a symbolic link (the link stays, its target is written);
# directories, missing directories, FIFOs without a reader and full disks
# (/dev/full) are errors with a message and a non-zero exit; a stale temp
# file of a killed write is removed by the next write to the same path.
# --trace goes the same way (a device stays a device, a link its target, a
# planted temp-file link is never followed, a bad path fails before
# training). No output may be an input or another output: dpc -o onto its
# model (also through a link), --save-full/--losses onto the step file, a
# data file, two outputs on one file: refused before any work, the inputs
# unchanged. --losses into a FIFO without a reader: an error, not a hang.
# dpc --stats, --dump-ir and --emit=ir write no step file without -o.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"

X() { env $MPI_ASAN timeout 60 "$DPEXEC" "$@"; }
DPC1() { "$DPC" models/mlp.dp --world-size 1 "$@"; }

DPC1 -o "$T/ref.bin" || fail "dpc models/mlp.dp"
ref_size=$(stat -c %s "$T/ref.bin")

# ---- dpc -o ----
mkchr() { # a null device of our own, $T/chr (the device cases write onto it)
	mknod "$T/chr" c 1 3 2>/dev/null ||
		{ echo "  SKIP mknod is not permitted here (not root?): the device cases"; return 1; }
}
if case_on dpc-device && once chr mkchr; then
	if DPC1 -o "$T/chr" && [ -c "$T/chr" ]; then
		ok "dpc -o onto a character device writes through; it stays a device"
	else
		fail "dpc -o onto a character device"; ls -l "$T/chr"
	fi
fi
if case_on dpc-link; then
	echo old >"$T/target.bin"
	ln -s target.bin "$T/link.bin"
	if DPC1 -o "$T/link.bin" && [ -L "$T/link.bin" ] && [ "$(stat -c %s "$T/target.bin")" = "$ref_size" ]; then
		ok "dpc -o onto a symbolic link writes its target; the link stays"
	else
		fail "dpc -o onto a symbolic link"; ls -l "$T"
	fi
fi
if case_on dpc-dangling-link; then
	ln -s new.bin "$T/dangling.bin"
	if DPC1 -o "$T/dangling.bin" && [ -L "$T/dangling.bin" ] && [ -f "$T/new.bin" ]; then
		ok "dpc -o onto a link to a file not there yet creates the file"
	else
		fail "dpc -o onto a dangling link"
	fi
fi
mkdir "$T/dir"
case_on dpc-directory && expect "dpc -o onto a directory is refused" "refusing to write $T/dir: it is a directory" DPC1 -o "$T/dir"
case_on dpc-missing-dir && expect "dpc -o into a missing directory fails before compiling" "directory $T/no does not exist" \
	DPC1 -o "$T/no/x.bin"
case_on dpc-full-disk && expect "dpc -o onto a full disk (/dev/full)" "cannot write /dev/full: No space left on device" \
	DPC1 -o /dev/full
mkfifo "$T/fifo"
case_on dpc-fifo && expect "dpc -o into a FIFO without a reader" "a FIFO with no reader" DPC1 -o "$T/fifo"
if case_on dpc-stale-temp; then
	echo stale >"$T/fresh.bin.dptmp"
	if DPC1 -o "$T/fresh.bin" && [ ! -e "$T/fresh.bin.dptmp" ] && cmp -s "$T/fresh.bin" "$T/ref.bin"; then
		ok "a stale temp file of a killed write is removed by the next write"
	else
		fail "stale temp file"; ls -l "$T"
	fi
	ls "$T" | grep -q "dptmp" && fail "temp files left: $(ls "$T" | grep dptmp)"
fi
# looking at a model writes no step file on the side (./mlp.bin), only with -o
if ! case_on dpc-look-writes-nothing; then
	:
elif mkdir "$T/look" && (cd "$T/look" && "$DPC" "$ROOT/models/mlp.dp" --world-size 2 --stats >/dev/null &&
	"$DPC" "$ROOT/models/mlp.dp" --world-size 2 --dump-ir=ir >/dev/null &&
	"$DPC" "$ROOT/models/mlp.dp" --world-size 2 --emit=ir >/dev/null) &&
	[ "$(ls "$T/look")" = ir ] && [ -s "$T/look/ir/00-frontend.ir" ]; then
	ok "dpc --stats, --dump-ir and --emit=ir write no ./mlp.bin"
else
	fail "dpc --stats, --dump-ir or --emit=ir wrote a file besides the dump: $(ls "$T/look")"
fi
case_on dpc-stats-o && { mkdir -p "$T/look"; (cd "$T/look" && "$DPC" "$ROOT/models/mlp.dp" --world-size 2 --stats -o s.bin >/dev/null) && [ -s "$T/look/s.bin" ] ||
	fail "dpc --stats -o FILE writes the step file"; }

# ---- dpexec --save-full ----
if case_on save-full-device && once chr mkchr; then
	if X "$T/ref.bin" --steps 1 --quiet --save-full "$T/chr" >"$T/out" 2>&1 && [ -c "$T/chr" ]; then
		ok "--save-full onto a character device writes through; it stays a device"
	else
		fail "--save-full onto a character device"; head -n 5 "$T/out"
	fi
fi
if case_on save-full-link; then
	echo old >"$T/st_target"
	ln -s st_target "$T/st_link"
	if X "$T/ref.bin" --steps 1 --quiet --save-full "$T/st_link" >"$T/out" 2>&1 && [ -L "$T/st_link" ] &&
		[ "$(stat -c %s "$T/st_target")" -gt 900000 ]; then
		ok "--save-full onto a symbolic link writes its target; the link stays"
	else
		fail "--save-full onto a symbolic link"; head -n 5 "$T/out"
	fi
fi
case_on save-full-full-disk && expect "--save-full onto a full disk" "No space left on device" \
	X "$T/ref.bin" --steps 1 --quiet --save-full /dev/full

# ---- logs and checkpoints ----
# a full disk under --losses: the run stops with the error, non-zero
case_on losses-full-disk && expect "--losses on a full disk (/dev/full): an error, non-zero exit" \
	"cannot write the --losses file /dev/full: No space left on device" \
	X "$T/ref.bin" --steps 5 --quiet --losses /dev/full
case_on log-json-full-disk && expect "--log-json on a full disk" "cannot write the --log-json file /dev/full: No space left on device" \
	X "$T/ref.bin" --steps 5 --quiet --log-json /dev/full
# a save directory too small for one checkpoint: found before training
if case_on small-save-dir; then
	mkdir "$T/small"
	if mount -t tmpfs -o size=200k tmpfs "$T/small" 2>/dev/null; then
		expect "a 200 KB tmpfs as the save directory: an error before training" \
			"the save directory $T/small has 0.2 MiB free; a checkpoint of this model needs about 2.9 MiB" \
			X "$T/ref.bin" --steps 5 --save-dir "$T/small"
		unstamp "$T/out" | grep -q "^step 1/" && fail "it trained before finding the save directory too small"
		umount "$T/small"
	else
		echo "  SKIP mounting a 200 KB tmpfs is not permitted here (not root?)"
	fi
fi
echo file >"$T/afile"
case_on save-dir-file && expect "--save-dir onto a file" "the save directory $T/afile is not a directory" \
	X "$T/ref.bin" --steps 5 --save-dir "$T/afile"
# a stale checkpoint temp directory is removed by the next run
if case_on stale-checkpoint-temp; then
	mkdir -p "$T/ck/step-000003.dptmp"
	if X "$T/ref.bin" --steps 3 --quiet --save-dir "$T/ck" >"$T/out" 2>&1 && [ ! -e "$T/ck/step-000003.dptmp" ] &&
		[ "$(cat "$T/ck/latest")" = step-000003 ]; then
		ok "a killed save's temp directory is removed by the next run in the same save directory"
	else
		fail "stale checkpoint temp"; ls "$T/ck"
	fi
fi

# ---- --trace (issue 22, item 1) ----
if case_on trace-device && once chr mkchr && [ -c "$T/chr" ]; then
	if X "$T/ref.bin" --steps 2 --quiet --device cpu --trace "$T/chr" >"$T/out" 2>&1 && [ -c "$T/chr" ]; then
		ok "--trace onto a character device writes through; it stays a device"
	else
		fail "--trace onto a character device"; ls -l "$T/chr"; head -n 5 "$T/out"
	fi
fi
if case_on trace-planted-temp; then
echo victim >"$T/victim"
ln -s victim "$T/tr.json.dptmp"
ln -s victim "$T/tr.json.tmp"
if X "$T/ref.bin" --steps 2 --quiet --device cpu --trace "$T/tr.json" >"$T/out" 2>&1 &&
	[ "$(cat "$T/victim")" = victim ] && [ -f "$T/tr.json" ] && [ ! -L "$T/tr.json" ] &&
	$PY -c 'import json, sys; json.load(open(sys.argv[1]))' "$T/tr.json"; then
	ok "--trace next to planted TRACE.dptmp / .tmp links: the links' target is untouched"
else
	fail "--trace with a planted temp link"; head -c 100 "$T/victim"; head -n 5 "$T/out"
fi
rm -f "$T/tr.json.dptmp" "$T/tr.json.tmp"
fi
if case_on trace-link; then
echo old >"$T/tr_target"
ln -s tr_target "$T/tr_link"
if X "$T/ref.bin" --steps 2 --quiet --device cpu --trace "$T/tr_link" >"$T/out" 2>&1 && [ -L "$T/tr_link" ] &&
	[ "$(stat -c %s "$T/tr_target")" -gt 1000 ]; then
	ok "--trace onto a symbolic link writes its target; the link stays"
else
	fail "--trace onto a symbolic link"; ls -l "$T"/tr_*
fi
fi
if case_on trace-missing-dir; then
expect "--trace into a missing directory fails before training" "--trace: cannot write $T/no/t.json: directory $T/no does not exist" \
	X "$T/ref.bin" --steps 2 --device cpu --trace "$T/no/t.json"
unstamp "$T/out" | grep -q "^step 1/" && fail "it trained before finding the --trace path bad"
fi
case_on trace-full-disk && expect "--trace onto a full disk (/dev/full)" "--trace: cannot write /dev/full: No space left on device" \
	X "$T/ref.bin" --steps 2 --quiet --device cpu --trace /dev/full

# ---- no output is an input or another output (issue 22, item 6) ----
m1() { # $T/m1.dp, a copy of models/mlp.dp at one rank, and m1.orig
	cp models/mlp.dp "$T/m.dp"
	variant "$T/m.dp" "$T/m1.dp" 's/^mesh .*/mesh dp_shard=1/'
	cp "$T/m1.dp" "$T/m1.orig"
}
if case_on dpc-o-onto-input; then
once m1 m1
expect "dpc -o onto its own input is refused" "dpc: -o $T/m1.dp is the input: refusing to overwrite an input" \
	"$DPC" "$T/m1.dp" -o "$T/m1.dp"
ln -s m1.dp "$T/m1link.bin"
expect "dpc -o onto a link to its input is refused" "-o $T/m1link.bin is the input $T/m1.dp" \
	"$DPC" "$T/m1.dp" -o "$T/m1link.bin"
expect "dpc -o onto its input by another spelling is refused" "is the input" \
	"$DPC" "$T/m1.dp" -o "$T/../$(basename "$T")/m1.dp"
check "the model is unchanged" cmp -s "$T/m1.dp" "$T/m1.orig"
fi
sbin() { cp "$T/ref.bin" "$T/s.bin"; } # a copy of the step file the cases below run
if case_on outputs-onto-step-file; then
once s sbin
expect "--save-full onto the step file is refused" "--save-full $T/s.bin is the step file: refusing to overwrite an input" \
	X "$T/s.bin" --steps 1 --save-full "$T/s.bin"
expect "--losses onto the step file is refused" "--losses $T/s.bin is the step file" \
	X "$T/s.bin" --steps 1 --losses "$T/s.bin"
check "the step file is unchanged" cmp -s "$T/s.bin" "$T/ref.bin"
fi
if case_on two-outputs-one-file; then
once s sbin
expect "--losses and --log-json on one file are refused" "--losses $T/x and --log-json $T/x are the same file" \
	X "$T/s.bin" --steps 1 --losses "$T/x" --log-json "$T/x"
ln -s x "$T/xlink"
expect "--losses and --trace on one file through a link are refused" "are the same file" \
	X "$T/s.bin" --steps 1 --device cpu --losses "$T/x" --trace "$T/xlink"
check "neither was written" [ ! -e "$T/x" ]
fi
if case_on output-onto-data-file; then
once m1 m1
# a data file of the model: its own copy of the labels
cp /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz "$T/labels.gz"
cp "$T/labels.gz" "$T/labels.orig"
variant "$T/m1.dp" "$T/mlab.dp" 's|"/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"|"'"$T"'/labels.gz"|'
"$DPC" "$T/mlab.dp" -o "$T/mlab.bin" >/dev/null 2>&1 || fail "dpc mlab.dp"
expect "--log-json onto a data file of the model is refused" "--log-json $T/labels.gz is a data file of the model" \
	X "$T/mlab.bin" --steps 1 --log-json "$T/labels.gz"
check "the data file is unchanged" cmp -s "$T/labels.gz" "$T/labels.orig"
fi
if case_on save-full-onto-init-from; then
once s sbin
# (the parameters save-full-link wrote, or the same written here)
[ -e "$T/st_target" ] || X "$T/ref.bin" --steps 1 --quiet --save-full "$T/st_target" >/dev/null 2>&1
cp "$T/st_target" "$T/w.st"
expect "--save-full onto --init-from is refused" "--save-full $T/w.st is --init-from" \
	X "$T/s.bin" --steps 1 --init-from "$T/w.st" --save-full "$T/w.st"
fi
if ! case_on two-outputs-dev-null; then
	:
elif once s sbin; X "$T/s.bin" --steps 1 --quiet --losses /dev/null --log-json /dev/null >"$T/out" 2>&1; then
	ok "two outputs on /dev/null (a character device) are fine"
else
	fail "two outputs on /dev/null"; head -n 3 "$T/out"
fi

# ---- a FIFO without a reader (issue 22, item 10) ----
once s sbin # (both FIFO cases)
case_on losses-fifo-no-reader &&
expect "--losses into a FIFO without a reader: an error at once, no hang" \
	"--losses: cannot write $T/fifo: a FIFO with no reader" X "$T/s.bin" --steps 2 --losses "$T/fifo"
if case_on losses-fifo-reader; then
( cat "$T/fifo" >"$T/fifo.out" ) &
reader=$!
if X "$T/s.bin" --steps 2 --quiet --losses "$T/fifo" >"$T/out" 2>&1 && wait $reader &&
	[ "$(grep -c '^[12] ' "$T/fifo.out")" = 2 ]; then
	ok "--losses into a FIFO with a reader: the reader gets the lines"
else
	fail "--losses into a FIFO with a reader"; head -n 3 "$T/out"; kill $reader 2>/dev/null
fi
fi

finish outputs
