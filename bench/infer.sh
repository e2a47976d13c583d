#!/usr/bin/env bash
# bench/infer.sh — inference programs (kiln build --infer) against PyTorch eager, mlp on the
# same weights, both measured in this one run on this machine, 2 threads each.
#
#   bench/infer.sh            (about a minute on 2 cores)
#
# Both sides are also timed at 1 thread: on a busy 2-core machine a second thread that is
# not scheduled when a parallel kernel starts makes the whole step wait for it (the load
# average at the start and the end is recorded).
# Weights: bench/reference.py's MLP initialised by PyTorch (tests/infer/torch_ref.py, seed
# 1234), saved as safetensors; the images: Fashion-MNIST's 10,000 test images as .npy.
#   batch-1 latency   Kiln: the inference program with --batch 1 --threads 2 --quiet over
#                     the 10,000 images and over the first one only, each run ROUNDS times
#                     (default 5) alternately; (median time of 10,000 - median time of 1) /
#                     9,999: the mean time per image of a running program (the steps, the
#                     batch copies and the outputs; not its start or the file's reading,
#                     which both runs share but for the 7.8 MB of images read).
#                     PyTorch: bench/infer_torch.py latency: model(images[i:i+1]) under
#                     no_grad for each image after one untimed call, 2 threads: the median
#                     call and the mean over the loop (the figure to compare with Kiln's).
#                     Kiln's library (kiln build --lib, docs/library.md): bench/lib_latency.c
#                     times mlp_run at batch 1 the same way (each image, one untimed call
#                     first; the median call and the mean over the loop), the median of
#                     ROUNDS processes; OpenBLAS single-threaded with the core PyTorch uses,
#                     GOMP_SPINCOUNT=10000 as Kiln's programs set it, denormals flushed.
#                     floor: the median time of one OpenBLAS sasum over the bound fp32 weights
#                     (1 thread): every batch-1 forward reads each weight once, so no fp32
#                     program does an image in less (the 0.1x PyTorch target is below it).
#   first result      wall time from starting the process to its exit after writing the
#                     first image's logits to .npy, the median of ROUNDS x 4 runs: Kiln's
#                     program with its weights embedded (kiln build --infer --embed-weights),
#                     the same with --weights FILE, and PyTorch (python3 starting, import
#                     torch, the model, load_state_dict, one forward, np.save).
# PyTorch runs with OMP_WAIT_POLICY=passive and OPENBLAS_CORETYPE as bench/run.sh sets them;
# Kiln's program chooses its own settings (docs/training.md). Writes the figures to
# bench/results/infer-YYYY-MM-DD-COMMIT.txt; work files in out/bench-infer/. Speed is
# measured, never asserted in tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
$PY -c "import torch, numpy" 2>/dev/null || { echo "bench/infer.sh: needs PyTorch and NumPy (apt-get install python3-torch)" >&2; exit 1; }
rounds=${BENCH_ROUNDS:-5}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench/infer.sh: BENCH_ROUNDS=$rounds: give a whole number of rounds, at least 1" >&2; exit 2; }
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt kiln_infer_main >/dev/null
work=out/bench-infer
mkdir -p "$work" bench/results
dirty=$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')
torch_env=(env OMP_WAIT_POLICY=passive)
if grep -qw avx512f /proc/cpuinfo; then torch_env+=(OPENBLAS_CORETYPE=SkylakeX)
elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then torch_env+=(OPENBLAS_CORETYPE=Haswell); fi
kiln_env=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OPENBLAS_CORETYPE -u OPENBLAS_NUM_THREADS)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

echo "== weights and images (PyTorch)" >&2
"${torch_env[@]}" $PY tests/infer/torch_ref.py mlp "$work" 10000
$PY -c "import numpy as np, sys; np.save(sys.argv[2], np.load(sys.argv[1])[:1])" "$work/images.npy" "$work/one.npy"
echo "== kiln build --infer" >&2
t0=$EPOCHREALTIME
out/build-bench/kiln build models/mlp.kiln --infer -o "$work/mlp" 2>/dev/null
build_s=$(awk "BEGIN { printf \"%.2f\", $EPOCHREALTIME - $t0 }")
out/build-bench/kiln build models/mlp.kiln --infer --embed-weights "$work/mlp.safetensors" -o "$work/mlp-embedded" 2>/dev/null
echo "== kiln build --lib" >&2
out/build-bench/kiln build models/mlp.kiln --lib -o "$work/mlp-lib" 2>/dev/null
cc -O2 -std=c11 -I "$work/mlp-lib" bench/lib_latency.c "$work/mlp-lib/libmlp.a" -lopenblas -fopenmp -lm -o "$work/lib_latency"
lib_env=(env -u OMP_WAIT_POLICY "${torch_env[@]:2}" OPENBLAS_NUM_THREADS=1 GOMP_SPINCOUNT=10000)

# wall seconds of one run of a command, its output discarded
wall() { local t=$EPOCHREALTIME; "$@" >/dev/null; awk "BEGIN { printf \"%.6f\", $EPOCHREALTIME - $t }"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# batch-1 figures at T threads: sets kiln_us, t_all, t_one, torch_mean_us, torch_median_us,
# lib_mean_us, lib_median_us
latency() {
  local t=$1 all=() one=() torch_lines=() lib_lines=()
  echo "== batch-1 latency, $t thread(s), $rounds rounds" >&2
  for r in $(seq "$rounds"); do
    all+=("$(wall "${kiln_env[@]}" "$work/mlp" --weights "$work/mlp.safetensors" --data image="$work/images.npy" --batch 1 --threads "$t" --quiet)")
    one+=("$(wall "${kiln_env[@]}" "$work/mlp" --weights "$work/mlp.safetensors" --data image="$work/one.npy" --batch 1 --threads "$t" --quiet)")
    torch_lines+=("$("${torch_env[@]}" $PY bench/infer_torch.py latency "$work/mlp.safetensors" "$work/images.npy" --threads "$t" | sed -n 's/^bench: //p')")
    lib_lines+=("$("${lib_env[@]}" "$work/lib_latency" "$work/mlp.safetensors" "$work/images.npy" "$t" | sed -n 's/^bench: //p')")
  done
  lib_median_us=$(printf '%s\n' "${lib_lines[@]}" | $PY -c 'import json, sys, statistics; print("%.1f" % statistics.median(json.loads(l)["median_us"] for l in sys.stdin))')
  lib_mean_us=$(printf '%s\n' "${lib_lines[@]}" | $PY -c 'import json, sys, statistics; print("%.1f" % statistics.median(json.loads(l)["mean_us"] for l in sys.stdin))')
  floor_us=$(printf '%s\n' "${lib_lines[@]}" | $PY -c 'import json, sys, statistics; print("%.1f" % statistics.median(json.loads(l)["floor_us"] for l in sys.stdin))')
  t_all=$(printf '%s\n' "${all[@]}" | median)
  t_one=$(printf '%s\n' "${one[@]}" | median)
  kiln_us=$(awk "BEGIN { printf \"%.1f\", ($t_all - $t_one) / 9999 * 1e6 }")
  torch_median_us=$(printf '%s\n' "${torch_lines[@]}" | $PY -c 'import json, sys, statistics; print("%.1f" % (1e3 * statistics.median(json.loads(l)["median_ms"] for l in sys.stdin)))')
  torch_mean_us=$(printf '%s\n' "${torch_lines[@]}" | $PY -c 'import json, sys, statistics; print("%.1f" % (1e3 * statistics.median(json.loads(l)["mean_ms"] for l in sys.stdin)))')
}
latency 1
line1="mlp, batch 1, 1 thread, per image (us)   Kiln $kiln_us   PyTorch eager $torch_mean_us (mean), $torch_median_us (median call)"
line1c="  Kiln library (mlp_run): $lib_mean_us (mean), $lib_median_us (median call); reading the fp32 weights once: $floor_us"
line1b="  Kiln: 10,000 images $(awk "BEGIN { printf \"%.1f\", $t_all * 1e3 }") ms, 1 image $(awk "BEGIN { printf \"%.1f\", $t_one * 1e3 }") ms (median runs)"
latency 2

echo "== start to first result, $((rounds * 4)) runs each" >&2
emb=() file=() pt=()
for r in $(seq $((rounds * 4))); do
  emb+=("$(wall "${kiln_env[@]}" "$work/mlp-embedded" --data image="$work/one.npy" --threads 2 --quiet --output "$work/e.npy")")
  file+=("$(wall "${kiln_env[@]}" "$work/mlp" --weights "$work/mlp.safetensors" --data image="$work/one.npy" --threads 2 --quiet --output "$work/f.npy")")
  pt+=("$(wall "${torch_env[@]}" $PY bench/infer_torch.py first "$work/mlp.safetensors" "$work/one.npy" "$work/p.npy")")
done
ms() { printf '%s\n' "$@" | median | awk '{ printf "%.1f", $1 * 1e3 }'; }
agree=$($PY -c "import numpy as np, sys; a, b, c = (np.load(f) for f in sys.argv[1:]); print('%.2g' % max(abs(a - c).max(), abs(b - c).max()))" "$work/e.npy" "$work/f.npy" "$work/p.npy")

result="bench/results/infer-$(date +%F)-$(git rev-parse --short HEAD 2>/dev/null || echo nogit)${dirty:+-dirty}.txt"
{
  echo "# bench/infer.sh, $(date -u '+%F %H:%M UTC'), kiln $(git rev-parse --short HEAD)$dirty"
  echo "# $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores; load average $load_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
  echo "# PyTorch $($PY -c 'import torch; print(torch.__version__)'), Kiln: 1 and 2 threads each (--threads, torch.set_num_threads); $rounds rounds"
  echo
  echo "mlp, batch 1, 2 threads, per image (us)  Kiln $kiln_us   PyTorch eager $torch_mean_us (mean), $torch_median_us (median call)"
  echo "  Kiln: 10,000 images $(awk "BEGIN { printf \"%.1f\", $t_all * 1e3 }") ms, 1 image $(awk "BEGIN { printf \"%.1f\", $t_one * 1e3 }") ms (median runs)"
  echo "  Kiln library (mlp_run): $lib_mean_us (mean), $lib_median_us (median call); reading the fp32 weights once: $floor_us"
  echo "$line1"
  echo "$line1c"
  echo "$line1b"
  echo "start to first result (ms)          Kiln embedded $(ms "${emb[@]}")   Kiln --weights $(ms "${file[@]}")   PyTorch $(ms "${pt[@]}")"
  echo "first logits, largest |Kiln - PyTorch|: $agree"
  echo "kiln build --infer: $build_s s"
} >"$result"
cat "$result"
