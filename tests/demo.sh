#!/usr/bin/env bash
# tests/demo.sh - `make demo`: compile models/mlp.dp for 2 ranks and train it on
# Fashion-MNIST, printing a falling loss and the test accuracy.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$BUILD/demo"
echo "== dpc models/mlp.dp --world-size 2 -o $BUILD/demo/mlp.bin --stats"
"$BUILD/dpc" models/mlp.dp --world-size 2 -o "$BUILD/demo/mlp.bin" --stats --time
echo "== mpirun -np 2 dpexec $BUILD/demo/mlp.bin ${DEMO_ARGS:-}"
mpirun --oversubscribe -np 2 "$BUILD/dpexec" "$BUILD/demo/mlp.bin" ${DEMO_ARGS:-}
