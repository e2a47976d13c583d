#!/usr/bin/env python3
"""torch_llama.py VALUES.json REFERENCE.py — models/llama.kiln (Kiln's values, written by
tests/test_parity.c) against its PyTorch twin (bench/reference_llama.py's Llama): Kiln's
weights loaded with load_state_dict(strict=True), the same batch; compares in float32 the
loss, every gradient, the global gradient norm, and the loss after one step of the model's
recipe (clip_grad_norm_ 1.0, then AdamW as reference_llama.optimizer builds it). A value
matches when max|kiln - torch| <= 1e-5 * max|torch| (+ 1e-7). Exits 77 when PyTorch is
absent."""
import importlib.util
import json
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIP: PyTorch is not installed (Debian: apt-get install python3-torch)")
    sys.exit(77)

RTOL = 1e-5


def compare(what, kiln, ref):
    kiln = torch.as_tensor(kiln, dtype=torch.float64).reshape(ref.shape)
    ref = ref.detach().to(torch.float64)
    err = (kiln - ref).abs().max().item()
    scale = ref.abs().max().item()
    ok = err <= RTOL * scale + 1e-7
    if not ok:
        print(f"FAIL llama: {what}: differs by {err:.3g} (largest element {scale:.3g}, allowed {RTOL * scale + 1e-7:.3g})")
    return ok


def main():
    with open(sys.argv[1]) as f:
        case = json.load(f)
    spec = importlib.util.spec_from_file_location("reference_llama", sys.argv[2])
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    torch.manual_seed(0)
    model = ref.Llama()
    state = {p["name"]: torch.tensor(p["data"], dtype=torch.float64).reshape(p["shape"]).float() for p in case["params"]}
    model.load_state_dict(state, strict=True)
    inputs = {t["name"]: torch.tensor(t["data"], dtype=torch.float64).reshape(t["shape"]).long() for t in case["inputs"]}

    def loss_of():
        logits = model(inputs["idx"])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), inputs["targets"].reshape(-1))
    loss = loss_of()
    opt = ref.optimizer(model)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    ok = compare("loss", [case["loss"]], loss.reshape(1))
    named = dict(model.named_parameters())
    for g in case["grads"]:
        ok &= compare(f"gradient of {g['name']}", g["data"], named[g["name"]].grad)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    ok &= compare("gradient norm", [case["grad_norm"]], norm.reshape(1))
    opt.step()
    with torch.no_grad():
        after = loss_of()
    ok &= compare("loss after one step", [case["loss_after_step"]], after.reshape(1))
    print(f"PyTorch {torch.__version__}: llama: loss {loss.item():.6f} (Kiln {case['loss']:.6f}), after one step "
          f"{after.item():.6f} (Kiln {case['loss_after_step']:.6f}), {len(case['grads'])} gradients: "
          f"{'all match' if ok else 'MISMATCH'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
