#!/usr/bin/env bash
# The C compiler inside kiln (Clang 16 and lld as libraries, driver/toolchain.h) side by
# side with the external one (gcc 12, --cc) in one run: the wall time of `kiln build` for
# each model, and the training step of the programs each builds (--bench-steps 10, ROUNDS
# interleaved rounds, median of the rounds' medians). Ratios are in-process / gcc: below 1
# the compiler inside kiln is faster.
#     ROUNDS=5 bench/toolchain.sh | tee bench/results/toolchain-$(date +%F).txt
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
MODELS=${MODELS:-"mlp cnn gpt gpt2-124m"}
CC_EXTERNAL=${CC_EXTERNAL:-gcc}
THREADS=${THREADS:-$(nproc)}
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt >/dev/null
log=out/toolchain-bench
mkdir -p "$log"
kiln=out/build-bench/kiln
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty), $(nproc) CPUs, $THREADS threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf "%-10s %10s %10s %7s   %12s %12s %7s\n" model "build in" "build gcc" ratio "step in ms" "step gcc ms" ratio
for m in $MODELS; do
  : > "$log/$m.build"
  for r in $(seq "$ROUNDS"); do # builds alternate too: the page cache and the CPU's clock treat both alike
    t0=$(now); $kiln build "models/$m.kiln" -o "$log/$m-in" 2>/dev/null; t1=$(now)
    $kiln build "models/$m.kiln" --cc "$CC_EXTERNAL" -o "$log/$m-gcc" 2>/dev/null; t2=$(now)
    echo "$(echo "$t1 - $t0" | bc -l) $(echo "$t2 - $t1" | bc -l)" >> "$log/$m.build"
  done
  bin=$(cut -d' ' -f1 "$log/$m.build" | median); bgcc=$(cut -d' ' -f2 "$log/$m.build" | median)
  : > "$log/$m.in"; : > "$log/$m.gcc"
  steps=10; [ "$m" = gpt2-124m ] && steps=3
  for r in $(seq "$ROUNDS"); do
    for c in in gcc; do
      "$log/$m-$c" --bench-steps $steps --threads "$THREADS" 2>/dev/null | grep '^bench:' | grep -o '"train_step_ms_median": [0-9.]*' | cut -d' ' -f2 >> "$log/$m.$c"
    done
  done
  sin=$(median < "$log/$m.in"); sgcc=$(median < "$log/$m.gcc")
  printf "%-10s %9.2fs %9.2fs %7.2f   %12.2f %12.2f %7.3f\n" "$m" "$bin" "$bgcc" "$(echo "$bin / $bgcc" | bc -l)" "$sin" "$sgcc" "$(echo "$sin / $sgcc" | bc -l)"
done
