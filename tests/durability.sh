#!/usr/bin/env bash
# tests/durability.sh - checkpoints that never lose or silently corrupt a run
# (issue 22; docs/CHECKPOINTS.md). Each part fails on the code before it:
#  1. publish: the same step saved again (a fresh run with --overwrite, a run
#     resumed from an older checkpoint) is killed (strace's fault injection,
#     SIGKILL) at every file syscall of the save that leaves a state on
#     disk of its own (one trial each; a kill at a call after which nothing
#     changed on disk before the next leaves the state the kill at that next
#     one does, and is not tried again), and at each rename with
#     RENAME_EXCHANGE refused (EINVAL: the two-rename fallback): the next run
#     (--auto-resume) always finds a complete checkpoint of at least the
#     step that was there before, ends with the uninterrupted run's
#     parameters bit for bit, and leaves no .dptmp. Skipped without strace.
#  2. --resume of a complete NAME.dptmp (and of a save directory whose
#     `latest` a killed save left dangling) loads it; the leftovers are
#     cleaned after the load, never before.
#  3. damaged checkpoints (tests/ckpt_damage.py: state.json fields, bit
#     flips, NaN/inf with and without recomputed checksums, cut files), full
#     and sharded: each resume is refused or trains exactly as the undamaged
#     one; the count of silent acceptances must be 0. Named state.json
#     cases give their message.
#  4. a fresh run into a save directory that holds checkpoints is refused;
#     --overwrite replaces them once it has saved; --auto-resume continues.
#  5. keep_last 1 needs room for two checkpoints: refused before training
#     on a tmpfs with room for 1.7 (root only).
#  6. a token id outside the vocabulary anywhere in a shard: refused at load.
#  7. ulimit -v 200 MB: a clean error, not a hang in MPI_Init.
#  8. --timeout: a job stopped (SIGSTOP of every rank) for longer and
#     continued goes on; one rank stopped: the error is printed once; a
#     save whose file fails on one rank only (fsync EIO) ends every rank
#     at once with that rank's error, not at --timeout, leaving nothing.
#  9. dpc out of memory: exit 1 with a message, not an abort.
# 10. tests/ckpt_fuzz.c, the checkpoint reader's in-process fuzz target, for
#     FUZZ_SECONDS (25; tests/lib.sh's fuzz_budget): no crash, no damaged copy loaded silently.
# 11. 1-rank runs started together: dpexec alone makes no Open MPI session
#     directory (isolated singletons all share one name).
# Trial counts are printed. TRIALS_SYSCALLS=0 skips part 1.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"
export OMPI_MCA_orte_execute_quiet=1

X() { env $MPI_ASAN timeout 120 "$DPEXEC" "$@"; }

# Cases (tests/lib.sh): each numbered part below is one or more; what
# several need (the wide model's step file, the uninterrupted run, the
# step-10 and step-20 save directories) is made by the first that does.
# wide: a wider tiny model: its files span several 1 MiB checksum blocks.
# Every run here starts one (a kill trial, a damaged copy's resume: ~300),
# and its start-up was mostly drawing the synthetic x (n x 256 normals) and
# the 256 x 1024 weight (normals: a log and a cos each): n is 2048 (the
# longest run, 20 steps of 64, still reads no sample twice) and the weight
# uniform with the normal's deviation, 0.17 ~ 0.1 sqrt(3) (a third less
# CPU per start; what is checked is the files, not how the model learns)
wide() {
variant tests/faults/tiny.dp "$T/wide.dp" 's/f32\[batch, 32\]/f32[batch, 256]/' \
	's/synthetic(n=4096, classes=8)/synthetic(n=2048, classes=8)/' \
	's/param w: f32\[32, 64\]  *init normal(0, 0.1)/param w: f32[256, 1024] init uniform(-0.17, 0.17)/' \
	's/param b: f32\[64\]  *init zeros/param b: f32[1024]     init zeros/' 's/param w: f32\[64, 8\]/param w: f32[1024, 8]/' \
	's/^  save_every 10/  save_every 5/'
[ "$(grep -c 'synthetic(n=2048, classes=8)' "$T/wide.dp")" = 2 ] &&
	grep -q 'param w: f32\[256, 1024\] init uniform' "$T/wide.dp" || fail "wide.dp: tiny.dp's lines moved"
"$DPC" "$T/wide.dp" --world-size 1 -o "$T/w1.bin" >"$T/dpc.out" 2>&1 || { cat "$T/dpc.out"; fail "dpc wide.dp"; }
}
reference() { # the uninterrupted run (ref.st, ref.loss)
once wide wide
X "$T/w1.bin" --quiet --steps 20 --save-dir "$T/refck" --save-full "$T/ref.st" --losses "$T/ref.loss" >"$T/ref.out" 2>&1 ||
	{ cat "$T/ref.out"; fail "the reference run"; }
}
b10() { once wide wide; X "$T/w1.bin" --quiet --steps 10 --save-dir "$T/b10" >/dev/null 2>&1 || fail "the step-10 run"; }
b20() { once wide wide; X "$T/w1.bin" --quiet --steps 20 --save-dir "$T/b20" --save-form sharded >/dev/null 2>&1 || fail "the step-20 run"; }

# ---- 1. a kill at every syscall of a save ----
# ends NAME DIR MIN: after a killed save in DIR, --auto-resume to step 20
# resumes from a checkpoint of at least step MIN, ends with the reference's
# parameters, and leaves nothing .dptmp
ends() {
	X "$T/w1.bin" --quiet --steps 20 --save-dir "$2" --auto-resume --save-full "$T/$1.st" >"$T/$1.res" 2>&1 || return 1
	local from
	from=$(unstamp "$T/$1.res" | sed -n 's/^resumed from .*: step \([0-9]*\),.*/\1/p')
	[ -n "$from" ] && [ "$from" -ge "$3" ] && cmp -s "$T/$1.st" "$T/ref.st" && ! ls "$2" | grep -q dptmp
}
SYSCALLS="mkdir openat fsync rename renameat2 unlink rmdir"
# the calls that change what is on disk (traced in the first run only, to
# tell which kills leave the same state); a failed one changes nothing
CHANGES="write pwrite64 writev pwritev pwritev2 ftruncate fallocate truncate mkdirat unlinkat renameat symlink symlinkat link linkat copy_file_range sendfile mmap open creat"
# trials NAME BASE MIN EXTRA ONLY -- DPEXEC_ARGS...: the save of the dpexec
# command into a copy of BASE (a save directory), killed at each of its
# syscalls in turn (those matching ONLY when given), each trial on a fresh
# copy of its own, then ends(). A save's syscalls: every one from the first
# that touches a step-N.dptmp of the directory on, except opens that create
# nothing (of directories, to fsync or list them); strace numbers the calls
# of each syscall apart, and so does the trial. A kill at call j leaves what
# the calls before j did; when neither j nor any call between it and the
# next kill point k changed anything on disk (an fsync, an unlink of
# nothing: CHANGES and the SYSCALLS but fsync, when they succeed; a write to
# anything, an mmap MAP_SHARED for writing, an open that may create or
# truncate), the kills at j and k leave the same files with the same bytes,
# and the next run sees the same input: only k, the last of such a run of
# kill points, is tried (measured on the fresh run's 34 points: the 19 it
# keeps leave 18 different directories, the 15 left out each one of them).
# @D in DPEXEC_ARGS is the trial's save directory. The trials are
# independent and mostly process start-up and waiting: TRIAL_JOBS (4) run
# at a time.
trials() {
	local name=$1 base=$2 min=$3 extra=$4 only=$5; shift 6
	local d=$T/tr-$name sc k good=0 total=0 bad="" j=0 points
	rm -rf "$d"; cp -a "$base" "$d"
	strace -o "$T/$name.trace" -e trace="${SYSCALLS// /,},${CHANGES// /,}" $extra "$DPEXEC" "${@//@D/$d}" \
		--save-dir "$d" >/dev/null 2>&1
	awk -v d="$d/step-" -v only="$only" -v kinds="$SYSCALLS" -v out="$T/$name.calls" '
	BEGIN { split(kinds, a, " "); for (i in a) point[a[i]] = 1 }
	/^[a-z0-9_]+\(/ {
		sc = $0; sub(/\(.*/, "", sc); n[sc]++
		if (!on && index($0, d) && index($0, ".dptmp")) on = 1
		if (!on) next
		if ((sc in point) && !(sc == "openat" && !index($0, "O_CREAT")) && (only == "" || sc ~ only) &&
		    !index($0, "(INJECTED)")) {
			all++
			if (have && changed) print prev >out
			prev = sc " " n[sc]; have = 1; changed = 0
		}
		if ($0 ~ /= -1 E[A-Z]+/ || sc == "fsync") next
		if (sc ~ /^open/) { if ($0 ~ /O_CREAT|O_TRUNC/) changed = 1 }
		else if (sc == "mmap") { if ($0 ~ /MAP_SHARED/ && $0 ~ /PROT_WRITE/) changed = 1 }
		else changed = 1
	}
	END { if (have) print prev >out; print all + 0 }' "$T/$name.trace" >"$T/$name.points"
	touch "$T/$name.calls"
	points=$(cat "$T/$name.points")
	while read -r sc k; do
		(local t=$d-$sc-$k
		cp -a "$base" "$t"
		(strace -o /dev/null -e trace="$sc${extra:+,renameat2}" -e inject="$sc":signal=SIGKILL:when="$k" $extra \
			"$DPEXEC" "${@//@D/$t}" --save-dir "$t" >/dev/null 2>&1 </dev/null; true) 2>/dev/null
		ends "$name-$sc-$k" "$t" "$min" && touch "$t.good"
		rm -rf "$t") &
		j=$((j + 1))
		[ $((j % ${TRIAL_JOBS:-4})) = 0 ] && wait
	done <"$T/$name.calls"
	wait
	while read -r sc k; do
		total=$((total + 1))
		if [ -e "$d-$sc-$k.good" ]; then good=$((good + 1)); else bad="$bad $sc#$k"; fi
	done <"$T/$name.calls"
	echo "  $name: $total trials (SIGKILL at each ${only:-mkdir/open(O_CREAT)/fsync/rename/renameat2/unlink/rmdir} of the save that leaves a state of its own: $points calls, $((points - total)) leaving the next one's; $(cut -d' ' -f1 "$T/$name.calls" | sort | uniq -c | awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $2, $1}')), $good lost nothing${bad:+; lost or failed at:$bad}"
	[ "$total" -gt 0 ] && [ "$good" = "$total" ]
}
if [ "${TRIALS_SYSCALLS:-1}" = 0 ]; then
	case_on syscall-kills &&
	skip "kills at every syscall of a save (TRIALS_SYSCALLS=0)"
elif ! command -v strace >/dev/null || ! strace -o /dev/null true 2>/dev/null; then
	case_on syscall-kills &&
	skip "kills at every syscall of a save: strace is missing or cannot trace here (make deps installs it)"
else
	case_on "syscall-kills over" && once ref reference && once b10 b10 &&
	check "a fresh run with --overwrite killed while saving step 10 again (full form)" \
		trials over "$T/b10" 10 "" "" -- "$T/w1.bin" --quiet --steps 10 --save-every 0 --overwrite
	case_on "syscall-kills older" && once ref reference && once b20 b20 &&
	check "a run resumed from step 15 killed while saving step 20 again (sharded form)" \
		trials older "$T/b20" 20 "" "" -- "$T/w1.bin" --quiet --steps 20 --resume @D/step-000015 --save-form sharded
	case_on "syscall-kills norx" && once ref reference && once b10 b10 &&
	check "the renames without RENAME_EXCHANGE (the file system refuses it: two renames)" \
		trials norx "$T/b10" 10 "-e inject=renameat2:error=EINVAL" "^rename$" -- "$T/w1.bin" --quiet --steps 10 --save-every 0 --overwrite
fi

# ---- 2. --resume of a .dptmp copy; cleaning after the load ----
expect_ok() { # expect_ok NAME CMD...: exit 0
	local name=$1; shift
	if "$@" >"$T/out" 2>&1; then ok "$name"; else fail "$name (exit $?)"; sed 's/^/      /' "$T/out" | tail -n 4; fi
}
if case_on resume-dptmp; then
once ref reference; once b10 b10
cp -a "$T/b10" "$T/r2"
mv "$T/r2/step-000010" "$T/r2/step-000010.old.dptmp"
expect_ok "--resume DIR/step-N.old.dptmp (a copy a killed save left) loads it" \
	X "$T/w1.bin" --quiet --steps 20 --resume "$T/r2/step-000010.old.dptmp" --save-full "$T/r2.st"
check "and trains to the reference" cmp -s "$T/r2.st" "$T/ref.st"
check "its leftovers are cleaned after the load" sh -c "! ls '$T/r2' | grep -q dptmp"
fi
if case_on resume-dangling; then
once ref reference; once b10 b10
cp -a "$T/b10" "$T/r3"
mv "$T/r3/step-000010" "$T/r3/step-000010.dptmp" # latest names a missing step-000010
expect_ok "--resume DIR whose latest a killed save left dangling loads the complete copy" \
	X "$T/w1.bin" --quiet --steps 20 --resume "$T/r3" --save-full "$T/r3.st"
grep -q "which a killed save left as step-000010.dptmp" "$T/out" || fail "no note on the dangling latest"
check "and trains to the reference; the copy took its name again" \
	sh -c "cmp -s '$T/r3.st' '$T/ref.st' && [ -d '$T/r3/step-000020' ] && ! ls '$T/r3' | grep -q dptmp"
fi

# ---- 3. damaged checkpoints ----
# damage FORM NP NRANDOM [lite]: the step-10 checkpoint of FORM written at
# NP ranks, damaged every way (tests/ckpt_damage.py, NRANDOM random bit
# flips); each resume to step 15 refused or equal to the undamaged one
damage() {
	local form=$1 np=$2 nrand=$3 lite=${4:-} d=$T/dmg-$1 bin=$T/w1.bin
	once wide wide
	if [ "$np" != 1 ]; then
		"$DPC" "$T/wide.dp" --world-size "$np" -o "$T/w$np.bin" >/dev/null 2>&1 || fail "dpc wide.dp at $np"
		bin=$T/w$np.bin
	fi
	mpi "$np" "$bin" --quiet --steps 10 --save-dir "$d" --save-form "$form" >/dev/null 2>&1 ||
		{ fail "$form checkpoint"; return; }
	mpi "$np" "$bin" --quiet --steps 15 --resume "$d/step-000010" --losses "$T/good-$form.loss" \
		--save-dir "$T/sink-$form" >/dev/null 2>&1 || { fail "undamaged resume"; return; }
	local n refused=0 same=0 silent=0 list="" k=0 r=$T/dmg-$form-res
	n=$($PY tests/ckpt_damage.py "$d/step-000010" "$T/dmg-$form-copies" "$nrand" 22 $lite) || { fail "ckpt_damage.py"; return; }
	mkdir -p "$r"
	# each resume in a directory of its own, DMG_JOBS (4) at a time: they are
	# independent, and mostly MPI start-up and waiting
	while IFS=$'\t' read -r name desc; do
		(mpi "$np" "$bin" --quiet --steps 15 --resume "$T/dmg-$form-copies/$name" \
			--losses "$r/$name.loss" --save-dir "$r/$name.sink" >"$r/$name.out" 2>&1 </dev/null
		echo $? >"$r/$name.rc"; rm -rf "$r/$name.sink") &
		k=$((k + 1))
		[ $((k % ${DMG_JOBS:-4})) = 0 ] && wait
	done <"$T/dmg-$form-copies/list.txt"
	wait
	while IFS=$'\t' read -r name desc; do
		rc=$(cat "$r/$name.rc" 2>/dev/null || echo none)
		if [ "$rc" = 1 ] && grep -q "dpexec: error: " "$r/$name.out"; then
			refused=$((refused + 1))
		elif [ "$rc" = 0 ] && cmp -s "$r/$name.loss" "$T/good-$form.loss"; then
			same=$((same + 1))
		else
			silent=$((silent + 1)); list="$list\n      $name ($desc): exit $rc$(grep -m1 error "$r/$name.out" | sed 's/^/: /')"
		fi
		echo "$name	$rc	$(grep -m1 "error" "$r/$name.out")" >>"$T/dmg-$form.log"
	done <"$T/dmg-$form-copies/list.txt"
	echo "  $form form, $np rank(s): $n damaged checkpoints: $refused refused, $same trained as the undamaged one, $silent trained differently or failed otherwise"
	[ -n "$list" ] && printf "%b\n" "$list" | head -n 20
	check "$form: none of $n damaged checkpoints resumes silently wrong" [ "$silent" = 0 ]
}
# The random bit flips (DAMAGE_RANDOM, 32): what they add to the named
# damages is positions, and a flip anywhere in a file's data takes the one
# path a named damage (zeros-, lowbit-) takes, the block checksum's; their
# worth is the plain variant's (none of them silently accepted, wherever it
# lands). Under SAN=1, whose worth is the memory errors of the paths, the
# first 4 of the same sequence (ckpt_damage.py's seeded draws) run.
NRANDOM=${DAMAGE_RANDOM:-$([ "${SAN:-0}" = 1 ] && echo 4 || echo 32)}
case_on "damage full" && once damage-full damage full 1 "$NRANDOM"
case_on "damage sharded" && damage sharded 2 "$(( ${DAMAGE_RANDOM:-30} / 3 ))" lite
# a few of them by name: the message says what is wrong
msg() { # msg NAME-SUBSTRING WANT
	local line
	case_on "damage message ${1%$'\t'}" || return 0
	once damage-full damage full 1 "$NRANDOM"
	line=$(grep -F -- "$1" "$T/dmg-full.log" | head -n 1)
	if echo "$line" | grep -qF -- "$2"; then ok "damaged $1: '$2'"; else fail "damaged $1: wanted '$2', got: $line"; fi
}
msg "-state-step=1e+300	" "\"step\": 1e+300, not a whole number"
msg "-state-step=-5	" "\"step\": -5, not a whole number"
msg "-state-step=_10_	" "\"step\": the string \"10\""
msg "lowbit-optimizer" "optimizer.safetensors is damaged: bytes ["
msg "nan-fixed-optimizer" "holds NaN at element"
msg "state-samples_seen" "\"samples_seen\""
msg "state-written_by-world_size" "multiplying to its world size 2"

# ---- 4. a fresh run into a directory that holds checkpoints ----
if case_on "fresh-run-into-checkpoints"; then
once ref reference; once b10 b10
cp -a "$T/b10" "$T/f4"
expect "a fresh run into a save directory with checkpoints is refused before training" \
	"the save directory $T/f4 holds checkpoints (the newest: step-000010) and this run does not resume" \
	X "$T/w1.bin" --steps 20 --save-dir "$T/f4"
unstamp "$T/out" | grep -q "^step 1/" && fail "it trained before refusing"
check "they are untouched" cmp -s "$T/f4/step-000010/state.json" "$T/b10/step-000010/state.json"
expect_ok "--overwrite starts anew" X "$T/w1.bin" --quiet --steps 7 --save-every 3 --save-dir "$T/f4" --overwrite
check "--overwrite: the old run's checkpoints are gone once this run saved" \
	[ "$(ls "$T/f4" | tr '\n' ' ')" = "latest step-000003 step-000006 step-000007 " ]
expect_ok "--auto-resume continues from the newest" X "$T/w1.bin" --quiet --steps 20 --save-dir "$T/f4" --auto-resume --save-full "$T/f4.st"
check "--auto-resume: from step 7 to the reference" sh -c "grep -q 'resumed from $T/f4/step-000007' '$T/out' && cmp -s '$T/f4.st' '$T/ref.st'"
fi
if case_on auto-resume-fresh; then
once ref reference
expect_ok "--auto-resume with no checkpoint starts fresh" X "$T/w1.bin" --quiet --steps 20 --save-dir "$T/f5" --auto-resume --save-full "$T/f5.st"
check "--auto-resume, fresh: the reference" cmp -s "$T/f5.st" "$T/ref.st"
fi

# ---- 5. keep_last needs room for keep_last + 1 checkpoints ----
if case_on keep_last-room; then
once b10 b10
one=$(du -sb "$T/b10/step-000010" | cut -f1)
mkdir "$T/small"
if mount -t tmpfs -o size=$((one * 17 / 10 / 4096 * 4096 + 4096)) tmpfs "$T/small" 2>/dev/null; then
	expect "keep_last 1 on a disk with room for 1.7 checkpoints: refused before training" \
		"(keep_last 1: a checkpoint is written before the oldest is removed)" \
		X "$T/w1.bin" --steps 20 --save-every 5 --keep-last 1 --save-dir "$T/small"
	unstamp "$T/out" | grep -q "^step 1/" && fail "it trained before finding the save directory too small"
	expect_ok "keep_last 1 with a single save (--save-every 0) fits" \
		X "$T/w1.bin" --quiet --steps 20 --save-every 0 --keep-last 1 --save-dir "$T/small"
	umount "$T/small"
else
	skip "mounting a small tmpfs is not permitted here (not root?): keep_last room"
fi
fi

# ---- 6. a token id outside the vocabulary, anywhere in a shard ----
if case_on token-out-of-vocab; then
gpt_text "$T/gpt.dp"
"$DPC" "$T/gpt.dp" --world-size 1 -o "$T/gpt.bin" >/dev/null 2>&1 || fail "dpc gpt"
$PY - "$T/text.bin" <<'EOF'
import struct, sys
f = open(sys.argv[1], "r+b")
n = struct.unpack("<i", f.read(12)[8:12])[0]
f.seek(1024 + 2 * (n - 7))  # near the end: a window a short run never draws
f.write(struct.pack("<H", 300))
EOF
expect "a token id >= the vocabulary near a shard's end: refused at load" \
	"token shard $T/text.bin: token 300 at index" X "$T/gpt.bin" --steps 1 --eval-every 0
unstamp "$T/out" | grep -q "^step 1/" && fail "it trained before finding the bad token"
fi

# ---- 7. a small address-space limit ----
if ! case_on ulimit-v; then
	:
elif ! "$DPC" models/mlp.dp --world-size 1 -o "$T/mlp.bin" >/dev/null 2>&1 && fail "dpc mlp"; then
	:
elif [ "${SAN:-0}" = 1 ]; then
	skip "ulimit -v under ASan (its shadow memory needs terabytes of address space)"
else
	(ulimit -v 200000; timeout 60 "$DPEXEC" "$T/mlp.bin" --steps 1 >"$T/ulimit.out" 2>&1; echo "rc=$?" >>"$T/ulimit.out")
	if grep -q "^rc=1$" "$T/ulimit.out" && grep -q "dpexec: error: .*out of memory" "$T/ulimit.out"; then
		ok "ulimit -v 200 MB: a clean out-of-memory error ($(grep -m1 error "$T/ulimit.out" | cut -c1-80)...)"
	else
		fail "ulimit -v 200 MB"; tail -n 3 "$T/ulimit.out"
	fi
fi

# ---- 8. the --timeout error, once ----
mlp2() { "$DPC" models/mlp.dp --world-size 2 -o "$T/mlp2.bin" >/dev/null 2>&1 || fail "dpc mlp at 2"; }
ranks() { ps -eo pid=,args= | while read -r pid args; do
	case "$args" in "$DPEXEC $T/mlp2.bin"*) echo "$pid" ;; esac; done; }
# the whole job stopped for longer than --timeout (Slurm's scontrol suspend,
# a debugger) and continued: no rank counts the stop as waiting
if case_on timeout-job-stopped; then
once mlp2 mlp2
( env $MPI_ASAN timeout 120 mpirun --oversubscribe -np 2 "$DPEXEC" "$T/mlp2.bin" --steps 120 --timeout 3 \
	--log-every 100000 --eval-every 0 >"$T/sus.out" 2>&1; echo "rc=$?" >>"$T/sus.out" ) &
job=$!
for i in $(seq 150); do unstamp "$T/sus.out" | grep -q "^step 1/" && break; sleep 0.2; done
sleep 0.5
pids=$(ranks)
kill -STOP $pids 2>/dev/null; sleep 5; kill -CONT $pids 2>/dev/null
wait $job
if grep -q "^rc=0$" "$T/sus.out" && ! grep -q "did not complete" "$T/sus.out"; then
	ok "the job stopped for 5 s under --timeout 3 and continued: it goes on to the end"
else
	fail "a job stopped and continued under --timeout"; tail -n 3 "$T/sus.out"
fi
fi
# one rank stopped: the other times out and ends the job; the launcher
# continues the stopped one to signal it, and it does not time out again
if case_on timeout-once; then
once mlp2 mlp2
( env $MPI_ASAN timeout 120 mpirun --oversubscribe -np 2 "$DPEXEC" "$T/mlp2.bin" --steps 100000 --timeout 3 \
	--log-every 100000 --eval-every 0 >"$T/to.out" 2>&1 ) &
job=$!
for i in $(seq 150); do unstamp "$T/to.out" | grep -q "^step 1/" && break; sleep 0.2; done
victim=$(ranks | tail -n 1)
[ -n "$victim" ] && kill -STOP "$victim"
wait $job
[ -n "$victim" ] && kill -CONT "$victim" 2>/dev/null
n=$(grep -c "did not complete within 3 s" "$T/to.out")
if [ -n "$victim" ] && [ "$n" = 1 ]; then
	ok "--timeout at 2 ranks, one stopped: the error is printed once"
else
	fail "--timeout message printed $n times (victim '${victim:-none}')"; tail -n 4 "$T/to.out"
fi
fi

# one rank's checkpoint file fails (fsync EIO under strace, that rank
# only): every rank stops at once with that rank's error, not after
# --timeout in the file records' gather, and no checkpoint is left
if case_on save-fails-one-rank; then
once mlp2 mlp2
if ! command -v strace >/dev/null || ! strace -o /dev/null true 2>/dev/null; then
	skip "a save failing on one rank: strace is missing or cannot trace here"
else
	rm -rf "$T/one"
	SECONDS=0
	env $MPI_ASAN timeout 120 mpirun --oversubscribe -np 1 "$DPEXEC" "$T/mlp2.bin" --quiet --steps 2 \
		--save-dir "$T/one" --save-form sharded --timeout 30 : -np 1 strace -f -o /dev/null \
		-e trace=fsync,fdatasync -e inject=fsync,fdatasync:error=EIO "$DPEXEC" "$T/mlp2.bin" \
		--quiet --steps 2 --save-dir "$T/one" --save-form sharded --timeout 30 >"$T/one.out" 2>&1
	rc=$? took=$SECONDS
	if [ "$rc" = 1 ] && [ "$took" -lt 20 ] && unstamp "$T/one.out" |
		grep -q "error: cannot write .*shard-00001-of-00002.safetensors: Input/output error" &&
		[ -z "$(ls -A "$T/one" 2>/dev/null)" ]; then
		ok "a save failing on rank 1 alone: exit 1 in ${took} s naming its file, nothing left"
	else
		fail "a save failing on one rank (exit $rc after ${took} s; --timeout 30)"; tail -n 4 "$T/one.out"
	fi
fi
fi

# ---- 9. dpc out of memory ----
if ! case_on dpc-oom; then
	:
elif [ "${SAN:-0}" = 1 ]; then
	skip "dpc under ulimit -v (ASan)"
else
	# limits from too small to load libc (exit 127, the loader's) to enough:
	# somewhere between, the compiler's own allocations fail
	oom=0; bad=""
	for v in $(seq 3000 250 9000); do
		(ulimit -v "$v"; "$DPC" models/gpt2.dp --world-size 1 -o "$T/g.bin" >"$T/oom.out" 2>&1; echo "rc=$?" >>"$T/oom.out")
		grep -q "^dpc: error: out of memory" "$T/oom.out" && grep -q "^rc=1$" "$T/oom.out" && oom=$((oom + 1))
		grep -q "internal error\|^rc=134$" "$T/oom.out" && bad="$bad $v"
	done
	if [ $oom -gt 0 ] && [ -z "$bad" ]; then
		ok "dpc out of memory: exit 1 with a message ($oom of the limits 3000..9000 KB hit it), never an abort"
	else
		fail "dpc out of memory: $oom clean, aborts at ulimit -v$bad"; tail -n 3 "$T/oom.out"
	fi
fi

# ---- 10. the checkpoint reader's fuzz target, for a bounded time ----
if ! case_on ckpt_fuzz; then
	:
elif ! "$DPC" tests/faults/tiny.dp --world-size 1 -o "$T/tiny1.bin" >/dev/null 2>&1 && fail "dpc tiny"; then
	:
elif [ -x "$ROOT/$BUILD/tests/ckpt_fuzz" ]; then
	if (cd "$T" && env $MPI_ASAN TMPDIR="$T" timeout 120 "$ROOT/$BUILD/tests/ckpt_fuzz" "$T/tiny1.bin" \
		"${FUZZ_SECONDS:-$(fuzz_budget 25)}" 22) >"$T/fuzz.out" 2>&1; then
		ok "$(tail -n 1 "$T/fuzz.out")"
	else
		fail "ckpt_fuzz"; tail -n 12 "$T/fuzz.out"
	fi
else
	fail "$BUILD/tests/ckpt_fuzz is not built (make tests)"
fi

# ---- 11. 1-rank runs started together on one host ----
# Open MPI names every isolated singleton job [0,1]: each would create and
# remove the same session directory, $TMPDIR/ompi.HOST.UID/jf.0/1, and two
# started together failed MPI_Init (1 in ~100 starts at six at a time: the
# `syscall-kills` trials' lost runs). dpexec alone makes no session
# directory. Shown without a race: a file where jf.0 would go fails every
# start that makes one.
if case_on concurrent-singletons; then
	once tiny1 "$DPC" tests/faults/tiny.dp --world-size 1 -o "$T/tiny1.bin"
	rm -rf "$T/sd"; mkdir -p "$T/sd/ompi.$(hostname | cut -d. -f1).$(id -u)"
	touch "$T/sd/ompi.$(hostname | cut -d. -f1).$(id -u)/jf.0"
	# (Open MPI would look in tests/run.sh's OMPI_MCA_orte_tmpdir_base, not $TMPDIR)
	if (unset OMPI_MCA_orte_tmpdir_base; TMPDIR=$T/sd X "$T/tiny1.bin" --quiet --steps 1 --no-eval \
		--save-every 0) >"$T/sd.out" 2>&1; then
		ok "a 1-rank dpexec makes no Open MPI session directory (several on a host cannot collide)"
	else
		fail "a 1-rank dpexec with \$TMPDIR/ompi.*/jf.0 taken"; tail -n 3 "$T/sd.out"
	fi
fi

finish durability
