#!/usr/bin/env bash
# The main job: install what is missing, build Kiln, then check models/mlp.kiln and print
# its IR (a later milestone turns this into training it on Fashion-MNIST).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target kiln >/dev/null

echo "== kiln ir models/mlp.kiln"
build/kiln ir models/mlp.kiln
echo
echo "== kiln check models/mlp.kiln"
build/kiln check models/mlp.kiln
