#!/usr/bin/env bash
# The 500-step byte-level GPT run of models/gpt.kiln with Kiln, then the same model, data
# and recipe in PyTorch (bench/reference_gpt.py), in the same session: step times and
# validation losses side by side, and a generated sample from Kiln's model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt >/dev/null
mkdir -p out
out/build-bench/kiln build models/gpt.kiln -o out/gpt-train
start=$(date +%s.%N)
out/gpt-train --checkpoint-dir out/gpt-ckpt --steps "${STEPS:-500}" | grep -E "eval|sample|gpt:"
echo "kiln gpt: $(echo "($(date +%s.%N) - $start) / ${STEPS:-500}" | bc -l | cut -c1-5) s per step (including evaluation)"
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 bench/reference_gpt.py --steps "${STEPS:-500}"
else
  echo "PyTorch is not installed (apt-get install python3-torch): skipping the reference" >&2
fi
