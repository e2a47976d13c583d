#!/usr/bin/env python3
"""PyTorch reference for models/gpt.kiln: the same byte-level GPT (4 layers, 4 heads,
width 128, context 128, tied head, GPT-2 init), the same data (Debian's fortunes: files
without an extension, sorted, concatenated; last 10% for validation; non-overlapping
windows in a shuffled order), the same recipe (AdamW lr 3e-4, betas 0.9/0.95, weight decay
0.1 on matrices, clip 1.0, batch 16, 500 steps, validation on 20 batches every 100 steps).
Prints the median step time and the validation losses.    reference_gpt.py [--steps N]"""
import argparse, glob, math, os, statistics, time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, T, C, L, H = 256, 128, 128, 4, 4


class Block(nn.Module):
    def __init__(self, C=C, H=H, sdpa=False):
        super().__init__()
        self.C, self.H, self.sdpa = C, H, sdpa
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, t, _ = x.shape
        C, H = self.C, self.H
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = [z.view(B, t, H, C // H).transpose(1, 2) for z in (q, k, v)]
        if self.sdpa:  # PyTorch's scaled_dot_product_attention (2.0 on); 1.13's is the private one
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # query, key, value, attn_mask, dropout_p, need_attn_weights, is_causal
                y = F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)[0]
            y = y.transpose(1, 2).reshape(B, t, C)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
            att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).tril().logical_not(), float("-inf"))
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, t, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """models/gpt.kiln by default; other sizes (bench/torch_bench.py's GPT-2 small) by keyword."""
    def __init__(self, V=V, T=T, C=C, L=L, H=H, sdpa=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H, sdpa) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: torch.autocast('cpu', torch.bfloat16), PyTorch's CPU mixed precision")
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
    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=3e-4,
                            betas=(0.9, 0.95))
    order, pos, times = torch.randperm(len(tw)), 0, []
    for step in range(1, a.steps + 1):
        if pos + 16 > len(order):
            order, pos = torch.randperm(len(tw)), 0
        batch = tw[order[pos:pos + 16]]
        pos += 16
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, V), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        if step % 100 == 0 or step == a.steps:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                vl = [F.cross_entropy(model(vw[i:i + 16, :-1]).reshape(-1, V), vw[i:i + 16, 1:].reshape(-1)).item()
                      for i in range(0, 16 * 20, 16)]
            print(f"pytorch gpt step {step}: train loss {loss.item():.4f}  val loss {sum(vl) / len(vl):.4f}  "
                  f"median step {1000 * statistics.median(times[5:] or times):.0f} ms", flush=True)


if __name__ == "__main__":
    main()
