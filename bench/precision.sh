#!/usr/bin/env bash
# Mixed precision (passes/precision.c, docs/precision.md) side by side with fp32: models/gpt.kiln
# trained STEPS steps (default 500) in fp32, bf16, bf16 with its weights rounded stochastically
# (bf16sr: --weight-rounding stochastic) and fp16, with its validation loss at the end;
# the training step time of each (--bench-steps, ROUNDS interleaved rounds, median and min);
# gpt2-124m's planned training activations in each (kiln build --report, before anything
# runs); and PyTorch's CPU autocast (bfloat16) step time of the same gpt, when installed
# (TORCH=0 skips it: 20 steps of it take minutes on 2 CPUs).
#     STEPS=200 ROUNDS=3 bench/precision.sh | tee bench/results/precision-$(date +%F).txt
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-500}
ROUNDS=${ROUNDS:-3}
TORCH=${TORCH:-1}
CONFIGS="fp32 bf16 bf16sr fp16"
flags() { case "$1" in bf16sr) echo "--precision bf16 --weight-rounding stochastic" ;; *) echo "--precision $1" ;; esac; }
THREADS=${THREADS:-$(nproc)}
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt >/dev/null
log=out/precision-bench
mkdir -p "$log"
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty), $(nproc) CPUs, $THREADS threads, $STEPS steps"
for p in $CONFIGS; do
  # shellcheck disable=SC2046
  out/build-bench/kiln build models/gpt.kiln $(flags "$p") -o "$log/gpt-$p" 2>/dev/null
done
echo "gpt validation loss after $STEPS steps:"
for p in $CONFIGS; do
  rm -rf "$log/ckpt-$p"
  start=$(date +%s.%N)
  "$log/gpt-$p" --checkpoint-dir "$log/ckpt-$p" --steps "$STEPS" --eval-every "$STEPS" --threads "$THREADS" > "$log/train-$p.out" 2>&1
  secs=$(echo "($(date +%s.%N) - $start) / $STEPS" | bc -l | cut -c1-5)
  echo "  $p: $(grep -o "eval at step $STEPS ([0-9]* samples\?): loss [0-9.]*" "$log/train-$p.out" | sed 's/.*loss //')  ($secs s per step, evaluation included)"
done
echo "gpt training step (ms, --bench-steps 10, $ROUNDS interleaved rounds):"
: > "$log/steps"
for r in $(seq "$ROUNDS"); do
  for p in $CONFIGS; do
    "$log/gpt-$p" --bench-steps 10 --threads "$THREADS" 2>/dev/null | grep '^bench:' | sed "s/^bench:/$p/" >> "$log/steps"
  done
done
python3 - "$log/steps" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    p, j = line.split(" ", 1)
    runs.setdefault(p, []).append(json.loads(j))
base = statistics.median(r["train_step_ms_median"] for r in runs["fp32"])
for p, rs in runs.items():
    med = statistics.median(r["train_step_ms_median"] for r in rs)
    print(f"  {p}: median {med:.1f}  min {min(r['train_step_ms_min'] for r in rs):.1f}  ({med / base:.2f}x fp32)  rss {rs[0]['train_rss_mb']} MB")
PY
echo "gpt2-124m planned training activations (kiln build --report):"
for p in fp32 bf16 fp16; do
  echo "  $p: $(out/build-bench/kiln emit models/gpt2-124m.kiln --precision "$p" -o "$log/gpt2-$p" --report 2>&1 | grep 'activations train' | awk '{print $3}')"
done
if [ "$TORCH" != 0 ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'), same gpt, 20 steps:"
  for p in fp32 bf16; do
    echo "  $p: $(/usr/bin/python3 bench/reference_gpt.py --steps 20 --threads "$THREADS" --precision "$p" 2>&1 | tail -1 | sed 's/.*: //')"
  done
fi
