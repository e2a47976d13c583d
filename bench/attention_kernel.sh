#!/usr/bin/env bash
# bench/attention_kernel.sh — the C target's fused attention kernel (runtime/kiln_attention.h)
# side by side with the unfused computation, at gpt's and gpt2-124m's attention shapes
# (bench/attention_kernel.c), compiled as generated code is (-O3 -march=native -fopenmp,
# single-threaded OpenBLAS), on all cores.
#
#   bench/attention_kernel.sh            shapes "4 4 128 32" (gpt) and "4 12 1024 64" (gpt2-124m)
#   SHAPES="1 8 2048 64" bench/attention_kernel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
cc -O3 -march=native -fno-trapping-math -fopenmp -Iruntime bench/attention_kernel.c -lopenblas -lm -o out/attention_kernel
echo "# bench/attention_kernel.sh, $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
shapes=${SHAPES:-"4 4 128 32|4 12 1024 64"}
IFS='|' read -ra list <<<"$shapes"
for s in "${list[@]}"; do
    # shellcheck disable=SC2086
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=$(nproc) out/attention_kernel $s
done
