#!/usr/bin/env bash
# The main job: install what is missing, build Kiln, then compile models/mlp.kiln into a
# training program and train it on Fashion-MNIST by the model file's recipe (5 epochs,
# about a minute on 2 cores), printing the test accuracy after every epoch.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target kiln kiln_rt >/dev/null

build/kiln check models/mlp.kiln | sed -n '1,/^total/p'
echo
mkdir -p out
build/kiln train models/mlp.kiln --checkpoint-dir out/mlp --log out/mlp.jsonl "$@"
