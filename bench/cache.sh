#!/usr/bin/env bash
# kiln build's pieces and object cache (cli/pieces.c, cli/objcache.c) in one run, rounds
# interleaved: for each model, the wall time of
#   cold     a build with an empty cache, Clang inside kiln (every piece compiled)
#   gcc      a build by the external compiler (--cc gcc) with the cache off
#   base-gcc, base-in  (with BASELINE_KILN=path: a kiln from before the pieces, e.g. main's,
#            whose builds compile model.c's two halves) its gcc and in-process builds
#   lr       a rebuild after a change of the recipe's lr alone (warm cache)
#   width    a rebuild after a change of the blocks' MLP width (a Linear's width; warm cache)
# each round with a value not built before, so that the rebuilds compile what changed.
# Medians of ROUNDS rounds; ratios cold/gcc (and cold/base-gcc) and width/cold. The load
# average before and after says how much else ran on the machine.
#     ROUNDS=3 BASELINE_KILN=/work/main/build/kiln bench/cache.sh | tee bench/results/cache-$(date +%F).txt
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
MODELS=${MODELS:-"gpt gpt2-124m"}
CC_EXTERNAL=${CC_EXTERNAL:-gcc}
BASELINE_KILN=${BASELINE_KILN:-}
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt >/dev/null
log=$PWD/out/cache-bench
rm -rf "$log"
mkdir -p "$log"
kiln=$PWD/out/build-bench/kiln
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty), $(nproc) CPUs,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
# timed KIND CMD...: the wall time of CMD appended to $log/$m.KIND; its --time-passes
# "compile" row (what was compiled) to $log/$m.KIND.what
timed() {
  local kind=$1; shift
  local t0 t1
  t0=$(now); "$@" > "$log/out" 2>&1 || { cat "$log/out"; exit 1; }; t1=$(now)
  echo "$t1 - $t0" | bc -l >> "$log/$m.$kind"
  grep -o 'compiled [0-9]* of .*' "$log/out" | tail -1 >> "$log/$m.$kind.what" || true
}
width_of() { case $1 in gpt) echo 512 ;; gpt2-124m) echo 3072 ;; *) echo 0 ;; esac; }
for m in $MODELS; do
  cp "models/$m.kiln" "$log/$m.kiln" # the rebuilds' model: the same path each time
  XDG_CACHE_HOME="$log/warm-$m" $kiln build "$log/$m.kiln" -o "$log/$m-warm" 2>/dev/null # the warm cache
done
for r in $(seq "$ROUNDS"); do
  for m in $MODELS; do
    rm -rf "$log/cold"
    timed cold env XDG_CACHE_HOME="$log/cold" $kiln build "models/$m.kiln" -o "$log/$m-cold" --time-passes
    timed gcc env KILN_CACHE_MAX_BYTES=0 $kiln build "models/$m.kiln" --cc "$CC_EXTERNAL" -o "$log/$m-gcc" --time-passes
    if [ -n "$BASELINE_KILN" ]; then
      timed base-gcc "$BASELINE_KILN" build "models/$m.kiln" --cc "$CC_EXTERNAL" -o "$log/$m-base-gcc"
      timed base-in "$BASELINE_KILN" build "models/$m.kiln" -o "$log/$m-base-in"
    fi
    # lr: a value no round built before
    sed "s/lr = [0-9.e-]*,/lr = 1.${r}7e-4,/" "models/$m.kiln" > "$log/$m.kiln"
    timed lr env XDG_CACHE_HOME="$log/warm-$m" $kiln build "$log/$m.kiln" -o "$log/$m-lr" --time-passes
    # width: the blocks' MLP (its first Linear's output, the second's input), 8 narrower a round
    w=$(( $(width_of "$m") - 8 * r ))
    sed "s/MLP(C, 4 \* C)/MLP(C, $w)/" "models/$m.kiln" > "$log/$m.kiln"
    grep -q "MLP(C, $w)" "$log/$m.kiln"
    timed width env XDG_CACHE_HOME="$log/warm-$m" $kiln build "$log/$m.kiln" -o "$log/$m-width" --time-passes
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-10s %8s %8s %8s %8s %9s %8s %8s %10s %10s\n" model cold gcc base-gcc base-in cold/gcc lr width width/cold cold/b-gcc
for m in $MODELS; do
  c=$(median < "$log/$m.cold"); g=$(median < "$log/$m.gcc"); l=$(median < "$log/$m.lr"); w=$(median < "$log/$m.width")
  bg=-; bi=-; rb=-
  if [ -n "$BASELINE_KILN" ]; then
    bg=$(median < "$log/$m.base-gcc"); bi=$(median < "$log/$m.base-in"); rb=$(printf "%.2f" "$(echo "$c / $bg" | bc -l)")
    bg=$(printf "%.2fs" "$bg"); bi=$(printf "%.2fs" "$bi")
  fi
  printf "%-10s %7.2fs %7.2fs %8s %8s %9.2f %7.3fs %7.2fs %10.2f %10s\n" "$m" "$c" "$g" "$bg" "$bi" "$(echo "$c / $g" | bc -l)" "$l" "$w" \
    "$(echo "$w / $c" | bc -l)" "$rb"
done
echo
echo "what each build compiled (last round):"
for m in $MODELS; do
  for k in cold gcc lr width; do printf "%-10s %-6s %s\n" "$m" "$k" "$(tail -1 "$log/$m.$k.what")"; done
done
