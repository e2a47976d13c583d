#!/usr/bin/env python3
"""PyTorch generation loops for models/gpt.kiln on Kiln's weights, for bench/generate.sh:
the model written with Kiln's parameter names (GPT-2's), its weights read from a Kiln
checkpoint's model.safetensors (by hand: the safetensors package may be missing), then
    cached  a key/value cache: the prompt in one forward that keeps each layer's keys and
            values, then one token at a time against them (torch.cat of the new row);
    full    the whole window (at most the context) through the model for each token.
Past the context (128 positions) the positions of every token change, so both recompute
the last 128 tokens for each new one, as Kiln's program does. Sampling: temperature,
top-k, torch.multinomial. Prints, per loop, the tokens/s after the first token, as the
median of ROUNDS runs, and (--greedy) the text of greedy decoding, which bench/generate.sh
compares with Kiln's.
    generate_torch.py WEIGHTS PROMPT TOKENS [--threads 2] [--rounds 5] [--greedy]"""
import argparse, json, math, statistics, struct, sys, time

import numpy as np
import torch
import torch.nn.functional as F

V, T, C, L, H = 256, 128, 128, 4, 4


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        a, b = t["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype="<f4").copy().reshape(t["shape"]))
    return out


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(V, C), torch.nn.Embedding(T, C)
        self.h = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.ln_1, b.ln_2 = torch.nn.LayerNorm(C), torch.nn.LayerNorm(C)
            b.attn, b.mlp = torch.nn.Module(), torch.nn.Module()
            b.attn.c_attn, b.attn.c_proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
            b.mlp.c_fc, b.mlp.c_proj = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)
            self.h.append(b)
        self.ln_f = torch.nn.LayerNorm(C)

    def forward(self, idx, past=None, cache=None):
        """Logits of tokens idx [1, t] at positions past.. past+t; cache: per layer [k, v]
        ([1, H, past, hd]), extended in place (None: no cache)."""
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(past, past + t))
        for l, b in enumerate(self.h):
            q, k, v = b.attn.c_attn(b.ln_1(x)).split(C, dim=2)
            q, k, v = [z.view(1, t, H, C // H).transpose(1, 2) for z in (q, k, v)]
            if cache is not None:
                if cache[l]:
                    k, v = torch.cat([cache[l][0], k], 2), torch.cat([cache[l][1], v], 2)
                cache[l] = [k, v]
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
            kv = k.shape[2]
            mask = torch.arange(kv)[None, :] <= (torch.arange(t) + kv - t)[:, None]
            att = att.masked_fill(~mask, float("-inf"))
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(1, t, C)
            x = x + b.attn.c_proj(y)
            x = x + b.mlp.c_proj(F.gelu(b.mlp.c_fc(b.ln_2(x)), approximate="tanh"))
        return self.ln_f(x) @ self.wte.weight.t()


def sample(logits, temperature, top_k, gen):
    if temperature == 0:
        return int(torch.argmax(logits))
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return int(torch.multinomial(F.softmax(logits, -1), 1, generator=gen))


@torch.no_grad()
def generate(model, prompt, n, cached, temperature, top_k, seed):
    gen = torch.Generator().manual_seed(seed)
    toks = list(prompt)
    cache, past = [None] * L, 0
    first = None
    for i in range(n):
        if cached and len(toks) <= T:
            new = toks[past:]
            logits = model(torch.tensor([new]), past, cache)
            past = len(toks)
        else:  # no cache, or past the context: the window again
            w = toks[-T:]
            logits = model(torch.tensor([w]), 0, None)
        toks.append(sample(logits[0, -1], temperature, top_k, gen))
        if i == 0:
            first = time.perf_counter()
    return toks[len(prompt):], first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("weights")
    ap.add_argument("prompt")
    ap.add_argument("tokens", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--greedy", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = GPT()
    model.load_state_dict(load_safetensors(a.weights), strict=True)
    model.eval()
    prompt = a.prompt.encode()
    if a.greedy:
        out, _ = generate(model, prompt, a.tokens, True, 0, 0, 0)
        sys.stdout.buffer.write(prompt + bytes(out) + b"\n")
        return
    for name, cached in (("cached", True), ("full", False)):
        rates = []
        for r in range(a.rounds):
            out, first = generate(model, prompt, a.tokens, cached, 0.8, 40, r)
            rates.append((a.tokens - 1) / (time.perf_counter() - first))
        print(f"torch {name} {statistics.median(rates):.1f}")


if __name__ == "__main__":
    main()
