#!/usr/bin/env bash
# Loss curves side by side: models/llama.kiln trained by Kiln, the same model, data and recipe
# in PyTorch (bench/reference_llama.py), and models/gpt.kiln trained by Kiln, for STEPS steps
# (default 500) with the validation loss every EVERY steps (default 100), in the same session.
# Prints one row per evaluation and the seconds per step of each run (evaluations included).
#     STEPS=200 EVERY=50 bench/llama.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-500}
EVERY=${EVERY:-100}
THREADS=${THREADS:-$(nproc)}
scripts/deps.sh
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt >/dev/null
mkdir -p out/llama-bench
log=out/llama-bench
# seconds per step of a command, its eval lines into a log
timed() {
  local name=$1; shift
  local start; start=$(date +%s.%N)
  "$@" > "$log/$name.out" 2>&1
  echo "$name: $(echo "($(date +%s.%N) - $start) / $STEPS" | bc -l | cut -c1-5) s per step" >> "$log/times"
}
: > "$log/times"
for m in llama gpt; do
  out/build-bench/kiln build "models/$m.kiln" -o "$log/$m-train"
  rm -rf "$log/$m-ckpt"
  timed "kiln-$m" "$log/$m-train" --checkpoint-dir "$log/$m-ckpt" --steps "$STEPS" --eval-every "$EVERY" --threads "$THREADS"
done
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  timed pytorch-llama /usr/bin/python3 bench/reference_llama.py --steps "$STEPS" --eval-every "$EVERY" --threads "$THREADS"
else
  echo "PyTorch is not installed (apt-get install python3-torch): skipping the reference" >&2
  : > "$log/pytorch-llama.out"
fi
python3 - "$log" <<'PY'
import re, sys
log = sys.argv[1]
def evals(name, pattern):
    with open(f"{log}/{name}.out", errors="replace") as f:
        return {int(m.group(1)): float(m.group(2)) for m in re.finditer(pattern, f.read())}
kl = evals("kiln-llama", r"eval at step (\d+) \(\d+ samples?\): loss ([0-9.]+)")
kg = evals("kiln-gpt", r"eval at step (\d+) \(\d+ samples?\): loss ([0-9.]+)")
pl = evals("pytorch-llama", r"pytorch llama step (\d+): train loss [0-9.]+  val loss ([0-9.]+)")
fmt = lambda d, s: f"{d[s]:.4f}" if s in d else "-"
print("validation loss (fortunes, 20 batches of 16 x 128 bytes)")
print(f"{'step':>6}  {'kiln llama':>10}  {'torch llama':>11}  {'kiln gpt':>8}")
for s in sorted(set(kl) | set(kg) | set(pl)):
    print(f"{s:>6}  {fmt(kl, s):>10}  {fmt(pl, s):>11}  {fmt(kg, s):>8}")
PY
cat "$log/times"
