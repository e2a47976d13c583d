#!/usr/bin/env python3
"""PyTorch twin of models/llama.kiln: the same byte-level LLaMA-style model (4 layers, 4 query
heads sharing 2 key/value heads, width 128, SwiGLU hidden width 384, RMSNorm eps 1e-5, rotary
embeddings in Hugging Face's rotate-half layout, untied head, no biases), the same parameter
names (Meta's reference model.py: tok_embeddings, layers.N.attention.wq, ...; state_dict loads
with strict=True from a Kiln checkpoint), the same initialisation (N(0, 0.02), wo and w2
N(0, 0.02 / sqrt(2 L)), RMSNorm weights ones), and gpt's data and recipe (Debian's fortunes:
files without an extension, sorted, concatenated; last 10% for validation; non-overlapping
windows in a shuffled order; AdamW lr 3e-4, betas 0.9/0.95, weight decay 0.1 on matrices,
clip 1.0, batch 16, validation on 20 batches every 100 steps).
Prints the median step time and the validation losses.    reference_llama.py [--steps N]"""
import argparse, glob, math, os, statistics, time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, T, C, L, H, KVH, FF = 256, 128, 128, 4, 4, 2, 384


class RMSNorm(nn.Module):
    """torch.nn.RMSNorm (PyTorch 2.4) for older PyTorch: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, n, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, base=10000.0):
    """RoPE as Hugging Face's LLaMA applies it (rotate_half), positions 0 ... T-1 along axis -2."""
    d = x.size(-1)
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
    ang = torch.arange(x.size(-2)).float()[:, None] * inv_freq[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


class Attention(nn.Module):
    def __init__(self, C=C, H=H, KVH=KVH):
        super().__init__()
        self.H, self.KVH, self.D = H, KVH, C // H
        self.wq = nn.Linear(C, H * self.D, bias=False)
        self.wk = nn.Linear(C, KVH * self.D, bias=False)
        self.wv = nn.Linear(C, KVH * self.D, bias=False)
        self.wo = nn.Linear(H * self.D, C, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        H, KVH, D = self.H, self.KVH, self.D
        q = rotary(self.wq(x).view(b, t, H, D).transpose(1, 2))
        k = rotary(self.wk(x).view(b, t, KVH, D).transpose(1, 2))
        v = self.wv(x).view(b, t, KVH, D).transpose(1, 2)
        # Hugging Face's repeat_kv: query head h reads key/value head h // (H / KVH)
        k = k.repeat_interleave(H // KVH, dim=1)
        v = v.repeat_interleave(H // KVH, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).tril().logical_not(), float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.wo(y.transpose(1, 2).reshape(b, t, H * D))


class FeedForward(nn.Module):
    def __init__(self, C=C, FF=FF):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(C, FF, bias=False), nn.Linear(FF, C, bias=False), nn.Linear(C, FF, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, C=C, H=H, KVH=KVH, FF=FF):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(C), Attention(C, H, KVH)
        self.ffn_norm, self.feed_forward = RMSNorm(C), FeedForward(C, FF)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, V=V, C=C, L=L, H=H, KVH=KVH, FF=FF):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Block(C, H, KVH, FF) for _ in range(L))
        self.norm = RMSNorm(C)
        self.output = nn.Linear(C, V, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def optimizer(model):
    """models/llama.kiln's AdamW: weight decay 0.1 on matrices only (Kiln's decay = matrices)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=3e-4,
                             betas=(0.9, 0.95))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=100)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*") if "." not in os.path.basename(f) and os.path.isfile(f))
    data = torch.tensor(list(b"".join(open(f, "rb").read() for f in files)), dtype=torch.long)
    nval = int(len(data) * 0.1)
    train, val = data[:-nval], data[-nval:]

    def windows(d):
        n = (len(d) - 1) // T
        return torch.stack([d[i * T:i * T + T + 1] for i in range(n)])
    tw, vw = windows(train), windows(val)
    model = Llama()
    opt = optimizer(model)
    order, pos, times = torch.randperm(len(tw)), 0, []
    for step in range(1, a.steps + 1):
        if pos + 16 > len(order):
            order, pos = torch.randperm(len(tw)), 0
        batch = tw[order[pos:pos + 16]]
        pos += 16
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, V), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        if step % a.eval_every == 0:
            with torch.no_grad():
                vl = [F.cross_entropy(model(vw[i:i + 16, :-1]).reshape(-1, V), vw[i:i + 16, 1:].reshape(-1)).item()
                      for i in range(0, 16 * 20, 16)]
            print(f"pytorch llama step {step}: train loss {loss.item():.4f}  val loss {sum(vl) / len(vl):.4f}  "
                  f"median step {1000 * statistics.median(times[min(5, len(times) - 1):]):.0f} ms", flush=True)


if __name__ == "__main__":
    main()
