#!/usr/bin/env python3
"""PyTorch side of bench/run.sh: the same measurements as a Kiln program's --bench-steps,
for the same model and recipe, printed as the same one-line `bench: {...}` JSON.

    torch_bench.py mlp|cnn|gpt|gpt-sdpa|gpt2|gpt1024|gpt1024-sdpa [--steps N] [--batch B] [--infer-batch NB] [--seq T]
                   [--device cpu|cuda] [--compile] [--precision fp32|bf16]

Models are bench/reference.py's MLP and CNN and bench/reference_gpt.py's GPT (gpt: 4 layers,
4 heads, width 128, bytes; gpt2: GPT-2 small, 12 layers, 12 heads, width 768, vocabulary
50257, context 1024, tied head: 124,439,808 parameters, checked). Optimizer as each model
file's train section: AdamW with weight decay on matrices only (mlp/cnn lr 1e-3, decay
0.01; gpt lr 3e-4, betas 0.9/0.95, decay 0.1, clip 1.0; gpt2 lr 6e-4, betas 0.9/0.95, decay
0.1, clip 1.0); learning-rate schedules are left out (they change the rate, not the work).

Inputs are random, in memory before timing (images: bytes; labels: 10 classes; tokens:
the vocabulary), so no data loading is timed. A training step is forward, loss, zero_grad,
backward, clipping and the optimizer step, timed alone; `--warmup` untimed steps come
first. Inference is the eval step as Kiln has it: forward in eval mode under no_grad plus
the loss, at batch 1 and at --infer-batch (language models: full-length sequences of --seq
tokens), the median of calls after one untimed call, repeated until 0.5 s (at least 3,
at most 100). train_rss_mb is the peak RSS after the training steps, peak_rss_mb at the
end (resource.getrusage). Threads: --threads (2); run.sh sets OMP_WAIT_POLICY=passive and
OPENBLAS_CORETYPE (SkylakeX or Haswell, by the CPU) for this process; oneDNN (mkldnn) is
left at PyTorch's default.

On a GPU (--device cuda, bench/gpu/run.sh): the model and the inputs live on the GPU, each
timed step and call ends with torch.cuda.synchronize() (Kiln's step reads its loss back,
one synchronisation), float32 throughout (TF32 off for matrix products and convolutions:
Kiln's CUDA target computes in float32), --compile wraps the model in torch.compile (its
compilation happens in the warm-up steps, untimed), and the peak device memory is
reported (torch.cuda.max_memory_allocated). --precision bf16 runs the forward pass and the
loss under torch.autocast(dtype=bfloat16), PyTorch's mixed precision (Kiln's `precision =
bf16`): matrix products on the tensor cores with bf16 operands, fp32 master weights.
"""
import argparse, json, os, resource, statistics, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import CNN, MLP  # noqa: E402
from reference_gpt import GPT  # noqa: E402

# name: (module factory, recipe batch, sequence length (None: images), vocabulary, AdamW settings, clip)
MODELS = {
    "mlp": (MLP, 128, None, 10, dict(lr=1e-3, weight_decay=0.01), 0.0),
    "cnn": (CNN, 128, None, 10, dict(lr=1e-3, weight_decay=0.01), 0.0),
    "gpt": (lambda: GPT(), 16, 128, 256, dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1), 1.0),
    "gpt-sdpa": (lambda: GPT(sdpa=True), 16, 128, 256, dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1), 1.0),
    "gpt2": (lambda: GPT(V=50257, T=1024, C=768, L=12, H=12), 4, 64, 50257,
             dict(lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1), 1.0),
    # gpt with a 1024-token context (bench/attention.sh): attention written out, and
    # F.scaled_dot_product_attention
    "gpt1024": (lambda: GPT(T=1024), 4, 1024, 256, dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1), 1.0),
    "gpt1024-sdpa": (lambda: GPT(T=1024, sdpa=True), 4, 1024, 256, dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1), 1.0),
}
GPT2_PARAMS = 124_439_808


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def median_ms(fn):
    """Median milliseconds of fn(): one untimed call, then calls until 0.5 s (3 to 100)."""
    fn()
    times, start = [], time.perf_counter()
    while len(times) < 100 and (len(times) < 3 or time.perf_counter() - start < 0.5):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times), len(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--steps", type=int, default=20, help="timed training steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed training steps first")
    ap.add_argument("--batch", type=int, help="training batch (default: the recipe's)")
    ap.add_argument("--infer-batch", type=int, default=256, help="the large inference batch")
    ap.add_argument("--seq", type=int, help="language models: sequence length (default: gpt 128, gpt2 64)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="bf16: torch.autocast")
    a = ap.parse_args()
    if a.steps < 1:
        ap.error("--steps must be at least 1")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    cuda = a.device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    factory, batch, seq, vocab, adamw, clip = MODELS[a.model]
    batch = a.batch or batch
    seq = a.seq or seq
    model = factory().to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    if a.model == "gpt2" and nparams != GPT2_PARAMS:
        sys.exit(f"torch_bench: GPT-2 small has {nparams:,} parameters, expected {GPT2_PARAMS:,}")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}], **adamw)
    run = torch.compile(model) if a.compile else model
    rows = max(batch, a.infer_batch)
    if seq is None:
        x = torch.randint(0, 256, (rows, 28, 28), dtype=torch.uint8)
        y = torch.randint(0, vocab, (rows,))
    else:
        x = torch.randint(0, vocab, (rows, seq))
        y = torch.randint(0, vocab, (rows, seq))
    x, y = x.to(dev), y.to(dev)

    def loss_of(n):
        with torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            out = run(x[:n])
            return F.cross_entropy(out.reshape(-1, out.shape[-1]), y[:n].reshape(-1))

    model.train()
    times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss = loss_of(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sync()
        if step >= a.warmup:
            times.append(1e3 * (time.perf_counter() - t0))
    train_rss = rss_mb()
    model.eval()
    with torch.no_grad():
        b1, reps1 = median_ms(lambda: (loss_of(1), sync()))
        bb, repsb = median_ms(lambda: (loss_of(a.infer_batch), sync()))
    sizes = {"B": batch} if seq is None else {"T": seq, "B": batch}
    print("bench: " + json.dumps({
        "model": a.model, "framework": "pytorch", "torch": torch.__version__, "params": nparams, "batch": batch,
        "sizes": sizes, "threads": torch.get_num_threads(), "mkldnn": torch.backends.mkldnn.is_available(),
        "env": {k: os.environ.get(k, "") for k in ("OMP_WAIT_POLICY", "OPENBLAS_CORETYPE")},
        "warmup_steps": a.warmup, "train_steps": a.steps,
        "train_step_ms_median": round(statistics.median(times), 4), "train_step_ms_min": round(min(times), 4),
        "infer_b1_ms": round(b1, 4), "infer_b1_repeats": reps1,
        "infer_b256_batch": a.infer_batch, "infer_b256_ms": round(bb, 4), "infer_b256_repeats": repsb,
        "train_rss_mb": round(train_rss, 1), "peak_rss_mb": round(rss_mb(), 1),
        "device": torch.cuda.get_device_name() if cuda else "cpu", "compile": a.compile, "precision": a.precision,
        "device_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None}), flush=True)


if __name__ == "__main__":
    main()
