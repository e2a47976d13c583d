#!/usr/bin/env bash
# bench/gpu/bundle.sh — prepares out/gpu/, everything a GPU machine needs to run
# bench/gpu/run.sh without building anything there (this project's GPU machines have the
# CUDA toolkit and PyTorch but not OpenBLAS, Criterion or the datasets; a session gets one
# rarely and for minutes, so the work is done here and the machine only runs and measures).
#
#   bench/gpu/bundle.sh            (about 3 minutes on 2 cores; needs the CUDA toolkit's
#                                  NVRTC and libraries here, not nvcc)
#
# out/gpu/ holds (about 85 MB), packed at the end into out/gpu.tar.gz (about 45 MB: the device
# tool carries 64 MiB with the working tree; name "out/gpu.tar.gz" in `carry`, and run.sh
# unpacks it there):
#   bin/       --target cuda programs: mlp, cnn and gpt at CI's sizes (tests/test_cuda_train.c:
#              mlp batch 32, cnn batch 8, gpt T 32 batch 2), gpt at its recipe's 16 x 128,
#              gpt2-124m at 16 x 1024 (a copy of the model file with batch = 16)
#   ref/       the C programs' logs for the same runs (the reference the GPU runs are
#              checked against, as test_cuda_train checks cuda-emu) and, for the short
#              runs, their halfway checkpoints (resumed by the GPU program: the
#              cross-target check)
#   data/      Fashion-MNIST's test set (the training data of these short runs, 4.4 MB)
#              and the fortunes text gpt trains on
#   lib/       libgomp and libomp (the runtime's OpenMP), in case the machine's image lacks them
#   ptxas.txt  ptxas's summary for every model (kiln build --target cuda --report: NVRTC's)
# BUNDLE_TARGET=cuda-emu builds the programs for the CUDA emulator instead, to try
# bench/gpu/run.sh here (GPU_RUNS="mlp cnn gpt" bench/gpu/run.sh check) before a GPU session.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/deps.sh
cmake -S . -B out/build-gpu -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF >/dev/null
cmake --build out/build-gpu -j"$(nproc)" --target kiln kiln_rt >/dev/null
kiln=out/build-gpu/kiln
B=out/gpu
rm -rf "$B"
mkdir -p "$B/bin" "$B/ref" "$B/data" "$B/lib" "$B/models"
cp /usr/share/datasets/fashion-mnist/t10k-* "$B/data/"
mkdir -p "$B/data/fortunes"
for f in /usr/share/games/fortunes/*; do # the recipe's text: exclude = "*.*"
    case ${f##*/} in *.*) ;; *) cp "$f" "$B/data/fortunes/" ;; esac
done
cp "$(gcc -print-file-name=libgomp.so.1)" "$B/lib/"

# The runs: name, model file, build flags, run flags, steps, and the losses' relative
# tolerance against the C program's (1e-4 unless given: mixed precision's values on either
# side of a rounding boundary round one half-precision step apart, test_cuda_train's 3e-5
# under the emulator). fp16's 20 steps of mlp take 1e-2: a sum in another order (the GPU's
# products, or the CUDA target's column sums, which walk each column in row order where the
# C target adds rows into lanes) flips a few fp16 roundings, and the training amplifies them,
# from 5e-6 at step 4 to 3.1e-3 at step 19 under the emulator; an error would be far larger.
# Data from out/gpu/data, so that the same flags work here and there ($D is replaced by the
# data folder).
mnist='--data image=$D/t10k-images-idx3-ubyte.gz --data label=$D/t10k-labels-idx1-ubyte.gz --eval-data image=$D/t10k-images-idx3-ubyte.gz --eval-data label=$D/t10k-labels-idx1-ubyte.gz'
cat >"$B/runs.txt" <<RUNS
mlp|models/mlp.kiln||$mnist --batch 32 --eval-batches 2|20
mlp-long|models/mlp.kiln||$mnist --batch 128 --eval-batches 10|300
cnn|models/cnn.kiln||$mnist --batch 8 --eval-batches 1|5
cnn-long|models/cnn.kiln||$mnist --batch 128 --eval-batches 10|100
gpt|models/gpt.kiln|--bound T=32|--data '\$D/fortunes/*' --batch 2 --eval-batches 1 --sample-tokens 0|5
gpt-long|models/gpt.kiln||--data '\$D/fortunes/*' --eval-batches 4 --sample-tokens 0|100
gpt-bf16|models/gpt.kiln|--bound T=32 --precision bf16|--data '\$D/fortunes/*' --batch 2 --eval-batches 1 --sample-tokens 0|5|1e-3
mlp-fp16|models/mlp.kiln|--precision fp16|$mnist --batch 32 --eval-batches 2|20|1e-2
RUNS
here=$(pwd)
while IFS='|' read -r name model bflags rflags steps tol; do
    [ -n "$name" ] || continue
    mkdir -p "$B/ref/$name"
    # shellcheck disable=SC2086
    $kiln build "$model" $bflags -o "$B/bin/$name-c" 2>/dev/null
    # shellcheck disable=SC2086
    $kiln build "$model" $bflags --target "${BUNDLE_TARGET:-cuda}" -o "$B/bin/$name" 2>/dev/null
    flags=${rflags//\$D/$here/$B/data}
    half=$((steps / 2))
    (cd "$B/ref/$name" && eval "../../bin/$name-c $flags --steps $steps --checkpoint-dir ck --log c.log" >/dev/null)
    # the halfway checkpoint for the cross-target check: CI's short runs only (size)
    case $name in *-long) ;; *) (cd "$B/ref/$name" && eval "../../bin/$name-c $flags --steps $half --checkpoint-dir ck-half" >/dev/null) ;; esac
    rm -rf "$B/ref/$name/ck"
    rm -f "$B/bin/$name-c"
    echo "bundled $name: $(wc -l <"$B/ref/$name/c.log") log lines"
done <"$B/runs.txt"

# the OpenMP runtime the programs link (libomp, from the Clang inside kiln), in case the
# machine's image lacks it
omp=$(ldd "$B/bin/mlp" | awk '/libomp|libgomp/ { print $3 }' | head -1)
[ -z "$omp" ] || cp "$omp" "$B/lib/"

# The benchmark programs (--bench-steps: random inputs, no data)
$kiln build models/gpt.kiln --target "${BUNDLE_TARGET:-cuda}" -o "$B/bin/bench-gpt" >/dev/null
sed 's/^\( *batch *= *\)4$/\116/' models/gpt2-124m.kiln >"$B/models/gpt2-124m-b16.kiln"
grep -q 'batch *= *16$' "$B/models/gpt2-124m-b16.kiln" || { echo "bench/gpu/bundle.sh: models/gpt2-124m.kiln's batch line changed" >&2; exit 1; }
$kiln build "$B/models/gpt2-124m-b16.kiln" --target "${BUNDLE_TARGET:-cuda}" -o "$B/bin/bench-gpt2" >/dev/null
$kiln build "$B/models/gpt2-124m-b16.kiln" --precision bf16 --target "${BUNDLE_TARGET:-cuda}" -o "$B/bin/bench-gpt2-bf16" >/dev/null

# ptxas's register and spill report for every model (NVRTC's, for sm_90)
for m in mlp cnn gpt gpt2-124m; do
    $kiln build "models/$m.kiln" --target cuda --report -o out/gpu-report-prog 2>&1 |
        awk -v m="$m" '/^  [A-Za-z_]/ && NF == 9 && $1 != "kernel" { n++; r = $(NF - 3); if (r + 0 > max) max = r + 0; if ($(NF - 2) + 0 > 0) spill++ }
                       END { printf "%s: %d kernels, at most %d registers (sm_90), %d spilling\n", m, n, max, spill }'
done >"$B/ptxas.txt"
rm -f out/gpu-report-prog
cat "$B/ptxas.txt"
git rev-parse --short HEAD >"$B/commit.txt"
du -sh "$B"
tar -C out -czf out/gpu.tar.gz gpu
packed=$(stat -c %s out/gpu.tar.gz)
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
echo "out/gpu.tar.gz: $((packed >> 20)) MiB, with the working tree's $((tree >> 20)) MiB (the device tool carries 64 MiB in all)"
[ $((packed + tree)) -lt $((62 << 20)) ] || { echo "bench/gpu/bundle.sh: out/gpu.tar.gz is too large to carry" >&2; exit 1; }
