#!/usr/bin/env bash
# bench/gpu/run.sh — on a machine with an NVIDIA GPU: the CUDA target's checks for real and
# its benchmark against PyTorch, from the programs bench/gpu/bundle.sh built (out/gpu/).
#
#   bench/gpu/run.sh check    the runs of out/gpu/runs.txt on the GPU: losses within 1e-4
#                             (1e-3 for gpt-bf16, 1e-2 for mlp-fp16's 20 steps: bundle.sh)
#                             relative of the C program's (step by step, and the evaluation
#                             loss), a run resumed halfway ends with the same checkpoint bit
#                             for bit, and the C program's halfway checkpoint resumes on the
#                             GPU with the C program's losses (about 2 minutes)
#   bench/gpu/run.sh bench    step time and tokens/s of gpt (16 x 128) and gpt2-124m (16 x 1024)
#                             against PyTorch eager and torch.compile on the same GPU, float32
#                             (TF32 off on both sides), and gpt2-124m in bf16 against PyTorch's
#                             autocast; the fraction of the GPU's peak reached (MFU: float32
#                             rows against the float32 peak, bf16 rows against the dense bf16
#                             tensor-core peak, as llm.c reports it; about 8 minutes)
#   GPU_RUNS="mlp cnn gpt" bench/gpu/run.sh check   only these runs (the emulator's dry run)
#
# Results go to $OUT (the device tool's folder) or out/gpu-results: check.txt, bench.txt,
# and the raw logs. Kiln's programs need libcudart and libcublas(Lt) of CUDA 13: from the
# toolkit, else from PyTorch's nvidia-* packages.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=out/gpu
# bundle.sh's archive (the device tool carries out/gpu.tar.gz, not the 85 MB folder)
if [ ! -d "$B/bin" ] && [ -f out/gpu.tar.gz ]; then
    tar -C out -xzf out/gpu.tar.gz || { echo "bench/gpu/run.sh: out/gpu.tar.gz does not unpack" >&2; exit 1; }
fi
O=${OUT:-out/gpu-results}
mkdir -p "$O"
[ -d "$B/bin" ] || { echo "bench/gpu/run.sh: no $B/bin: run bench/gpu/bundle.sh first (and carry out/gpu)" >&2; exit 1; }
PY=$(command -v python3)
libs="$(pwd)/$B/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && libs="$libs:$d"; done
for d in $("$PY" -c 'import glob, os, site; print(" ".join(sorted({os.path.dirname(p) for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/*/lib/lib*.so.13")})))' 2>/dev/null); do
    libs="$libs:$d"
done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
D="$(pwd)/$B/data"
what=${1:-check}

check() {
    local fails=0 name model bflags rflags steps flags half dir prog
    {
        echo "bench/gpu/run.sh check, commit $(cat $B/commit.txt), $(date -u +%F)"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        cat "$B/ptxas.txt"
    } | tee "$O/check.txt"
    while IFS='|' read -r name model bflags rflags steps tol; do
        [ -n "$name" ] || continue
        tol=${tol:-1e-4}
        # GPU_RUNS="mlp cnn": only these runs
        [ -z "${GPU_RUNS:-}" ] || [[ " $GPU_RUNS " == *" $name "* ]] || continue
        flags=${rflags//\$D/$D}
        half=$((steps / 2))
        dir="$O/$name"
        rm -rf "$dir" && mkdir -p "$dir"
        echo "== $name ($steps steps: $flags)" | tee -a "$O/check.txt"
        prog="$(pwd)/$B/bin/$name"
        (cd "$dir" && eval "'$prog' $flags --steps $steps --checkpoint-dir ck --log gpu.log" >run.txt 2>&1) || { echo "FAILED to run: $(tail -3 "$dir/run.txt")" | tee -a "$O/check.txt"; fails=$((fails + 1)); continue; }
        "$PY" bench/gpu/check.py losses "$B/ref/$name/c.log" "$dir/gpu.log" loss "$tol" | tee -a "$O/check.txt" || fails=$((fails + 1))
        "$PY" bench/gpu/check.py losses "$B/ref/$name/c.log" "$dir/gpu.log" eval_loss "$tol" | tee -a "$O/check.txt" || fails=$((fails + 1))
        # stopped halfway and resumed: the uninterrupted run's checkpoint, bit for bit
        (cd "$dir" && eval "'$prog' $flags --steps $half --checkpoint-dir ck-half" >>run.txt 2>&1 &&
            eval "'$prog' $flags --steps $steps --resume ck-half --checkpoint-dir ck-half --log resumed.log" >>run.txt 2>&1)
        "$PY" bench/gpu/check.py same-ckpt "$dir/ck" "$dir/ck-half" | tee -a "$O/check.txt" || fails=$((fails + 1))
        # the C program's halfway checkpoint, resumed on the GPU
        [ -d "$B/ref/$name/ck-half" ] || continue
        cp -r "$B/ref/$name/ck-half" "$dir/ck-from-c"
        (cd "$dir" && eval "'$prog' $flags --steps $steps --resume ck-from-c --checkpoint-dir ck-from-c --log from-c.log" >>run.txt 2>&1)
        "$PY" bench/gpu/check.py losses "$B/ref/$name/c.log" "$dir/from-c.log" loss "$tol" $((half + 1)) | tee -a "$O/check.txt" || fails=$((fails + 1))
        grep -h "samples/s\|tokens/s" "$dir/run.txt" | tail -1 | tee -a "$O/check.txt"
    done <"$B/runs.txt"
    # the kernels compiled at run time for this GPU (KILN_CUDA_JIT=1: NVRTC, or without it
    # the driver from the embedded PTX), then read from the cache: mlp's losses again
    if [ -z "${GPU_RUNS:-}" ] || [[ " $GPU_RUNS " == *" mlp-jit "* ]]; then
        IFS='|' read -r name model bflags rflags steps tol < <(grep '^mlp|' "$B/runs.txt")
        flags=${rflags//\$D/$D}
        dir="$O/mlp-jit"
        rm -rf "$dir" && mkdir -p "$dir"
        echo "== mlp-jit (KILN_CUDA_JIT=1, twice)" | tee -a "$O/check.txt"
        prog="$(pwd)/$B/bin/mlp"
        cache="$(pwd)/$dir/cache"
        for log in jit.log jit2.log; do
            (cd "$dir" && eval "KILN_CUDA_JIT=1 XDG_CACHE_HOME='$cache' '$prog' $flags --steps $steps --checkpoint-dir ck-$log --log $log" >>run.txt 2>&1) ||
                { echo "FAILED to run: $(tail -3 "$dir/run.txt")" | tee -a "$O/check.txt"; fails=$((fails + 1)); }
            "$PY" bench/gpu/check.py losses "$B/ref/mlp/c.log" "$dir/$log" loss 1e-4 | tee -a "$O/check.txt" || fails=$((fails + 1))
        done
        grep -h "the kernels compiled" "$dir/run.txt" | tee -a "$O/check.txt"
    fi
    echo "check: $fails failed" | tee -a "$O/check.txt"
    return $((fails > 0))
}

bench() {
    local peak peak16
    # the GPU's float32 peak (not TF32, not tensor cores) and its dense bf16 tensor-core peak:
    # H100 SXM 67 and 989 TFLOP/s, H100 PCIe 51 and 756, H200 67 and 989, A100 19.5 and 312
    # (vendor datasheets); MFU is reached FLOP/s over the peak of the row's precision
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in
        *H100*PCIe*) peak=51e12 peak16=756e12 ;; *H100* | *H200*) peak=67e12 peak16=989e12 ;;
        *A100*) peak=19.5e12 peak16=312e12 ;; *) peak=0 peak16=0 ;;
    esac
    {
        echo "bench/gpu/run.sh bench, commit $(cat $B/commit.txt), $(date -u +%F)"
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    } | tee "$O/bench.txt"
    : >"$O/bench-raw.txt"
    local bin
    bin="$(pwd)/$B/bin"
    (cd "$O" && "$bin/bench-gpt" --bench-steps 20 2>&1 | tee bench-gpt.txt | grep '^bench:' >>bench-raw.txt)
    (cd "$O" && "$bin/bench-gpt2" --bench-steps 10 2>&1 | tee bench-gpt2.txt | grep '^bench:' >>bench-raw.txt)
    # bf16 (docs/precision.md): products on the tensor cores with bf16 operands (cublasGemmEx,
    # cuBLASLt with bf16 D where only the half copy is stored), activations kept in bf16
    (cd "$O" && "$bin/bench-gpt2-bf16" --bench-steps 10 2>&1 | tee bench-gpt2-bf16.txt | grep '^bench:' | sed 's/"model": "gpt2-124m[^"]*"/&, "precision": "bf16"/' >>bench-raw.txt)
    for c in "" --compile; do
        "$PY" bench/torch_bench.py gpt --device cuda --steps 20 --warmup 5 --infer-batch 16 $c 2>&1 | grep '^bench:' >>"$O/bench-raw.txt"
        for p in fp32 bf16; do
            "$PY" bench/torch_bench.py gpt2 --device cuda --batch 16 --seq 1024 --steps 10 --warmup 5 --infer-batch 16 --precision $p $c 2>&1 |
                grep '^bench:' >>"$O/bench-raw.txt"
        done
    done
    "$PY" - "$O/bench-raw.txt" "$peak" "$peak16" <<'PYEOF' | tee -a "$O/bench.txt"
import json, sys
rows = [json.loads(l[len("bench: "):]) for l in open(sys.argv[1]) if l.startswith("bench: ")]
peaks = {"fp32": float(sys.argv[2]), "bf16": float(sys.argv[3])}
# GPT shapes: gpt 4 layers, width 128, 4 heads, T 128; gpt2 12 layers, width 768, 12 heads, T 1024
shape = {"gpt": (4, 128, 128), "gpt2": (12, 768, 1024)}
def key(r):
    m = r.get("model", "")
    return "gpt2" if "gpt2" in m else "gpt" if "gpt" in m else m
print(f"{'model':6} {'who':22} {'batch':>5} {'step ms':>9} {'tokens/s':>11} {'MFU':>6}")
for r in rows:
    m = key(r)
    L, C, T = shape[m]
    B = r.get("batch") or r.get("sizes", {}).get("B")
    T = r.get("sizes", {}).get("T", T)
    ms = r["train_step_ms_median"]
    # Kiln's bench line has no parameter count: PyTorch's for the same model (the same one)
    n = r.get("params") or next((q["params"] for q in rows if q.get("params") and key(q) == m), 0)
    flops = (6 * n + 6 * L * C * T) * B * T  # llm.c's count: 6N per token plus attention's 6·L·C·T
    prec = r.get("precision", "fp32")
    who = ("kiln " + prec) if r.get("framework") != "pytorch" else (("pytorch compile " if r.get("compile") else "pytorch eager ") + prec)
    peak = peaks[prec]
    mfu = f"{100 * flops / (ms / 1e3) / peak:.1f}%" if peak else "-"
    print(f"{m:6} {who:22} {B:>5} {ms:>9.2f} {B * T / (ms / 1e3):>11,.0f} {mfu:>6}")
PYEOF
}

case "$what" in
    check) check ;;
    bench) bench ;;
    all) check; bench ;;
    *) echo "usage: bench/gpu/run.sh check|bench|all" >&2; exit 2 ;;
esac
