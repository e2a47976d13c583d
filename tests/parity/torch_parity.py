#!/usr/bin/env python3
"""torch_parity.py CASES.json — Kiln's values (written by tests/test_parity.c) against PyTorch.

For each case: builds the same computation with torch.nn / torch.nn.functional, loads Kiln's
weights with load_state_dict(strict=True) (so parameter names and layouts must be PyTorch's
state_dict keys), and compares in float32: the forward output, the loss, every parameter and
input gradient, buffer updates (BatchNorm's running statistics), and the loss after one
torch.optim.SGD step (lr=0.1). A tensor matches when max|kiln - torch| <= 1e-5 * max|torch|
(+ 1e-7 for tensors that are all but zero). Exits 77 (skipped) when PyTorch is absent."""
import json
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("SKIP: PyTorch is not installed (Debian: apt-get install python3-torch)")
    sys.exit(77)

RTOL = 1e-5


def fn(f):
    """A reference that is a function of the inputs only (no module)."""
    return lambda: (None, lambda m, x: f(**x))


def mod(build, apply=lambda m, x: m(x["x"])):
    return lambda: (build(), apply)


class Members(nn.Module):
    """Named submodules, as a Kiln model's top-level members."""

    def __init__(self, **kw):
        super().__init__()
        for k, v in kw.items():
            setattr(self, k, v)


def sequential_acts():
    L = lambda: nn.Linear(5, 5)
    return Members(net=nn.Sequential(L(), nn.SiLU(), L(), nn.Tanh(), L(), nn.Sigmoid(), L(), nn.LeakyReLU(0.1), L(), nn.ELU(),
                                     L(), nn.Softplus(), L(), nn.Mish(), L(), nn.Hardswish(), L(), nn.GELU(approximate="tanh"),
                                     nn.Flatten(), nn.Identity()))


REFERENCES = {
    "gelu": fn(lambda x: F.gelu(x)),
    "gelu_tanh": fn(lambda x: F.gelu(x, approximate="tanh")),
    "silu": fn(lambda x: F.silu(x)),
    "leaky_relu": fn(lambda x: F.leaky_relu(x, 0.2)),
    "elu": fn(lambda x: F.elu(x, alpha=0.7)),
    "softplus": fn(lambda x: F.softplus(x * 3, beta=2, threshold=3)),
    "mish": fn(lambda x: F.mish(x)),
    "hardswish": fn(lambda x: F.hardswish(x * 4) + F.hardsigmoid(x * 4)),
    "erf_sin_cos": fn(lambda x: torch.erf(x) + torch.sin(x) * torch.cos(x * 2)),
    # torch.div(rounding_mode="floor"): x // 2 has no derivative in PyTorch 1.13 (Kiln's is zero)
    "floor_divide": fn(lambda x: torch.div(x * 5, 2, rounding_mode="floor") + torch.remainder(x * 5, 1.5) + x),
    "tril_triu": fn(lambda x: torch.tril(x, 1) + torch.triu(x, -1) * 2),
    "masked_fill": fn(lambda x: x.masked_fill(x > 0.3, -2.0)),
    "expand_flip_stack": fn(lambda x: torch.stack([x.expand(2, 3, 4), torch.flip(x.expand(2, 3, 4), [1, 2])], dim=1)),
    "methods": fn(lambda x: x.view(x.shape[0], -1).softmax(-1) * x.reshape(3, 5).transpose(0, 1).mean(1).sum() + x.size(1)
                  + x.float().flip(1)),
    "std": fn(lambda x: torch.std(x, 1, keepdim=True) * x + torch.std(x, unbiased=False)),
    "sdpa": fn(lambda x, z: sdpa(x, z, z * 2) + sdpa(x, x, x, is_causal=True, scale=0.3)
               + sdpa(x, z, z, attn_mask=torch.tril(torch.ones(3, 5)) > 0)),
    "cumsum_gather": fn(lambda x, t: torch.cumsum(x, 1) * x + torch.gather(x, 1, t).sum() + torch.cumsum(x, 0)),
    "rotary": fn(lambda x: rotary(x) + rotary(x * 2, base=100)),
    "functional_layers": fn(lambda x, w, z: F.linear(x, w, z).sum() + F.layer_norm(x, [4, 4])
                            + F.layer_norm(x, [4], weight=x[0, 0, 0], bias=x[0, 0, 1]) + F.max_pool2d(x, 2).sum()
                            + F.avg_pool2d(x, 3, stride=1, padding=1)),
    "topk": fn(lambda x: topk_case(x)),
    "functional_pools": fn(lambda x: torch.cat([
        F.max_pool2d(x, (3, 2), stride=(2, 1), padding=1, dilation=(1, 2), ceil_mode=True).flatten(1),
        F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False).flatten(1), F.avg_pool2d(x, (2, 3)).flatten(1)], dim=1)),
    "einsum": fn(lambda x, z: torch.einsum("bij,bjk->bik", x, z) + torch.einsum("bij->bi", x).sum()
                 + torch.einsum("bij,bjk", x, z).sum() * torch.einsum("ijk->kji", x).mean()
                 + torch.einsum("bij, bij -> b", x, x).sum() + torch.einsum("i,j->ij", x[0, 0], z[0, 0]).sum()),
    "interpolate": fn(lambda x: F.interpolate(x, scale_factor=2).sum() + F.interpolate(x, size=(3, 7), mode="bilinear")
                      + F.interpolate(x, size=(3, 7), mode="bilinear", align_corners=True)
                      + F.interpolate(x, scale_factor=(0.75, 1.5)).sum()),
    "cross_entropy_options": fn(lambda x, t: F.cross_entropy(x, t, ignore_index=2, label_smoothing=0.1)
                                + F.cross_entropy(x, t, reduction="sum") * 0.1),
    "cross_entropy_axis1": fn(lambda x, t, w, z, u, c, s: F.cross_entropy(x, t, weight=torch.exp(w).detach(), ignore_index=1,
                                                                        label_smoothing=0.1)
                              + F.cross_entropy(z, u, reduction="sum") * 0.1 + F.nll_loss(F.log_softmax(x, 1), t, reduction="none")
                              + F.nll_loss(F.log_softmax(z, 1), u, weight=torch.exp(w).detach(), ignore_index=0)
                              + F.cross_entropy(c, s) * F.cross_entropy(c.permute(0, 2, 1), s, reduction="none")),
    "cross_entropy_probs": fn(lambda x, p, w, z, q: F.cross_entropy(x, F.softmax(p, -1))
                              + F.cross_entropy(x, F.softmax(p, -1), label_smoothing=0.2, weight=torch.exp(w).detach(),
                                                reduction="sum") * 0.1
                              + F.cross_entropy(z, F.softmax(q, 1), reduction="none")
                              + F.cross_entropy(z.permute(0, 2, 1), F.softmax(q, -1).permute(0, 2, 1), label_smoothing=0.1)),
    # [N, d1, C] inputs with [N, d1] targets: Kiln finds the classes on the last axis, PyTorch wants them on axis 1
    "nll_loss": fn(lambda x, t: F.nll_loss(F.log_softmax(x, -1).permute(0, 2, 1), t)
                   + F.nll_loss(x.permute(0, 2, 1), t, ignore_index=1, reduction="none")),
    "class_weights": fn(lambda x, t, w: F.cross_entropy(x, t, weight=torch.exp(w).detach())
                        + F.nll_loss(F.log_softmax(x, -1), t, weight=torch.exp(w).detach(), ignore_index=1)
                        + F.cross_entropy(x, t, weight=torch.exp(w).detach(), label_smoothing=0.2, reduction="sum")),
    "kl_div": fn(lambda x, z: F.kl_div(F.log_softmax(x, -1), F.softmax(z, -1), reduction="batchmean")
                 + F.kl_div(F.log_softmax(x, -1), F.log_softmax(z, -1), log_target=True)
                 + F.kl_div(F.log_softmax(x, -1), F.relu(z), reduction="none")),
    "regression_losses": fn(lambda x, z: F.l1_loss(x, z) + F.smooth_l1_loss(x * 2, z, beta=0.5)
                            + F.huber_loss(x * 2, z, delta=0.7, reduction="sum") + F.smooth_l1_loss(x, z, reduction="none", beta=0)),
    "bce_with_logits": fn(lambda x, z, w: F.binary_cross_entropy_with_logits(x * 3, torch.sigmoid(z))
                          + F.binary_cross_entropy_with_logits(x, torch.sigmoid(z), pos_weight=torch.exp(w).detach(),
                                                               weight=torch.sigmoid(w).detach(),
                                                               reduction="none")),
    "Sequential": mod(lambda: Members(net=nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3), nn.GELU(),
                                                        nn.Linear(3, 2, bias=False))), lambda m, x: m.net(x["x"])),
    "activation_modules": mod(sequential_acts, lambda m, x: m.net(x["x"] * 3)),
    "Conv1d": mod(lambda: Members(m=nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=1)), lambda m, x: m.m(x["x"])),
    "Conv2d_tuples": mod(lambda: Members(m=nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 0), bias=False)),
                         lambda m, x: m.m(x["x"])),
    "Conv_groups_padding": mod(lambda: Members(a=nn.Conv2d(4, 6, 3, padding="same", groups=2),
                                               b=nn.Conv2d(6, 6, (2, 4), padding="same", groups=6, dilation=(1, 2)),
                                               c=nn.Conv1d(4, 2, 3, padding="valid", groups=2, bias=False)),
                               lambda m, x: torch.cat([m.b(m.a(x["x"])).flatten(1), m.c(x["x"][:, :, 0, :]).flatten(1)], dim=1)),
    "LayerNorm_dims": mod(lambda: Members(m=nn.LayerNorm([3, 4])), lambda m, x: m.m(x["x"])),
    "MultiheadAttention": mod(lambda: Members(m=nn.MultiheadAttention(8, 2, batch_first=True), n=nn.MultiheadAttention(8, 4)),
                              lambda m, x: mha_case(m, x)),
    "Upsample": mod(lambda: Members(a=nn.Upsample(scale_factor=2), b=nn.Upsample(size=(5, 3), mode="bilinear")),
                    lambda m, x: m.a(m.b(x["x"]))),
    "EmbeddingBag": mod(lambda: Members(m=nn.EmbeddingBag(7, 4), n=nn.EmbeddingBag(7, 4, mode="sum"),
                                        o=nn.EmbeddingBag(7, 4, mode="max")),
                        lambda m, x: m.m(x["i"]) + m.n(x["i"]) * m.o(x["i"])),
    "Embedding_padding_idx": mod(lambda: Members(a=nn.Embedding(7, 4, padding_idx=0), b=nn.Embedding(7, 4, padding_idx=-6),
                                                 e=nn.Embedding(5, 4)),
                                 lambda m, x: m.a(x["i"]) + m.b(x["i"]) * m.e(x["i"]) + m.a(x["i"] * 0 + 2)),
    "EmbeddingBag_padding_idx": mod(lambda: Members(m=nn.EmbeddingBag(7, 4, padding_idx=0),
                                                    n=nn.EmbeddingBag(7, 4, mode="sum", padding_idx=1),
                                                    o=nn.EmbeddingBag(7, 4, mode="max", padding_idx=2)),
                                    lambda m, x: m.m(x["i"]) + m.n(x["i"]) * m.o(x["i"]) + m.m(x["i"] * 0)
                                    + m.o(x["i"] * 0 + 2) + m.n(x["i"] * 0 + 1)),
    "ConvTranspose2d": mod(lambda: Members(m=nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1),
                                           n=nn.ConvTranspose2d(3, 2, (2, 3), dilation=2, bias=False)),
                           lambda m, x: m.n(m.m(x["x"]))),
    "pool_options": mod(lambda: Members(a=nn.MaxPool2d((3, 2), stride=(2, 1), padding=1, dilation=(1, 2), ceil_mode=True),
                                        b=nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
                                        c=nn.AvgPool2d((2, 3), ceil_mode=True), d=nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)),
                        lambda m, x: torch.cat([m.a(x["x"]).flatten(1), m.b(x["x"]).flatten(1), m.c(x["x"]).flatten(1),
                                                m.d(x["x"]).flatten(1)], dim=1)),
    "LSTM": mod(lambda: Members(m=nn.LSTM(3, 4, num_layers=2)), lambda m, x: lstm_case(m, x)),
    "GRU": mod(lambda: Members(m=nn.GRU(3, 4, num_layers=2, batch_first=True), n=nn.GRU(3, 2, bias=False)),
               lambda m, x: gru_case(m, x)),
    "LSTM_bidirectional": mod(lambda: Members(m=nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True),
                                              n=nn.LSTM(3, 2, bidirectional=True, bias=False)),
                              lambda m, x: lstm_bidir_case(m, x)),
    "GRU_bidirectional": mod(lambda: Members(m=nn.GRU(3, 4, num_layers=3, bidirectional=True)), lambda m, x: gru_bidir_case(m, x)),
    "BatchNorm1d": mod(lambda: Members(m=nn.BatchNorm1d(4)), lambda m, x: m.m(x["x"])),
    "BatchNorm1d_3d": mod(lambda: Members(m=nn.BatchNorm1d(3, momentum=0.2)), lambda m, x: m.m(x["x"])),
    "GroupNorm": mod(lambda: Members(m=nn.GroupNorm(2, 4)), lambda m, x: m.m(x["x"])),
    "RMSNorm": mod(lambda: Members(m=RMSNorm(6)), lambda m, x: m.m(x["x"])),
    "ties_max_pool2d": fn(lambda x: torch.cat([
        F.max_pool2d(x, 2).flatten(1), F.max_pool2d(x, 3, stride=1).flatten(1), F.max_pool2d(x, 2, stride=1, padding=1).flatten(1),
        F.max_pool2d(x, (3, 2), stride=(2, 1), padding=1, dilation=(1, 2), ceil_mode=True).flatten(1)], dim=1)),
    "ties_MaxPool2d": mod(lambda: Members(a=nn.MaxPool2d(2), b=nn.MaxPool2d(3, stride=2, padding=1), c=nn.Conv2d(2, 3, 3)),
                          lambda m, x: torch.cat([m.a(x["x"]).flatten(1), m.b(x["x"]).flatten(1),
                                                  m.a(F.relu(m.c(x["x"])) + 0.5).flatten(1)], dim=1)),
    "ties_max_min_dim": fn(lambda x: torch.cat([torch.max(x, 1)[0].flatten(), torch.min(x, dim=2, keepdim=True)[0].flatten(),
                                                x.max(-1)[0].flatten(), x.min(0)[0].flatten(),
                                                torch.max(x, dim=0, keepdim=True)[0].flatten()])),
    "ties_amax_amin": fn(lambda x: torch.cat([torch.amax(x, 1).flatten(), torch.amin(x, dim=2, keepdim=True).flatten(),
                                              x.amax(-1).flatten(), torch.amin(x, dim=(0, 2)).flatten(),
                                              torch.amax(x, dim=(1, 2), keepdim=True).flatten()])
                         + x.max() * 2 + x.min() * 3 + torch.amax(x, dim=(0, 1, 2)) - torch.amin(x, dim=(0, 1, 2)) * 0.5),
    "ties_EmbeddingBag_max": mod(lambda: Members(o=nn.EmbeddingBag(7, 4, mode="max"), p=nn.EmbeddingBag(7, 4, mode="max", padding_idx=2)),
                                 lambda m, x: m.o(x["i"]) + m.p(x["i"])),
    "AdaptiveAvgPool2d": mod(lambda: Members(m=nn.AdaptiveAvgPool2d(1), n=nn.AdaptiveAvgPool2d((2, 3))),
                             lambda m, x: torch.cat([m.m(x["x"]).flatten(1), m.n(x["x"]).flatten(1)], dim=1)),
}


def topk_case(x):
    v, i = torch.topk(x, 2)
    w, j = torch.topk(x, 3, dim=0, largest=False)
    return v.sum(1) * i[:, 0].float() + w.sum(0)[0:3] * j[0, 0:3].float()


def lstm_case(m, x):
    o, (h, c) = m.m(x["x"])
    return torch.cat([o.flatten(1), h.flatten(1), c.flatten(1)], dim=0)


def lstm_bidir_case(m, x):
    o, (h, c) = m.m(x["x"])
    p, (q, r) = m.n(x["x"])  # [T, N, I]: x's first axis is the sequence here
    return torch.cat([o.flatten(), h.flatten(), c.flatten()]).sum() + p.flatten() * q.flatten().sum() + r.mean()


def gru_bidir_case(m, x):
    o, h = m.m(x["x"])
    return o.sum() + (h * h).sum() + torch.cat([o.flatten(), h.flatten()])


def gru_case(m, x):
    o, h = m.m(x["x"])
    p, u = m.n(x["x"])  # [T, N, I]: x's first axis is the sequence here
    return o.sum() + (h * h).sum() + p * u.mean()


def mha_case(m, x):
    o, w = m.m(x["x"], x["z"], x["z"])
    p, u = m.n(x["x"], x["x"], x["x"])  # [L, N, E]: x's first axis is the sequence here
    return torch.cat([(o * 2 + w.sum()).flatten(1), (p + u.mean()).flatten(1)], dim=1)


def sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """F.scaled_dot_product_attention (PyTorch 2.0; not in 1.13) as its documentation
    writes it out."""
    scale = 1 / q.size(-1) ** 0.5 if scale is None else scale
    att = q @ k.transpose(-2, -1) * scale
    if is_causal:
        attn_mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        att = att.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        att = att + attn_mask
    return att.softmax(-1) @ v


def rotary(x, base=10000.0):
    """Rotary position embeddings as Hugging Face's LLaMA applies them (rotate_half)."""
    d = x.size(-1)
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
    ang = torch.arange(x.size(-2)).float()[:, None] * inv_freq[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


class RMSNorm(nn.Module):
    """torch.nn.RMSNorm (PyTorch 2.4) for PyTorch 1.13: x * rsqrt(mean(x^2) + eps) * weight,
    eps None = torch.finfo(x.dtype).eps, as torch.nn.functional.rms_norm computes it."""

    def __init__(self, n, eps=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight


DTYPES = {"f32": torch.float32, "f64": torch.float64, "i64": torch.int64, "i32": torch.int32, "u8": torch.uint8,
          "bool": torch.bool}


def tensor(t):
    return torch.tensor(t["data"], dtype=torch.float64).reshape(t["shape"]).to(DTYPES[t["dtype"]])


def compare(case, what, kiln, ref):
    kiln = torch.as_tensor(kiln, dtype=torch.float64).reshape(ref.shape)
    ref = ref.detach().to(torch.float64)
    err = (kiln - ref).abs().max().item() if ref.numel() else 0.0
    scale = ref.abs().max().item() if ref.numel() else 0.0
    ok = err <= RTOL * scale + 1e-7
    if not ok:
        print(f"FAIL {case}: {what}: differs by {err:.3g} (largest element {scale:.3g}, allowed {RTOL * scale + 1e-7:.3g})")
    return ok


def loss_of(y, cubic):
    return (y * y * y / 3 + y * y + y).sum() if cubic else (y * y / 2 + y).sum()


def run(case):
    module, apply = REFERENCES[case["name"]]()
    params = {p["name"]: tensor(p) for p in case["params"]}
    inputs = {t["name"]: tensor(t) for t in case["inputs"]}
    for t in case["inputs"]:
        if inputs[t["name"]].is_floating_point():
            inputs[t["name"]].requires_grad_(True)
    if module is not None:
        module.load_state_dict(params, strict=True)
        module.train()
    elif params:
        raise SystemExit(f"{case['name']}: parameters without a module")
    y = apply(module, inputs)
    loss = loss_of(y, case["cubic"])
    loss.backward()
    ok = compare(case["name"], "y", case["y"]["data"], y)
    ok &= compare(case["name"], "loss", [case["loss"]], loss.reshape(1))
    named = dict(module.named_parameters()) if module is not None else {}
    for g in case["grads"]:
        ref = named[g["name"]].grad if g["name"] in named else inputs[g["name"]].grad
        if ref is None:  # not on the loss's path in PyTorch (detached): zero
            ref = torch.zeros(g["shape"])
        ok &= compare(case["name"], f"gradient of {g['name']}", g["data"], ref)
    buffers = dict(module.named_buffers()) if module is not None else {}
    for u in case["updates"]:
        ok &= compare(case["name"], f"update of {u['name']}", u["data"], buffers[u["name"]])
    if module is not None and any(p.requires_grad for p in module.parameters()):
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        opt.step()
        with torch.no_grad():
            ok &= compare(case["name"], "loss after one SGD step", [case["loss_after_step"]],
                          loss_of(apply(module, {k: v.detach() for k, v in inputs.items()}), case["cubic"]).reshape(1))
    print(f"{'ok  ' if ok else 'FAIL'} {case['name']}")
    return ok


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)["cases"]
    torch.manual_seed(0)
    ok = all([run(c) for c in cases])
    print(f"PyTorch {torch.__version__}: {len(cases)} cases, {'all match' if ok else 'MISMATCH'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
