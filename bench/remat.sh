#!/usr/bin/env bash
# bench/remat.sh — activation checkpointing (passes/remat.c, docs/language.md): the memory
# `kiln build --report` plans and the peak RSS and step time measured, for each model
# without rematerialisation, with every block checkpointed (`checkpoint(block(x))`), and
# under a memory budget halfway between the two plans (`--memory-budget`).
#
#   bench/remat.sh                    gpt 16 x 128 and gpt2-124m 8 x 256 (about 10 minutes on 2 cores)
#   MODELS="gpt" bench/remat.sh       one model only
#   STEPS=5 bench/remat.sh            timed steps per program (default 3, after 2 untimed)
#
# Plan: the report's total (parameters, gradients, optimizer state, buffers, training and
# evaluation arenas). Measured: the training program's --bench-steps figures, train_rss_mb
# (the process's peak RSS after the timed training steps: the plan plus the program, its
# data, OpenBLAS's and OpenMP's buffers) and train_step_ms_median. 2 threads. Writes
# bench/results/remat-YYYY-MM-DD-COMMIT.txt; work files in out/bench-remat/. Measured,
# never asserted in tests (test_remat asserts the bits and the budget).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-3}
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench/remat.sh: STEPS=$steps: give a whole number of steps, at least 1" >&2; exit 2; }
models=${MODELS:-gpt gpt2-124m}
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt kiln_train_main kiln_train_bench >/dev/null
work=out/bench-remat
mkdir -p "$work" bench/results
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git diff --quiet HEAD -- . 2>/dev/null || echo "-dirty")
result=bench/results/remat-$(date +%F)-$commit$dirty.txt
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# the value of "key": N in a one-line JSON object
json() { sed -n "s/.*\"$2\": \\([0-9.e+-]*\\).*/\\1/p" <<<"$1"; }

{
    echo "# bench/remat.sh, commit $commit$dirty, $(date -u +%FT%TZ), $(nproc) cores, load at start $load_start"
    echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    printf '%-10s %-7s %-12s %14s %14s %12s %10s %12s %10s\n' model batch variant "plan act (MB)" "plan total (MB)" "peak RSS (MB)" "RSS/plan" "step (ms)" "step/plain"
} | tee "$result"

for model in $models; do
    case $model in
    gpt) batch=16 T=128 ;;
    gpt2-124m) batch=8 T=256 ;;
    *) echo "bench/remat.sh: unknown model '$model' (gpt, gpt2-124m)" >&2; exit 2 ;;
    esac
    # the model at this batch (a recipe's batch is the bound --bound may only lower)
    src=$work/$model.kiln
    sed "s/^    batch *= *[0-9]*/    batch     = $batch/" "models/$model.kiln" >"$src"
    grep -q "^    batch     = $batch\$" "$src" || { echo "bench/remat.sh: models/$model.kiln has no 'batch = N' line" >&2; exit 1; }
    every=$work/$model-every.kiln
    sed 's/for block in h { x = block(x) }/for block in h { x = checkpoint(block(x)) }/' "$src" >"$every"
    grep -q 'checkpoint(block(x))' "$every" || { echo "bench/remat.sh: $src has no 'for block in h { x = block(x) }' line" >&2; exit 1; }
    declare -A total=() act=()
    plan() { # name file [flags...]: builds $work/$model-$name, records its plan
        local name=$1 file=$2 rep
        shift 2
        rep=$(out/build-bench/kiln build "$file" --bound T=$T --report "$@" -o "$work/$model-$name" 2>&1) || { echo "$rep" >&2; exit 1; }
        total[$name]=$(sed -n 's/^kiln:\{0,1\} *total *\([0-9]*\).*/\1/p; s/^  total *\([0-9]*\).*/\1/p' <<<"$rep" | head -1)
        act[$name]=$(sed -n 's/^ *activations train *\([0-9]*\).*/\1/p' <<<"$rep" | head -1)
        [ -n "${total[$name]}" ] || { echo "$rep" >&2; exit 1; }
        echo "$rep" >"$work/$model-$name.report"
    }
    plan plain "$src"
    plan every "$every"
    half=$(((total[plain] + total[every]) / 2))
    plan half "$src" --memory-budget "$half"
    base_ms=
    for name in plain every half; do
        out=$("$work/$model-$name" --bench-steps "$steps" --batch "$batch" --threads 2 2>&1 | grep '^bench: ' | tail -1)
        ms=$(json "$out" train_step_ms_median)
        rss=$(json "$out" train_rss_mb)
        [ -n "$ms" ] && [ -n "$rss" ] || { echo "bench/remat.sh: $model-$name: no bench line" >&2; exit 1; }
        [ -n "$base_ms" ] || base_ms=$ms
        label=$name
        [ "$name" = half ] && label="budget($(grep -o '[0-9]* of the model.s [0-9]* blocks' "$work/$model-$name.report" | sed 's/ of the model.s /\//; s/ blocks//'))"
        awk -v m="$model" -v b="${batch}x$T" -v n="$label" -v a="${act[$name]}" -v t="${total[$name]}" -v r="$rss" -v s="$ms" -v s0="$base_ms" \
            'BEGIN { printf "%-10s %-7s %-12s %14.1f %14.1f %12.1f %10.3f %12.1f %10.3f\n", m, b, n, a / 1048576, t / 1048576, r, r * 1048576 / t, s, s / s0 }' |
            tee -a "$result"
    done
done
echo "# load at end $(cut -d' ' -f1-3 /proc/loadavg); budget(k/n): --memory-budget halfway between the plain and every-block plans, k of n blocks checkpointed" | tee -a "$result"
echo "bench/remat.sh: wrote $result" >&2
