#!/usr/bin/env bash
# tests/demo.sh - `make demo`: compile models/mlp.dp for 2 ranks and train it on
# Fashion-MNIST, printing a falling loss and the test accuracy. Each command is
# printed exactly as it is run (the README's launch line: --oversubscribe for
# more ranks than cores, --allow-run-as-root for root in containers).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
mkdir -p "$BUILD/demo"
# show CMD...: print the command as a shell would read it back, then run it
show() {
	printf '=='
	printf ' %q' "$@"
	printf '\n'
	"$@"
}
show "$BUILD/dpc" models/mlp.dp --world-size 2 -o "$BUILD/demo/mlp.bin" --stats --time
# shellcheck disable=SC2086 # DEMO_ARGS: extra dpexec options, split on spaces
show mpirun --oversubscribe --allow-run-as-root -np 2 "$BUILD/dpexec" "$BUILD/demo/mlp.bin" ${DEMO_ARGS:-}
