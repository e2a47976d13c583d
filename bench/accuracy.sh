#!/usr/bin/env bash
# Trains mlp.kiln (5 epochs) and cnn.kiln (3 epochs) with Kiln, then the same models and
# recipe in PyTorch, in the same session on the same machine; then loads Kiln's final
# checkpoints into the PyTorch modules and evaluates them there.
#   bench/accuracy.sh [mlp|cnn ...]      (PyTorch: Debian's python3-torch)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt >/dev/null
models=("${@:-mlp cnn}")
mkdir -p out
for m in ${models[@]}; do
  echo "== kiln $m"
  out/build-bench/kiln build "models/$m.kiln" -o "out/$m-train"
  start=$(date +%s.%N)
  "out/$m-train" --checkpoint-dir "out/$m-ckpt" --eval-every 0 | grep -E "eval|parameters"
  echo "kiln $m: $(echo "$(date +%s.%N) - $start" | bc) s in total"
done
PY=/usr/bin/python3
if ! $PY -c "import torch" 2>/dev/null; then
  echo "PyTorch is not installed (apt-get install python3-torch): skipping the reference" >&2
  exit 0
fi
for m in ${models[@]}; do
  echo "== pytorch $m"
  $PY bench/reference.py "$m"
  $PY bench/reference.py eval "$m" "out/$m-ckpt"
done
