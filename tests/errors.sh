#!/usr/bin/env bash
# tests/errors.sh - the front end's error tests and fuzz run.
#
# Every tests/errors/*.dp is a malformed model. Its leading comments say what
# dpc must report:
#   # expect: 7:12: error: unknown identifier 'h9'   (LINE:COL: error: SUBSTRING)
#   # args: --world-size 3                            (extra dpc arguments)
#   # world-sizes: 1 2 3       (compile once per --world-size; `mesh auto`)
#   # errors: 1                (exactly this many errors: one message per mistake)
# For each file dpc must exit with status 1, print every expected message as
# FILE:LINE:COL: error: ...SUBSTRING... on stderr, quote a source line with a
# caret, write no output file, and print nothing that looks like a crash
# (internal error, sanitizer report).
#
# Every tests/batch_ok/*.dp must compile at world sizes 1, 2 and 3.
#
# Every tests/warnings/*.dp compiles (status 0, the step file written) with
# exactly the warnings its leading comments list (settings that have no
# effect, compiler/settings.c), none other:
#   # warn: 23:3: warning: bucket_mb 10 has no effect     (LINE:COL: warning: SUBSTRING)
#   # warn: --set train.x=1: warning: ...                  (a flag's: no position)
#   # warn: none                                           (no warning at all)
# Then tests/settings.sh (--set, dpc --print-settings against docs/DSL.md,
# the settings-backed flags) runs as one check.
#
# Then $BUILD/tests/fe_fuzz (tests/fe_fuzz.c, built by `make tests`, with the
# sanitizers when SAN=1) runs over 2000 mutants of models/mlp.dp and of each
# valid model in tests/errors/seeds/ (the transformer syntax; models on the
# files of tests/errors/data/, for the data-file checks).
#
# Data files dpc cannot see are warnings and the model compiles; files it
# can see and that hold what is declared give no message (the wrong ones
# are tests/errors/data_*.dp, their files in tests/errors/data/).
#
# Bad command-line options of dpc and dpexec get one line each, in their
# words, with "did you mean" for a misspelt long option.
#
# Environment: BUILD (build or build-san), DPC (default $BUILD/dpc), DPEXEC
# (default $BUILD/dpexec), SAN=1, FUZZ_N (mutants, default 2000; tests/lib.sh's fuzz_budget).
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SAN=${SAN:-0}
BUILD=${BUILD:-build}
[ "$SAN" = 1 ] && [ "$BUILD" = build ] && BUILD=build-san
DPC=${DPC:-$BUILD/dpc}
. tests/lib.sh # case_on, repro_lines, fuzz_budget (this suite keeps its own counters)
FUZZ_N=${FUZZ_N:-$(fuzz_budget 2000)}

pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

bad() {
	echo "FAIL $1: $2"
	repro_lines
	fail=$((fail + 1))
}

crashed() {
	grep -qE 'internal error|Sanitizer|runtime error:|Segmentation|core dumped' "$1"
}

if [ ! -x "$DPC" ]; then
	echo "errors: $DPC not built (run make first)"
	exit 1
fi

# settle WHAT OK: count a check of $tmp/stderr (a crash there fails it), and
# show that stderr when it failed
settle() {
	local what=$1 ok=$2
	if crashed "$tmp/stderr"; then
		bad "$what" "crash or sanitizer report"
		ok=0
	fi
	if [ "$ok" = 1 ]; then
		pass=$((pass + 1))
	else
		sed 's/^/    | /' "$tmp/stderr" | head -30
	fi
}

# check_file FILE [WORLD]: compile FILE (with --world-size WORLD when given)
# and check its expectations.
check_file() {
	local f=$1 ws=${2:-} what=$1 args
	[ -n "$ws" ] && what="$f (world size $ws)"
	case_on "errors/$(basename "$f" .dp)${ws:+ ws=$ws}" || return 0
	args=$(sed -n 's/^# args: //p' "$f" | tr '\n' ' ')
	[ -n "$ws" ] && args="$args --world-size $ws"
	REPRO=$(echo "$DPC $f $args -o /tmp/out.bin" | tr -s ' ')
	rm -f "$tmp/out.bin"
	# shellcheck disable=SC2086
	"$DPC" "$f" $args -o "$tmp/out.bin" >"$tmp/stdout" 2>"$tmp/stderr"
	rc=$?
	ok=1
	if [ $rc -ne 1 ]; then
		bad "$what" "exit status $rc, want 1"
		ok=0
	fi
	nexp=0
	while IFS= read -r exp; do
		nexp=$((nexp + 1))
		pos=${exp%%: error: *}    # LINE:COL
		msg=${exp#*: error: }     # message substring
		if ! grep -F -- "$f:$pos: error: " "$tmp/stderr" | grep -qF -- "$msg"; then
			bad "$what" "missing '$f:$pos: error: ...$msg...'"
			ok=0
		fi
	done < <(sed -n 's/^# expect: //p' "$f")
	if [ $nexp -eq 0 ]; then
		bad "$what" "no '# expect:' line"
		ok=0
	fi
	nwant=$(sed -n 's/^# errors: //p' "$f")
	if [ -n "$nwant" ]; then
		ngot=$(grep -cE -- "^$f:[0-9]+:[0-9]+: error: " "$tmp/stderr")
		if [ "$ngot" -ne "$nwant" ]; then
			bad "$what" "$ngot errors, want $nwant"
			ok=0
		fi
	fi
	if ! grep -qE '^[[:space:]]*\^[[:space:]]*$' "$tmp/stderr"; then
		bad "$what" "no caret line on stderr"
		ok=0
	fi
	if [ -e "$tmp/out.bin" ]; then
		bad "$what" "an output file was written"
		ok=0
	fi
	settle "$what" $ok
}

# A file with `# world-sizes: 1 2 3` is compiled once per world size (its
# mesh is `mesh auto`) and must fail the same way at each.
for f in tests/errors/*.dp; do
	sizes=$(sed -n 's/^# world-sizes: //p' "$f")
	if [ -z "$sizes" ]; then
		check_file "$f"
	else
		for ws in $sizes; do
			check_file "$f" "$ws"
		done
	fi
done

# Programs that are per-sample correct compile at every world size (the batch
# rules must not refuse a bias add or a position embedding).
for f in tests/batch_ok/*.dp; do
	for ws in 1 2 3; do
		case_on "batch_ok/$(basename "$f" .dp) ws=$ws" || continue
		if "$DPC" "$f" --world-size "$ws" -o "$tmp/ok.bin" >/dev/null 2>"$tmp/stderr" &&
			[ -s "$tmp/ok.bin" ]; then
			pass=$((pass + 1))
		else
			bad "$f (world size $ws)" "does not compile: $(head -c 400 "$tmp/stderr")"
		fi
		rm -f "$tmp/ok.bin"
	done
done

# Settings that do nothing: warnings, never errors.
for f in tests/warnings/*.dp; do
	case_on "warnings/$(basename "$f" .dp)" || continue
	args=$(sed -n 's/^# args: //p' "$f" | tr '\n' ' ')
	rm -f "$tmp/warn.bin"
	# shellcheck disable=SC2086
	"$DPC" "$f" $args -o "$tmp/warn.bin" >"$tmp/stdout" 2>"$tmp/stderr"
	rc=$?
	ok=1
	[ $rc -eq 0 ] || { bad "$f" "exit status $rc, want 0 (warnings are not errors)"; ok=0; }
	[ -s "$tmp/warn.bin" ] || { bad "$f" "no step file written"; ok=0; }
	nexp=0
	while IFS= read -r exp; do
		[ "$exp" = none ] && continue
		nexp=$((nexp + 1))
		pos=${exp%%: warning: *}
		msg=${exp#*: warning: }
		[[ $pos =~ ^[0-9]+:[0-9]+$ ]] && pos="$f:$pos"
		if ! grep -F -- "$pos: warning: " "$tmp/stderr" | grep -qF -- "$msg"; then
			bad "$f" "missing '$pos: warning: ...$msg...'"
			ok=0
		fi
	done < <(sed -n 's/^# warn: //p' "$f")
	nwarn=$(grep -c ': warning: ' "$tmp/stderr")
	if [ "$nwarn" -ne $nexp ]; then
		bad "$f" "$nwarn warnings, want $nexp"
		ok=0
	fi
	settle "$f" $ok
done

# The models compile without a warning: every setting they give does something.
# Their token shards (relative paths, resolved against the working directory)
# exist under $tmp/run, so dpc checks them instead of warning that it cannot.
shards() {
	mkdir -p "$tmp/run/build/data"
	for s in fortunes fortunes_val train val; do
		"$ROOT/$BUILD/text2shard" -o "$tmp/run/build/data/$s.bin" /usr/share/common-licenses/GPL-3 \
			>/dev/null 2>&1 || bad "text2shard" "cannot write the models' token shards"
	done
}
for f in models/*.dp; do
	case_on "$f" || continue
	once shards shards
	ws=1; grep -q '^mesh auto' "$f" && ws=2
	if (cd "$tmp/run" && "$(cd "$ROOT" && realpath "$DPC")" "$ROOT/$f" --world-size "$ws" --emit=ir -o "$tmp/m.bin") \
		>/dev/null 2>"$tmp/stderr" &&
		! grep -q 'warning:' "$tmp/stderr"; then
		pass=$((pass + 1))
	else
		bad "$f" "does not compile quietly: $(head -c 400 "$tmp/stderr")"
	fi
done

# --set, dpc --print-settings against docs/DSL.md, the settings-backed flags
# (a case of this suite: all of it or none; SUITE=settings CASE=... picks its cases)
if ! case_on settings; then
	:
elif BUILD=$BUILD DPC=$DPC CASE= bash tests/settings.sh >"$tmp/settings" 2>&1; then
	pass=$((pass + 1))
	tail -n 1 "$tmp/settings"
else
	bad "tests/settings.sh" "$(grep -E 'FAIL|passed' "$tmp/settings" | head -20)"
fi

# A file that cannot be read: a message without a position, status 1.
if case_on missing-file; then
	"$DPC" "$tmp/no-such-file.dp" -o "$tmp/out.bin" >/dev/null 2>"$tmp/stderr"
	rc=$?
	if [ $rc -eq 1 ] && grep -qF "error: cannot open '$tmp/no-such-file.dp': No such file" "$tmp/stderr" &&
		! crashed "$tmp/stderr" && [ ! -e "$tmp/out.bin" ]; then
		pass=$((pass + 1))
	else
		bad "missing file" "status $rc: $(head -c 300 "$tmp/stderr")"
	fi
fi

# Data files: one dpc cannot see is a warning (the job may run where it is):
# the model compiles, and the warning says how dpexec resolves the path.
# Files it can see that hold what is declared give no message at all.
# check_data_ok NAME EXPECTED-STDERR (the .dp on stdin; run from the root)
check_data_ok() {
	local name=$1 exp=$2
	case_on "data/$name" || return 0
	cat >"$tmp/$name.dp"
	rm -f "$tmp/out.bin"
	"$DPC" "$tmp/$name.dp" -o "$tmp/out.bin" >/dev/null 2>"$tmp/stderr"
	rc=$?
	got=$(grep -E ': (warning|error): ' "$tmp/stderr" | sed "s|^$tmp/||")
	if [ $rc -eq 0 ] && [ -s "$tmp/out.bin" ] && [ "$got" = "$exp" ] && ! crashed "$tmp/stderr"; then
		pass=$((pass + 1))
	else
		bad "data files: $name" "status $rc, got:
$got
want:
$exp"
	fi
}
D=tests/errors/data
npy_model() { # npy_model DATA-AND-EVAL-SECTIONS: a linear model on x: f32[batch, 6], y
	cat <<EOF
mesh dp_replicate=1, dp_shard=1
$1
model {
  block fc {
    param w: f32[6, 5] init normal(0, 0.1)
    logits = linear(x, w)
  }
  loss = cross_entropy(logits, y)
}
train {
  optimizer sgd(lr=0.1)
  micro_batch 4
}
EOF
}
check_data_ok unseen "unseen.dp:3:30: warning: data file data/x.npy not found from here; dpexec resolves it against its working directory where the job runs
unseen.dp:4:30: warning: data file /nonexistent/labels.gz not found from here; dpexec reads it where the job runs" < <(npy_model "data {
  x: f32[batch, 6]  from npy(\"data/x.npy\")
  y: i32[batch]     from idx(\"/nonexistent/labels.gz\")
}
eval {
  x from npy(\"$D/x6.npy\")
  y from npy(\"$D/y8.npy\")
}")
check_data_ok seen "" < <(npy_model "data {
  x: f32[batch, 6]  from idx(\"$D/images.idx.gz\")
  y: i32[batch]     from idx(\"$D/labels.idx.gz\")
}
eval {
  x from npy(\"$D/x6.npy\")
  y from npy(\"$D/y8.npy\")
}")
tokens_model() { # tokens_model PATTERN: a model on token shards
	cat <<EOF
mesh dp_replicate=1, dp_shard=1
data {
  ids: i32[batch, 8]     from tokens("$1")
  targets: i32[batch, 8] from tokens("$1", shift=1)
}
model {
  block emb {
    param wte: f32[11, 4] init normal(0, 0.1)
    h = embedding(ids, wte)
  }
  block head {
    param w: f32[4, 11] init normal(0, 0.1)
    logits = matmul(h, w)
  }
  loss = cross_entropy(logits, targets)
}
train {
  optimizer sgd(lr=0.1)
  micro_batch 4
}
EOF
}
check_data_ok tokens "" < <(tokens_model "$D/shard_[ab].shard")
# said once for the two sources that read the same pattern
check_data_ok tokens_unseen "tokens_unseen.dp:3:38: warning: token shard pattern $D/none_*.shard not found from here; dpexec resolves it against its working directory where the job runs" < <(tokens_model "$D/none_*.shard")

# Bad command-line options: one line in the program's words (nothing from
# getopt itself), "did you mean" for a misspelt long option, and the
# program's usage status: dpc 1, dpexec 2 (it stops before MPI starts).
DPEXEC=${DPEXEC:-$BUILD/dpexec}
check_option() { # check_option PROGRAM STATUS EXPECTED-STDERR ARGS...
	local prog=$1 want=$2 exp=$3 bin a opt=
	shift 3
	for a in "$@"; do case $a in -*) opt=${opt:-${a%%=*}} ;; esac; done
	case_on "options/$prog $opt" || return 0
	bin=$DPC
	[ "$prog" = dpexec ] && bin=$DPEXEC
	rm -f "$tmp/out.bin"
	ASAN_OPTIONS=detect_leaks=0 "$bin" "$@" >"$tmp/stdout" 2>"$tmp/stderr"
	rc=$?
	if [ $rc -eq "$want" ] && [ "$(cat "$tmp/stderr")" = "$exp" ] && [ ! -e "$tmp/out.bin" ]; then
		pass=$((pass + 1))
	else
		bad "$prog $*" "status $rc (want $want), stderr: $(head -c 300 "$tmp/stderr"), want: $exp"
	fi
}
check_option dpc 1 "dpc: error: unknown option '--world-sise'; did you mean '--world-size'?" \
	models/mlp.dp --world-sise 2 -o "$tmp/out.bin"
check_option dpc 1 "dpc: error: unknown option '--emitt'; did you mean '--emit'?" \
	models/mlp.dp --emitt=ir -o "$tmp/out.bin"
check_option dpc 1 "dpc: error: unknown option '-stats'; did you mean '--stats'?" \
	models/mlp.dp -stats -o "$tmp/out.bin"
check_option dpc 1 "dpc: error: unknown option '--frobnicate' (see --help)" \
	models/mlp.dp --frobnicate -o "$tmp/out.bin"
check_option dpc 1 "dpc: error: option '--stats' takes no value" \
	models/mlp.dp --stats=yes -o "$tmp/out.bin"
check_option dpc 1 "dpc: error: option '--dump' is ambiguous: --dump-ir, --dump-after" \
	models/mlp.dp --dump=x -o "$tmp/out.bin"
check_option dpc 1 "dpc: error: option '-o' needs a value" models/mlp.dp -o
if [ -x "$DPEXEC" ]; then
	check_option dpexec 2 "dpexec: error: unknown option '--stpes'; did you mean '--steps'?" \
		--stpes 3 "$tmp/out.bin"
	check_option dpexec 2 "dpexec: error: unknown option '-steps'; did you mean '--steps'?" \
		-steps 3 "$tmp/out.bin"
	check_option dpexec 2 "dpexec: error: unknown option '--chekc-grads'; did you mean '--check-grads'?" \
		--chekc-grads "$tmp/out.bin"
	check_option dpexec 2 "dpexec: error: option '--quiet' takes no value" --quiet=1 "$tmp/out.bin"
	check_option dpexec 2 "dpexec: error: option '--save' is ambiguous: --save-full, --save-dir, --save-form, --save-every" \
		--save x "$tmp/out.bin"
	check_option dpexec 2 "dpexec: error: option '--steps' needs a value" "$tmp/out.bin" --steps
else
	bad "dpexec options" "$DPEXEC is not built"
fi

# The fuzzer (built by `make tests` from the compiler's objects): mutated
# copies of models/mlp.dp and of the seeds must never crash the front end.
if [ -x "$BUILD/tests/fe_fuzz" ]; then
	for seed in models/mlp.dp tests/errors/seeds/*.dp; do
		case_on "fe_fuzz $(basename "$seed" .dp)" || continue
		REPRO="TMPDIR=/tmp $BUILD/tests/fe_fuzz $seed $FUZZ_N 1"
		if TMPDIR="$tmp" "$BUILD/tests/fe_fuzz" "$seed" "$FUZZ_N" 1 >"$tmp/fuzz" 2>&1 &&
			! crashed "$tmp/fuzz"; then
			cat "$tmp/fuzz"
			pass=$((pass + 1))
		else
			bad "fe_fuzz $seed" "$(tail -20 "$tmp/fuzz")"
		fi
	done
else
	bad "fe_fuzz" "$BUILD/tests/fe_fuzz is not built (make tests)"
fi

echo "errors: $pass passed, $fail failed"
[ $fail -eq 0 ]
