#!/usr/bin/env bash
# bench/generate.sh — text generation by gpt's inference program (--generate: the decode
# step and its key/value cache; --generate-full: the whole window for each token) against
# PyTorch loops with and without a key/value cache (bench/generate_torch.py) on the same
# weights, in this one run on this machine, 2 threads each, and 1 (on a busy 2-core machine
# a second thread that is not scheduled makes every parallel kernel wait for it).
#
#   bench/generate.sh          (about a minute on 2 cores)
#
# Weights: models/gpt.kiln trained 20 steps on the first 40 kB of Debian's `computers`
# fortunes (speed does not depend on them). Prompt: the corpus's first 16 bytes. Two
# lengths: 200 tokens (the issue's figure: 16 + 200 > the context of 128, so the last 88
# tokens recompute the sliding window, as every loop here does) and 112 (16 + 112 = 128:
# all within the context, the cache's own speed). Figures: tokens per second after the
# first token (the prompt's time is not in them), the median of ROUNDS runs (default 5):
# Kiln's from the line its program prints on stderr, PyTorch's timed the same way.
# Sampling: temperature 0.8, top-k 40 on both sides. Greedy decoding is also run on both:
# the texts must be the same bytes (a check that the two compute the same model).
# Then llama (models/llama.kiln, which writes its own attention: rotary embeddings, grouped-
# query heads) trained the same way, its cache against its own full recomputation (issue 38:
# recognised attention gives it the cache; the target is >= 3x).
# Results: bench/results/generate-YYYY-MM-DD-COMMIT.txt; work files in out/bench-generate/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
$PY -c "import torch, numpy" 2>/dev/null || { echo "bench/generate.sh: needs PyTorch and NumPy (apt-get install python3-torch)" >&2; exit 1; }
rounds=${BENCH_ROUNDS:-5}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench/generate.sh: BENCH_ROUNDS=$rounds: give a whole number of rounds, at least 1" >&2; exit 2; }
cmake -S . -B out/build-bench -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-bench -j"$(nproc)" --target kiln kiln_rt kiln_infer_main kiln_train_main kiln_train_bench >/dev/null
work=out/bench-generate
rm -rf "$work"
mkdir -p "$work" bench/results
dirty=$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')
torch_env=(env OMP_WAIT_POLICY=passive)
kiln_env=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OPENBLAS_CORETYPE -u OPENBLAS_NUM_THREADS)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

echo "== weights" >&2
out/build-bench/kiln build models/gpt.kiln -o "$work/gpt" 2>/dev/null
out/build-bench/kiln build models/gpt.kiln --infer -o "$work/gpt-infer" 2>/dev/null
head -c 40000 /usr/share/games/fortunes/computers > "$work/corpus.txt"
"${kiln_env[@]}" "$work/gpt" --data "$work/corpus.txt" --steps 20 --checkpoint-dir "$work/ck" --sample-tokens 0 >/dev/null
weights=$(ls -d "$work"/ck/step-* | tail -1)/model.safetensors
prompt=$(head -c 16 "$work/corpus.txt")
out/build-bench/kiln build models/llama.kiln -o "$work/llama" 2>/dev/null
out/build-bench/kiln build models/llama.kiln --infer -o "$work/llama-infer" 2>/dev/null
"${kiln_env[@]}" "$work/llama" --data "$work/corpus.txt" --steps 20 --checkpoint-dir "$work/ck-llama" --sample-tokens 0 >/dev/null
llama_weights=$(ls -d "$work"/ck-llama/step-* | tail -1)/model.safetensors

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# tokens/s of Kiln's program: the figure before "tokens/s" on its stderr line
kiln_rate() {
  local flag=$1 n=$2 threads=$3 program=${4:-$work/gpt-infer} w=${5:-$weights}
  for r in $(seq "$rounds"); do
    "${kiln_env[@]}" "$program" --weights "$w" "$flag" --prompt "$prompt" --tokens "$n" --seed "$r" \
      --temperature 0.8 --top-k 40 --threads "$threads" 2>&1 >/dev/null | sed -n 's/.*then \([0-9.]*\) tokens\/s.*/\1/p'
  done | median
}

report=$(mktemp)
{
  echo "bench/generate.sh — $(date -u +%F) $(git rev-parse --short HEAD)$dirty"
  echo "gpt (models/gpt.kiln: 4 layers, width 128, context 128), prompt of 16 bytes, the same threads each,"
  echo "tokens/s after the first token, median of $rounds runs; temperature 0.8, top-k 40"
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load average at the start $load_start"
  echo
  printf "%-8s %-8s %12s %12s %12s %12s %9s %9s\n" tokens threads "kiln cache" "kiln full" "torch cache" "torch full" "vs cache" "vs full"
  for n in 200 112; do
    for threads in 2 1; do
      echo "== $n tokens, $threads threads" >&2
      kc=$(kiln_rate --generate "$n" "$threads")
      kf=$(kiln_rate --generate-full "$n" "$threads")
      read -r tc tf < <("${torch_env[@]}" $PY bench/generate_torch.py "$weights" "$prompt" "$n" --threads "$threads" --rounds "$rounds" | awk '{ v[$2] = $3 } END { print v["cached"], v["full"] }')
      printf "%-8s %-8s %12s %12s %12s %12s %8.2fx %8.2fx\n" "$n" "$threads" "$kc" "$kf" "$tc" "$tf" "$(echo "$kc / $tc" | bc -l)" "$(echo "$kc / $tf" | bc -l)"
    done
  done
  echo
  echo "vs cache: Kiln with its cache / PyTorch with its cache; vs full: Kiln with its cache / PyTorch recomputing."
  "${kiln_env[@]}" "$work/gpt-infer" --weights "$weights" --generate --prompt "$prompt" --tokens 200 --temperature 0 2>/dev/null > "$work/kiln-greedy.txt"
  "${torch_env[@]}" $PY bench/generate_torch.py "$weights" "$prompt" 200 --greedy > "$work/torch-greedy.txt"
  if cmp -s "$work/kiln-greedy.txt" "$work/torch-greedy.txt"; then echo "greedy, 200 tokens: Kiln's text is PyTorch's, byte for byte"
  else echo "greedy, 200 tokens: Kiln's text DIFFERS from PyTorch's ($work/kiln-greedy.txt, $work/torch-greedy.txt)"; fi
  echo
  echo "llama (models/llama.kiln: 4 layers, width 128, 4 query heads over 2 key/value heads, context 128), the same prompt"
  printf "%-8s %-8s %12s %12s %9s\n" tokens threads "kiln cache" "kiln full" "cache/full"
  for n in 112 200; do
    for threads in 2 1; do
      echo "== llama $n tokens, $threads threads" >&2
      kc=$(kiln_rate --generate "$n" "$threads" "$work/llama-infer" "$llama_weights")
      kf=$(kiln_rate --generate-full "$n" "$threads" "$work/llama-infer" "$llama_weights")
      printf "%-8s %-8s %12s %12s %8.2fx\n" "$n" "$threads" "$kc" "$kf" "$(echo "$kc / $kf" | bc -l)"
    done
  done
  echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$report"
out=bench/results/generate-$(date -u +%F)-$(git rev-parse --short HEAD)${dirty:+-dirty}.txt
cp "$report" "$out"
rm -f "$report"
cat "$out"
echo "written to $out" >&2
