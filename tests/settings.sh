#!/usr/bin/env bash
# tests/settings.sh - the settings of format/settings.def (issue 20), as the
# user meets them (tests/errors.sh runs it; the warnings of settings that do
# nothing are tests/warnings/*.dp, the DSL's "did you mean" tests/errors/):
#  - docs/DSL.md's settings table is `dpc --print-settings`, the rows printed;
#  - dpc --set sets a train or eval setting, a spec (train.optimizer=sgd(...))
#    or one of its arguments (train.optimizer.beta2, or train.lr when one spec
#    has it), a later --set wins, and a value is checked exactly as the file's
#    would be, the error naming the flag (status 1, nothing written);
#    dpc --precision is train.precision;
#  - dpexec's settings-backed flags: in --help, range-checked, overriding the
#    step file's value;
#  - the issue's bar: min_lr is named in at most 4 source files.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"

# ---- the docs table ----
if case_on "docs table"; then
sed -n '/^<!-- settings table: dpc --print-settings -->$/,/^<!-- end of settings table -->$/p' \
	docs/DSL.md | sed '1d;$d' >"$T/doc.md"
"$DPC" --print-settings >"$T/table.md"
if [ -s "$T/doc.md" ] && diff -u "$T/doc.md" "$T/table.md" >"$T/diff"; then
	ok "docs/DSL.md's settings table is dpc --print-settings ($(wc -l <"$T/table.md") lines)"
else
	fail "docs/DSL.md's settings table differs from dpc --print-settings (paste its output):"
	head -n 20 "$T/diff"
fi
# one line per DSL row and per kind: the table cannot lose a row unnoticed
nrows=$(grep -cE '^SET\([A-Z0-9_]+, (TRAIN|EVAL|ARG\()' format/settings.def)
nkinds=$(grep -c '^KIND(' format/settings.def)
[ "$(grep -c '^| train\|^| eval' "$T/table.md")" -eq $((nrows + nkinds)) ] &&
	ok "the table has a line for each of the $nrows DSL rows and $nkinds kinds" ||
	fail "the table has $(grep -c '^| train\|^| eval' "$T/table.md") lines, want $((nrows + nkinds))"
fi

# ---- dpc --set ----
M=models/mlp8.dp
ir() { "$DPC" "$M" --world-size 1 --emit=ir "$@" 2>"$T/err" | sed -n '1,8p'; }
# has DESCRIPTION WANT DPC-ARGS...: the IR's settings lines contain WANT
has() {
	local d=$1 want=$2; shift 2
	case_on "$d" || return 0
	if ir "$@" | grep -qF -- "$want"; then ok "$d"; else
		fail "$d: no '$want' in"; ir "$@" | sed 's/^/      /'; cat "$T/err"; fi
}
has "--set train.steps" "steps=7 " --set train.steps=7
has "a later --set wins" "steps=9 " --set train.steps=7 --set train.steps=9
has "the value is a DSL value (2 * 3)" "steps=6 " --set "train.steps=2 * 3"
has "--set eval.every" "eval_every=3 " --set eval.every=3
has "--set train.strategy" "strategy zero2 " --set train.strategy=zero2
has "train.lr is the optimizer's lr (the file's other arguments stay)" \
	"optimizer adamw lr=0.5 beta1=0.9 beta2=0.999" --set train.lr=0.5
has "train.optimizer.beta2 is added to the file's call" \
	"optimizer adamw lr=0.003 beta1=0.9 beta2=0.95 " --set train.optimizer.beta2=0.95
has "train.optimizer=sgd(...) replaces the spec" "optimizer sgd lr=0.1 beta1=0 beta2=0 eps=0 " \
	--set "train.optimizer=sgd(lr=0.1)"
has "... and an argument after it goes into the new call" "momentum=0.9 " \
	--set "train.optimizer=sgd(lr=0.1)" --set train.optimizer.momentum=0.9
has "train.schedule.steps is the schedule's, train.steps train's" \
	"schedule cosine warmup=100 steps=200 " --set train.schedule.steps=200 --set train.steps=50
has "the schedule's steps default to train's" "schedule cosine warmup=0 steps=300 " \
	--set "train.schedule=cosine" --set train.steps=300
if case_on "dpc --precision"; then
a=$(ir --precision bf16 | sed 1d)
b=$(ir --set train.precision=bf16 | sed 1d)
[ -n "$a" ] && [ "$a" = "$b" ] && echo "$a" | grep -q '^precision param_dtype=bf16' &&
	ok "dpc --precision bf16 is --set train.precision=bf16" ||
	fail "dpc --precision bf16 differs from --set train.precision=bf16"
fi

# rejects DESCRIPTION WANT DPC-ARGS...: status 1, WANT on stderr, no step file
rejects() {
	local d=$1 want=$2; shift 2
	case_on "$d" || return 0
	rm -f "$T/out.bin"
	"$DPC" "$M" --world-size 1 -o "$T/out.bin" "$@" >/dev/null 2>"$T/err"
	local rc=$?
	if [ $rc -eq 1 ] && grep -qF -- "$want" "$T/err" && [ ! -e "$T/out.bin" ] &&
		! grep -qE 'internal error|Sanitizer|runtime error:' "$T/err"; then
		ok "$d"
	else
		fail "$d (status $rc, want 1 and '$want')"; sed 's/^/      /' "$T/err" | head -n 5
	fi
}
rejects "a value out of range, naming the flag" "--set train.lr=-1: error: lr must be > 0" \
	--set train.lr=-1
rejects "an integer setting given a float, as in a file" \
	"--set train.steps=1e3: error: steps must be an integer" --set train.steps=1e3
rejects "a word setting given another word" \
	"--set train.reshard_after_forward=yes: error: reshard_after_forward must be true or false" \
	--set train.reshard_after_forward=yes
rejects "an unknown setting, with did you mean" \
	"--set train.stratgy=ddp: error: unknown train setting 'stratgy'; did you mean 'strategy'?" \
	--set train.stratgy=ddp
rejects "an unknown section, with did you mean" "unknown section 'trian'" --set trian.steps=1
rejects "an argument of another kind of the spec" \
	"--set train.optimizer.momentum=0.9: error: unknown argument 'momentum' for 'adamw' (it is sgd's)" \
	--set train.optimizer.momentum=0.9
rejects "an unknown argument, with did you mean" "unknown argument 'betaa2' of optimizer; did you mean 'beta2'?" \
	--set train.optimizer.betaa2=0.9
rejects "an unknown kind, with did you mean" "unknown optimizer 'adam' (optimizers: sgd, adamw); did you mean 'adamw'?" \
	--set train.optimizer=adam
rejects "a bound by another setting" "--set train.warmup=900: error: warmup (900) must not exceed steps (500)" \
	--set train.warmup=900
rejects "a value that does not parse" "--set train.lr=3e-4): error: expected a value" \
	--set "train.lr=3e-4)"
rejects "a word for a number, as in a file" "--set train.steps=many: error: steps must be an integer" \
	--set train.steps=many
rejects "an unknown constant in the value's arithmetic" "unknown constant 'nosuch'" \
	--set "train.steps=nosuch * 2"
rejects "a key without a value" "--set wants SECTION.NAME=VALUE" --set train.steps
rejects "dpc --precision's value is checked as train.precision" \
	"--precision fp8: error: precision must be f32, tf32, bf16 or fp16" --precision fp8

# ---- dpexec's settings-backed flags ----
if case_on "dpexec --help"; then
env $MPI_ASAN "$DPEXEC" --help >"$T/help" 2>&1
missing=""
for f in $(sed -n 's/.*FLAG(DPEXEC, "\([a-z-]*\)".*/\1/p' format/settings.def); do
	grep -q -- "^  --$f N" "$T/help" || missing="$missing --$f"
done
[ -z "$missing" ] && [ -n "$(sed -n 's/.*FLAG(DPEXEC, "\([a-z-]*\)".*/\1/p' format/settings.def)" ] &&
	ok "dpexec --help has every settings-backed flag" || fail "dpexec --help lacks$missing"
fi
stepfile() { "$DPC" "$M" --world-size 1 -o "$T/m.bin" 2>/dev/null || fail "dpc $M"; } # (the dpexec cases')
case_on "dpexec --keep-last" && once m stepfile &&
expect "dpexec --keep-last -1 is refused" "bad value '-1' for --keep-last" \
	env $MPI_ASAN "$DPEXEC" "$T/m.bin" --keep-last -1
case_on "dpexec --log-every" && once m stepfile &&
expect "dpexec --log-every 0 is refused (its floor is 1)" "bad value '0' for --log-every" \
	env $MPI_ASAN "$DPEXEC" "$T/m.bin" --log-every 0
if ! case_on "dpexec --eval-every"; then
	:
elif once m stepfile && mpi 1 "$T/m.bin" --steps 4 --eval-every 2 >"$T/run" 2>&1 &&
	[ "$(unstamp "$T/run" | grep -c '^eval step')" = 2 ]; then
	ok "dpexec --steps 4 --eval-every 2 overrides the step file's 500 and 100: two evals"
else
	fail "dpexec --eval-every"; tail -n 5 "$T/run"
fi

# ---- the bar: one definition per setting ----
if case_on "min_lr"; then
n=$(grep -rlw min_lr compiler ir passes runtime format | wc -l)
[ "$n" -le 4 ] && ok "min_lr is named in $n source files (the table, runtime/lr_sched.h: the lr of host and device)" ||
	fail "min_lr is named in $n source files: $(grep -rlw min_lr compiler ir passes runtime format | tr '\n' ' ')"
fi

finish settings
