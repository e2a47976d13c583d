#!/usr/bin/env bash
# bench/run.sh — Kiln against PyTorch on the reference models, both measured in this one
# run on this machine, as a table of Kiln/PyTorch ratios with the raw figures.
#
#   bench/run.sh [mlp cnn gpt gpt2 ...]     (default: all four; about 5 minutes on 2 cores)
#
# For each model:
#   kiln build   wall time of `kiln build models/M.kiln` (gpt2: models/gpt2-124m.kiln
#                --bound T=64, i.e. GPT-2 small at batch 4 x sequence 64)
#   Kiln         the program's --bench-steps N (programs/train_main.c): 2 warm-up then N
#                timed training steps on random inputs at the recipe's batch (mlp and cnn
#                128, gpt 16 x 128, gpt2 4 x 64), the median; the eval step at batch 1 and
#                at the batch bound; peak RSS (getrusage) after training and at the end;
#                the step's matrix-product FLOPs and shapes (train_gemm_flops/train_gemms)
#   Kiln b256    a program's batch bound is the recipe's batch, so mlp, cnn and gpt are
#                built a second time from a copy of the model file with `batch = 256`
#                (out/bench/M-b256.kiln) for the batch-256 inference figure only
#   PyTorch      bench/torch_bench.py: the same model, recipe, step and measurements,
#                2 threads, with OMP_WAIT_POLICY=passive and OPENBLAS_CORETYPE set for the
#                python process only (SkylakeX on AVX-512 CPUs, Haswell on AVX2+FMA ones,
#                else OpenBLAS's own choice: SkylakeX's kernels stop with SIGILL on a CPU
#                without AVX-512); oneDNN at PyTorch's default
#   sgemm        bench/sgemm.c, compiled with the compiler and flags `kiln build` uses and
#                linked with the same OpenBLAS: cblas_sgemm on 1024^3 and on the Kiln
#                step's own shapes (best of repeated calls), so the table gives each
#                step's GEMM rate (FLOPs per step / median step time) as a percentage of
#                the sgemm rate on those shapes (PyTorch's step: the same FLOPs, its time)
# Inference of gpt/gpt2 is one full-length sequence per batch element (gpt 128 tokens,
# gpt2 64); gpt2's large batch is its training batch 4 (256 tokens): batch 256 x 64 would
# need 3.3 GB of logits alone. Kiln's programs run without those two variables (they choose
# their own settings). Step counts: BENCH_STEPS="mlp=50 cnn=20 gpt=10 gpt2=5" (the default).
# BENCH_ROUNDS=N runs Kiln's program and PyTorch's script N times each, alternating, and
# the table gives the median of the rounds: on a shared VM a neighbour's burst of work
# can slow one run by 30%, and alternating spreads it over both sides.
# Writes the table and the raw JSON lines to bench/results/run-YYYY-MM-DD-COMMIT.txt; work files
# in out/bench/. Without PyTorch (python3-torch) the PyTorch columns stay empty. Speed is
# noisy on a shared machine: the load average is recorded with the results.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# Debian's python3 (python3-torch) even where another python3 comes first on PATH.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3) || { echo "bench/run.sh: python3 is needed for the table" >&2; exit 1; }
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt >/dev/null

models=("${@:-mlp cnn gpt gpt2}")
models=(${models[@]})
steps_spec=" ${BENCH_STEPS:-mlp=50 cnn=20 gpt=10 gpt2=5} "
rounds=${BENCH_ROUNDS:-1}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench/run.sh: BENCH_ROUNDS=$rounds: give a whole number of rounds, at least 1" >&2; exit 2; }
work=out/bench
mkdir -p "$work" bench/results
raw="$work/raw.txt"
: >"$raw"
have_torch=1
$PY -c "import torch" 2>/dev/null || { have_torch=0; echo "PyTorch is not installed (apt-get install python3-torch): Kiln only" >&2; }
json() { $PY -c 'import json, sys; v = json.loads(sys.argv[1])[sys.argv[2]]; print(" ".join(",".join(str(int(x)) for x in s) for s in v) if isinstance(v, list) else v)' "$@"; }
# PyTorch's fastest OpenBLAS kernels on this CPU (see the header)
torch_coretype=
if grep -qw avx512f /proc/cpuinfo; then torch_coretype=SkylakeX
elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then torch_coretype=Haswell; fi
torch_env=(env OMP_WAIT_POLICY=passive)
[ -n "$torch_coretype" ] && torch_env+=(OPENBLAS_CORETYPE="$torch_coretype")
kiln_env=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OPENBLAS_CORETYPE -u OPENBLAS_NUM_THREADS)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
# CPU time taken by other virtual machines on the host ("steal"): on a shared VM it, not
# the load average, is what makes timings move between runs.
cpu_start=$(grep -m1 '^cpu ' /proc/stat)
# before anything is written: the results file itself is tracked
dirty=$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')

# The BLAS-rate program, compiled as `kiln build` compiles a model.
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' out/build-bench/CMakeCache.txt)
blas=$(sed -n 's/^KILN_BLAS_LIB:[A-Z]*=//p' out/build-bench/CMakeCache.txt)
cflags=$($PY -c 'import shlex, sys
for line in open(sys.argv[1]):
    for w in shlex.split(line.split("=", 1)[1]) if line.startswith("C_DEFINES") else []:
        if w.startswith("-DKILN_DEFAULT_CFLAGS="): print(w.split("=", 1)[1].strip("\""))' out/build-bench/CMakeFiles/kiln.dir/flags.make)
"${cc:-cc}" ${cflags:--O2} -std=c11 bench/sgemm.c -o "$work/sgemm" "${blas:--lopenblas}" -lm -lpthread

for m in "${models[@]}"; do
  src="models/$m.kiln" bound=()
  [ "$m" = gpt2 ] && src=models/gpt2-124m.kiln bound=(--bound T=64)
  steps=$(echo "$steps_spec" | sed -n "s/.* $m=\([0-9]*\) .*/\1/p")
  echo "== $m: kiln build" >&2
  t0=$EPOCHREALTIME
  out/build-bench/kiln build "$src" "${bound[@]}" -o "$work/$m" >/dev/null
  echo "kiln $m {\"build_s\": $(awk "BEGIN { printf \"%.2f\", $EPOCHREALTIME - $t0 }")}" >>"$raw"
  echo "== $m: kiln --bench-steps ${steps:=5}" >&2
  line=$("${kiln_env[@]}" "$work/$m" --bench-steps "$steps" | sed -n 's/^bench: //p')
  [ -n "$line" ] || { echo "bench/run.sh: $work/$m printed no bench line" >&2; exit 1; }
  echo "kiln $m $line" >>"$raw"
  infer_batch=256
  if [ "$(json "$line" infer_b256_batch)" -lt 256 ] && [ "$m" != gpt2 ]; then
    echo "== $m: kiln, batch bound 256, for batch-256 inference" >&2
    sed -E 's/^([[:space:]]*batch[[:space:]]*=[[:space:]]*)[0-9]+/\1256/' "$src" >"$work/$m-b256.kiln"
    [ "$(grep -cE '^[[:space:]]*batch[[:space:]]*= 256' "$work/$m-b256.kiln")" = 1 ] || { echo "bench/run.sh: no batch line in $src" >&2; exit 1; }
    out/build-bench/kiln build "$work/$m-b256.kiln" "${bound[@]}" -o "$work/$m-b256" >/dev/null
    wide=$("${kiln_env[@]}" "$work/$m-b256" --bench-steps 1 --batch "$(json "$line" batch)" | sed -n 's/^bench: //p')
    [ -n "$wide" ] || { echo "bench/run.sh: $work/$m-b256 printed no bench line" >&2; exit 1; }
    echo "kiln-b256 $m $wide" >>"$raw"
  else
    infer_batch=$(json "$line" infer_b256_batch)
  fi
  echo "== $m: sgemm on the step's shapes" >&2
  echo "sgemm $m $("${kiln_env[@]}" "$work/sgemm" $(json "$line" gemms) | sed -n 's/^sgemm: //p')" >>"$raw"
  for round in $(seq "$rounds"); do
    if [ "$round" -gt 1 ]; then
      echo "== $m: kiln --bench-steps $steps, round $round" >&2
      line=$("${kiln_env[@]}" "$work/$m" --bench-steps "$steps" | sed -n 's/^bench: //p')
      [ -n "$line" ] || { echo "bench/run.sh: $work/$m printed no bench line" >&2; exit 1; }
      echo "kiln $m $line" >>"$raw"
    fi
    if [ $have_torch = 1 ]; then
      echo "== $m: pytorch, round $round" >&2
      tl=$("${torch_env[@]}" $PY bench/torch_bench.py "$m" --steps "$steps" \
           --infer-batch "$infer_batch" | sed -n 's/^bench: //p')
      echo "pytorch $m $tl" >>"$raw"
    fi
  done
done

# one file per day and commit, so that a second run the same day keeps the first
result="bench/results/run-$(date +%F)-$(git rev-parse --short HEAD 2>/dev/null || echo nogit)${dirty:+-dirty}.txt"
{
  echo "# bench/run.sh, $(date -u '+%F %H:%M UTC'), kiln $(git rev-parse --short HEAD)$dirty"
  echo "# $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores; load average $load_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
  awk -v l="$load_start" 'BEGIN { if (l + 0 > 0.5) print "# WARNING: the machine was busy at the start (load " l "): other work skews these timings" }'
  printf '%s\n%s\n' "$cpu_start" "$(grep -m1 '^cpu ' /proc/stat)" | awk '
    { t = 0; for (i = 2; i <= NF; i++) t += $i; tot[NR] = t; st[NR] = $9 }
    END { d = tot[2] - tot[1]; if (d > 0) printf "# CPU steal during the run: %.1f%% of all CPU time (other virtual machines on the host)\n", 100 * (st[2] - st[1]) / d }'
  echo "# sgemm: $cc $cflags, $blas; PyTorch: $([ $have_torch = 1 ] && $PY -c 'import torch; print(torch.__version__)' || echo 'not installed')"
  echo
  $PY bench/table.py "$raw"
  echo
  echo "raw (WHO MODEL JSON):"
  cat "$raw"
} >"$result"
cat "$result"
echo "wrote $result" >&2
