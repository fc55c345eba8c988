#!/usr/bin/env bash
# tests/demo_gpt.sh - `make demo-gpt`: a byte-level shard of English text from the
# Debian fortunes package, the tiny GPT-2 (models/gpt2-tiny.dp) trained on it, and
# its loss beside the text's unigram entropy (the loss of the best model that
# ignores context: a model that learnt anything ends well below it).
#
# The text is a fixed list of the package's plain-text fortune files (not the .dat
# indices or .u8 links), in this order, so the shard is the same on every machine
# with fortunes 1:1.99.1. The shards go to build/data/fortunes.bin (train) and
# build/data/fortunes_val.bin (the last 10%): the paths models/gpt2-tiny.dp reads,
# relative to the repository root. Environment: DEMO_GPT_STEPS (default 600, the
# model's cosine schedule; about a minute on 2 cores), DEMO_GPT_RANKS (default 1;
# >1 runs under mpirun with --world-size N), DEMO_GPT_MODEL (default
# models/gpt2-tiny.dp), DEMO_GPT_PRECISION (f32, or bf16: `make demo-gpt
# PRECISION=bf16` trains in f32 and in bf16 (dpc --precision) from the same
# weights and data, prints both final losses and fails when bf16 ends more
# than 2% away from f32). After training, the model writes 200 bytes after
# "The " (dpexec --sample from its saved weights, temperature 0.8, top-k 40):
# what it learnt, as text.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${DEMO_GPT_STEPS:-600}
RANKS=${DEMO_GPT_RANKS:-1}
FORTUNES=/usr/share/games/fortunes
FILES="cookie computers definitions education humorists literature people science wisdom work"
MODEL=${DEMO_GPT_MODEL:-models/gpt2-tiny.dp}
PRECISION=${DEMO_GPT_PRECISION:-f32}

paths=()
for f in $FILES; do
	if [ ! -f "$FORTUNES/$f" ]; then
		echo "demo-gpt: $FORTUNES/$f is missing: install the fortunes package (make deps)" >&2
		exit 1
	fi
	paths+=("$FORTUNES/$f")
done
mkdir -p build/data "$BUILD/demo"
echo "== text2shard -o build/data/fortunes.bin --val build/data/fortunes_val.bin --val-frac 0.1 ($FILES)"
out=$("$BUILD/text2shard" -o build/data/fortunes.bin --val build/data/fortunes_val.bin \
	--val-frac 0.1 "${paths[@]}")
echo "$out"
H=$(echo "$out" | sed -n 's/^unigram entropy.*: \([0-9.]*\) nats\/token.*/\1/p')

if [ ! -f "$MODEL" ]; then
	echo "demo-gpt: $MODEL does not exist yet; stopping after the shard" >&2
	exit 1
fi
# each command is printed as it is run
show() { printf '=='; printf ' %q' "$@"; printf '\n'; }

# train PRECISION: compile and train in f32 or bf16 (dpc --precision); prints
# the summary and sets END (the mean of the last 10 losses)
train() {
	local prec=$1 name=gpt2-tiny-$1 start secs
	cmd=("$BUILD/dpc" "$MODEL" --world-size "$RANKS" --precision "$prec" -o "$BUILD/demo/$name.bin")
	show "${cmd[@]}"
	"${cmd[@]}"
	LOSSES="$BUILD/demo/$name.losses"
	LOG="$BUILD/demo/$name.log"
	cmd=("$BUILD/dpexec" "$BUILD/demo/$name.bin" --steps "$STEPS" --losses "$LOSSES"
	     --save-full "$BUILD/demo/$name.safetensors")
	[ "$RANKS" -gt 1 ] && cmd=(mpirun --oversubscribe --allow-run-as-root -np "$RANKS" "${cmd[@]}")
	show "${cmd[@]}"
	start=$(date +%s)
	"${cmd[@]}" 2>&1 | tee "$LOG"
	[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
	secs=$(( $(date +%s) - start ))
	# the last held-out loss dpexec printed ("eval step N | test loss X | ..."), if any
	VAL=$(sed -n 's/^.*eval step .* | test loss \([0-9.]*\).*/\1/p' "$LOG" | tail -n 1)
	# --losses: "step loss grad_norm lr" per step after a "# ..." header. The
	# end is the mean of the last 10 steps (one batch's loss is noisy).
	awk -v H="$H" -v secs="$secs" -v val="$VAL" -v prec="$prec" '
		/^#/ { next }
		{ loss[++n] = $2 }
		END {
			if (n == 0) { print "demo-gpt: no losses written"; exit 1 }
			k = n < 10 ? n : 10; s = 0
			for (i = n - k + 1; i <= n; i++) s += loss[i]
			end = s / k
			printf "\ntiny GPT on fortunes (%s), %d steps in %ds:\n", prec, n, secs
			printf "  first loss              %.4f nats/token\n", loss[1]
			printf "  last loss (mean of %2d)  %.4f nats/token\n", k, end
			if (val != "")
				printf "  validation loss         %.4f nats/token (build/data/fortunes_val.bin)\n", val
			printf "  unigram entropy         %.4f nats/token (%.4f bits/byte)\n", H, H / log(2)
			if (end < H) {
				printf "  the loss ends %.3f nats/token below the unigram entropy\n", H - end
			} else {
				printf "  the loss did not get below the unigram entropy\n"
				exit 1
			}
		}' "$LOSSES" || exit 1
	END=$(awk '/^#/ { next } { l[++n] = $2 } END { k = n < 10 ? n : 10; for (i = n - k + 1; i <= n; i++) s += l[i]; printf "%.6f", s / k }' "$LOSSES")
}

if [ "$PRECISION" = bf16 ]; then
	# bf16 beside f32 from the same weights and data: the final losses within 2%
	train f32
	F32=$END
	train bf16
	awk -v a="$END" -v b="$F32" 'BEGIN {
		d = (a - b) / b; printf "\nfinal loss: f32 %.4f, bf16 %.4f (%+.2f%%)\n", b, a, 100 * d
		if (d < -0.02 || d > 0.02) { print "demo-gpt: bf16 ends more than 2% away from f32"; exit 1 }
		print "  bf16 is within 2% of f32"
	}'
else
	train "$PRECISION"
fi
# a sample of what the (last) model learnt
cmd=("$BUILD/dpexec" "$BUILD/demo/gpt2-tiny-$PRECISION.bin" --quiet --init-from
     "$BUILD/demo/gpt2-tiny-$PRECISION.safetensors" --sample "The " --tokens 200
     --temperature 0.8 --top-k 40)
[ "$RANKS" -gt 1 ] && cmd=(mpirun --oversubscribe --allow-run-as-root -np "$RANKS" "${cmd[@]}")
echo
show "${cmd[@]}"
"${cmd[@]}"
