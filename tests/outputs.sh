#!/usr/bin/env bash
# tests/outputs.sh - every output path is safe (util/outfile.h): dpc -o and
# dpexec --save-full onto a character device made with mknod (it stays a
# device) and onto a symbolic link (the link stays, its target is written);
# directories, missing directories, FIFOs without a reader and full disks
# (/dev/full) are errors with a message and a non-zero exit; a stale temp
# file of a killed write is removed by the next write to the same path.
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
		grep -q "^step 1/" "$T/out" && fail "it trained before finding the save directory too small"
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

finish outputs
