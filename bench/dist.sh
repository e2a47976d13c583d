#!/usr/bin/env bash
# Data-parallel training on this machine (docs/distributed.md): samples per second of one
# rank with 2 threads against 2 ranks with 1 thread each (mpirun, one rank per core), on
# gpt and briefly on gpt2-124m (context cut to 256 to keep it short: the gradients, which
# are what the ranks exchange, are the full 124M parameters), with the time per step the
# update waited for the gradient all-reduce and the time of one whole all-reduce alone;
# then PyTorch DDP (gloo) on the same gpt, global batch split the same way
# (bench/dist_torch.py). Kiln's figures come from PROG --bench-steps (random inputs).
# Results: bench/results/dist-DATE-COMMIT.txt.       STEPS=N BIG_STEPS=N bench/dist.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench/results' || echo -dirty)
result="bench/results/dist-$(date +%F)-$commit.txt"
mkdir -p out bench/results
{
  echo "# bench/dist.sh at $commit on $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(date -u +%FT%TZ)"
  echo "# model      ranks x threads  batch/rank  step ms  samples/s  allreduce wait ms/step  one allreduce ms  gradient MB  GB/s"
} | tee "$result"
report() { # model, ranks, threads, the bench: line
  /usr/bin/python3 -c '
import json, sys
model, ranks, threads, line = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
b = json.loads(line.split("bench: ", 1)[1])
ms, batch = b["train_step_ms_median"], b["batch"]
wait, one, mb = b.get("allreduce_wait_ms", 0), b.get("allreduce_ms", 0), b.get("gradient_bytes", 0) / 1e6
gbs = f"{mb / one:.2f}" if one else "-"
print(f"{model:11s}  {ranks} x {threads}            {batch:4d}     {ms:8.1f}  {batch * ranks * 1000 / ms:9.1f}  {wait:22.2f}  {one:16.2f}  {mb:11.1f}  {gbs}")
' "$@" | tee -a "$result"
}
run_model() { # model file, steps, extra build flags, the global batch
  local name; name=$(basename "$1" .kiln)
  out/build-bench/kiln build "$1" --distributed $3 -o "out/$name-dist" >/dev/null
  report "$name" 1 2 "$(mpirun -np 1 --bind-to none "out/$name-dist" --bench-steps "$2" --batch "$4" --threads 2 | grep '^bench:')"
  report "$name" 2 1 "$(mpirun -np 2 --oversubscribe --bind-to core "out/$name-dist" --bench-steps "$2" --batch "$4" --threads 1 | grep '^bench:')"
}
run_model models/gpt.kiln "${STEPS:-20}" "" 16
run_model models/gpt2-124m.kiln "${BIG_STEPS:-3}" "--bound T=256" 4
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  /usr/bin/python3 bench/dist_torch.py --steps "${STEPS:-20}" | tee -a "$result"
else
  echo "PyTorch is not installed (apt-get install python3-torch): skipping DDP" >&2
fi
echo "wrote $result"
