#!/usr/bin/env bash
# bench/cuda_build.sh — `kiln build --target cuda`: the kernels by NVRTC in kiln's process
# and the host code by the Clang inside kiln (the default), side by side with the same
# build by nvcc (--nvcc), in one run (issue 37: gpt and gpt2-124m at most 0.4x nvcc's wall
# time; a rebuild after a recipe-only change compiles no kernel).
#
#   bench/cuda_build.sh                     models gpt gpt2-124m, 3 rounds each
#   MODELS="mlp gpt" ROUNDS=1 bench/cuda_build.sh
#   KILN=out/build-bench/kiln bench/cuda_build.sh
#
# Every NVRTC build but the warm one starts from an empty cache (a fresh XDG_CACHE_HOME):
# "cold" is what a first build pays. "warm, lr changed" builds a copy of the model whose
# optimizer's lr differs (the recipe only) after a cold build of the original, and prints
# how many NVRTC pieces it compiled (kiln build --report's line: "N pieces of M from the
# cache"). The median of the rounds is printed; nvcc runs once per round too.
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=${KILN:-build/kiln}
models=${MODELS:-gpt gpt2-124m}
rounds=${ROUNDS:-3}
work=out/bench-cuda-build
rm -rf "$work"
mkdir -p "$work"
# nvcc is only for the side-by-side build: the default finds no nvcc on PATH
nonvcc=$(echo "$PATH" | tr ':' '\n' | while read -r d; do [ -x "$d/nvcc" ] || echo "$d"; done | paste -sd:)
echo "# bench/cuda_build.sh, $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); $("$kiln" --version 2>&1 | head -1)"
printf '%-10s %12s %12s %8s %16s %18s\n' model "nvrtc (s)" "nvcc (s)" ratio "warm, lr (s)" "pieces compiled"

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
secs() { # command... : its wall seconds
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log" >&2; exit 1; }
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}

for m in $models; do
    f=models/$m.kiln
    lr=$work/$m-lr.kiln # the recipe's lr changed: nothing else
    sed -E '0,/lr *= *[0-9.e-]+/s//lr = 0.000123/' "$f" >"$lr"
    cmp -s "$f" "$lr" && { echo "bench/cuda_build.sh: $f has no lr to change" >&2; exit 1; }
    : >"$work/$m.nvrtc"
    : >"$work/$m.nvcc"
    : >"$work/$m.warm"
    for r in $(seq "$rounds"); do
        rm -rf "$work/cache"
        XDG_CACHE_HOME=$PWD/$work/cache PATH=$nonvcc secs "$kiln" build "$f" --target cuda -o "$work/$m-prog" >>"$work/$m.nvrtc"
        XDG_CACHE_HOME=$PWD/$work/cache PATH=$nonvcc secs "$kiln" build "$lr" --target cuda --report -o "$work/$m-prog" >>"$work/$m.warm"
        compiled=$(grep -o '[0-9]* pieces\? of [0-9]* from the cache' "$work/last.log" | awk '{ print $4 - $1 " of " $4 }')
        secs "$kiln" build "$f" --target cuda --nvcc -o "$work/$m-nvcc" >>"$work/$m.nvcc"
    done
    a=$(median <"$work/$m.nvrtc")
    b=$(median <"$work/$m.nvcc")
    w=$(median <"$work/$m.warm")
    printf '%-10s %12.2f %12.2f %8.2f %16.2f %18s\n' "$m" "$a" "$b" "$(echo "$a / $b" | bc -l)" "$w" "$compiled"
done
