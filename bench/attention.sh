#!/usr/bin/env bash
# bench/attention.sh — fused attention in a whole training step (issue 38): gpt with a
# 1024-token context (models/gpt.kiln with block = 1024; bench only) at batch 4, Kiln's
# program with attention fused (the default) and with --attention unfused, beside PyTorch
# eager with the attention written out and with F.scaled_dot_product_attention
# (bench/torch_bench.py gpt1024, gpt1024-sdpa), in this one run, 2 threads each: the median
# training step and the peak RSS; then gpt itself (T = 128) at its recipe's batch 16, fused
# and unfused, beside PyTorch eager (written out and SDPA). With JAX=1 both sizes are also
# run in JAX/XLA (bench/jax_bench.py: the step one jax.jit, attention written out and
# jax.nn.dot_product_attention), from a virtual environment the script makes
# (out/venv-jax, jax from PyPI). Kiln's programs are built for the batch they run
# (--bound B=...), so that their arenas are planned for it.
#
#   bench/attention.sh            (a few minutes on 2 cores; STEPS=N timed steps, default 10)
#   JAX=1 bench/attention.sh      (JAX too)
#
# Targets (issue 38): the 1024-context step <= 0.6x PyTorch's SDPA eager step, and a peak
# RSS below PyTorch's; gpt's step <= 0.6x the fastest peer's. Results:
# bench/results/attention-YYYY-MM-DD-COMMIT.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
$PY -c "import torch" 2>/dev/null || { echo "bench/attention.sh: needs PyTorch (apt-get install python3-torch)" >&2; exit 1; }
steps=${STEPS:-10}
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench/attention.sh: STEPS=$steps: give a whole number of steps, at least 1" >&2; exit 2; }
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt kiln_infer_main kiln_train_main kiln_train_bench >/dev/null
jax_py=
if [ "${JAX:-0}" = 1 ]; then
  [ -x out/venv-jax/bin/python ] || { $PY -m venv out/venv-jax && out/venv-jax/bin/pip install -q --disable-pip-version-check "jax==0.10.2"; }
  jax_py=out/venv-jax/bin/python
fi
work=out/bench-attention
rm -rf "$work"
mkdir -p "$work" bench/results
dirty=$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')
torch_env=(env OMP_WAIT_POLICY=passive)
kiln_env=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OPENBLAS_CORETYPE -u OPENBLAS_NUM_THREADS)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
sed 's/^const block = 128 /const block = 1024/' models/gpt.kiln > "$work/gpt1024.kiln"
grep -q '^const block = 1024' "$work/gpt1024.kiln" || { echo "bench/attention.sh: models/gpt.kiln has no 'const block = 128' line to change" >&2; exit 1; }

field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p"; }
# Kiln: "step_ms rss_mb" of model file $1 built with flags $2 at T = $3, batch $4
kiln_bench() {
  local model=$1 flags=$2 t=$3 batch=$4 name
  name=$work/$(basename "$model" .kiln)$(echo "$flags" | tr -c 'a-z0-9' '-')b$batch
  # shellcheck disable=SC2086
  out/build-bench/kiln build "$model" --bound B="$batch" $flags -o "$name" >/dev/null 2>&1
  local line
  line=$("${kiln_env[@]}" "$name" --bench-steps "$steps" --batch "$batch" --threads 2 2>/dev/null | grep '^bench:')
  echo "$(echo "$line" | field train_step_ms_median) $(echo "$line" | field train_rss_mb) $t"
}
# PyTorch: "step_ms rss_mb" of torch_bench.py's model $1 at batch $2
torch_bench() {
  local line
  line=$("${torch_env[@]}" $PY bench/torch_bench.py "$1" --steps "$steps" --batch "$2" --threads 2 --infer-batch 4 | grep '^bench:')
  echo "$(echo "$line" | field train_step_ms_median) $(echo "$line" | field train_rss_mb)"
}
# JAX: "step_ms rss_mb" at T $1, batch $2, flags $3
jax_bench() {
  local line
  # shellcheck disable=SC2086
  line=$($jax_py bench/jax_bench.py --seq "$1" --batch "$2" --steps "$steps" $3 | grep '^bench:')
  echo "$(echo "$line" | field train_step_ms_median) $(echo "$line" | field train_rss_mb)"
}
row() { printf "%-44s %10s %10s %11.2fx\n" "$1" "$2" "$3" "$(echo "$2 / $4" | bc -l)"; }

report=$(mktemp)
{
  echo "bench/attention.sh — $(date -u +%F) $(git rev-parse --short HEAD)$dirty"
  echo "training step (median of $steps after 2 warm-up) and peak RSS after the steps, batch 4, 2 threads each"
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load average at the start $load_start"
  echo "PyTorch $($PY -c 'import torch; print(torch.__version__)')$($PY -c 'import torch.nn.functional as F; print("" if hasattr(F, "scaled_dot_product_attention") else ": no F.scaled_dot_product_attention (2.0 on), SDPA is its private _scaled_dot_product_attention")')"
  echo
  [ -n "$jax_py" ] && echo "JAX $($jax_py -c 'import jax; print(jax.__version__)') (jaxlib, XLA's CPU backend), the whole step one jax.jit"
  echo
  printf "%-44s %10s %10s %12s\n" "" "step ms" "RSS MB" "step vs SDPA"
  echo "== gpt, T 1024" >&2
  read -r ts tr < <(torch_bench gpt1024-sdpa 4)
  read -r tm tmr < <(torch_bench gpt1024 4)
  read -r kf kfr _ < <(kiln_bench "$work/gpt1024.kiln" "" 1024 4)
  read -r ku kur _ < <(kiln_bench "$work/gpt1024.kiln" "--attention unfused" 1024 4)
  row "gpt T 1024: PyTorch eager, SDPA" "$ts" "$tr" "$ts"
  row "gpt T 1024: PyTorch eager, written out" "$tm" "$tmr" "$ts"
  if [ -n "$jax_py" ]; then
    read -r js jsr < <(jax_bench 1024 4 --sdpa)
    read -r jm jmr < <(jax_bench 1024 4 "")
    row "gpt T 1024: JAX jit, dot_product_attention" "$js" "$jsr" "$ts"
    row "gpt T 1024: JAX jit, written out" "$jm" "$jmr" "$ts"
  fi
  row "gpt T 1024: Kiln, attention fused" "$kf" "$kfr" "$ts"
  row "gpt T 1024: Kiln, --attention unfused" "$ku" "$kur" "$ts"
  echo
  printf "%-44s %10s %10s %12s\n" "batch 16 (the recipe's)" "step ms" "RSS MB" "vs fastest"
  echo "== gpt, T 128" >&2
  read -r s1 s1r < <(torch_bench gpt-sdpa 16)
  read -r s2 s2r < <(torch_bench gpt 16)
  peers=("PyTorch eager, SDPA|$s1|$s1r" "PyTorch eager, written out|$s2|$s2r")
  if [ -n "$jax_py" ]; then
    read -r s3 s3r < <(jax_bench 128 16 --sdpa)
    read -r s4 s4r < <(jax_bench 128 16 "")
    peers+=("JAX jit, dot_product_attention|$s3|$s3r" "JAX jit, written out|$s4|$s4r")
  fi
  read -r g1 g1r _ < <(kiln_bench models/gpt.kiln "" 128 16)
  read -r g2 g2r _ < <(kiln_bench models/gpt.kiln "--attention unfused" 128 16)
  fastest=$(for p in "${peers[@]}"; do echo "$p" | cut -d'|' -f2; done | sort -g | head -1)
  for p in "${peers[@]}"; do IFS='|' read -r n t r <<< "$p"; row "gpt T 128: $n" "$t" "$r" "$fastest"; done
  row "gpt T 128: Kiln, attention fused" "$g1" "$g1r" "$fastest"
  row "gpt T 128: Kiln, --attention unfused" "$g2" "$g2r" "$fastest"
  echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$report"
out=bench/results/attention-$(date -u +%F)-$(git rev-parse --short HEAD)${dirty:+-dirty}.txt
cp "$report" "$out"
rm -f "$report"
cat "$out"
echo "written to $out" >&2
