#!/usr/bin/env python3
"""Exports the PyTorch twins in bench/ with torch.onnx.export, seeded, each with an input
and the model's output, for tests/test_onnx.c:  export_twins.py BENCH_DIR OUT_DIR
  mlp, cnn (bench/reference.py): opset 13, the batch a dynamic axis, 4 images;
  gpt (bench/reference_gpt.py): opset 17, batch 2 of 128 tokens, fixed (the exporter folds
    the shapes). PyTorch 1.13's exporter has no logical_not, so the attention's causal
    mask is written `tril() == 0` here: the same mask;
  llama (bench/reference_llama.py): the same, batch 2 of 64 tokens (its repeat_interleave
    exports as shape arithmetic that kiln import folds).
Exit status 77 when PyTorch is not installed."""
import math, os, sys

try:
    import numpy as np
    import torch
except ImportError:
    sys.exit(77)

sys.path.insert(0, sys.argv[1])
import reference  # noqa: E402

out = sys.argv[2]
torch.manual_seed(0)
for name, cls in [("mlp", reference.MLP), ("cnn", reference.CNN)]:
    m = cls().eval()
    x = torch.randint(0, 256, (4, 28, 28), dtype=torch.uint8)
    torch.onnx.export(m, (x,), os.path.join(out, name + ".onnx"), input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}}, opset_version=13)
    np.save(os.path.join(out, name + "_in.npy"), x.numpy())
    np.save(os.path.join(out, name + "_out.npy"), m(x).detach().numpy())

import torch.nn.functional as F  # noqa: E402
import reference_gpt  # noqa: E402


def block_forward(self, x):
    B, t, _ = x.shape
    C, H = self.C, self.H
    q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
    q, k, v = [z.view(B, t, H, C // H).transpose(1, 2) for z in (q, k, v)]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
    att = att.masked_fill(torch.ones(t, t).tril() == 0, float("-inf"))
    y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, t, C)
    x = x + self.attn_proj(y)
    return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


reference_gpt.Block.forward = block_forward
m = reference_gpt.GPT().eval()
x = torch.randint(0, 256, (2, 128))
torch.onnx.export(m, (x,), os.path.join(out, "gpt.onnx"), input_names=["idx"], output_names=["logits"], opset_version=17)
np.save(os.path.join(out, "gpt_in.npy"), x.numpy())
np.save(os.path.join(out, "gpt_out.npy"), m(x).detach().numpy())


import reference_llama  # noqa: E402


def attention_forward(self, x):
    b, t, _ = x.shape
    H, KVH, D = self.H, self.KVH, self.D
    q = reference_llama.rotary(self.wq(x).view(b, t, H, D).transpose(1, 2))
    k = reference_llama.rotary(self.wk(x).view(b, t, KVH, D).transpose(1, 2))
    v = self.wv(x).view(b, t, KVH, D).transpose(1, 2)
    k = k.repeat_interleave(H // KVH, dim=1)
    v = v.repeat_interleave(H // KVH, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    att = att.masked_fill(torch.ones(t, t).tril() == 0, float("-inf"))
    y = F.softmax(att, dim=-1) @ v
    return self.wo(y.transpose(1, 2).reshape(b, t, H * D))


reference_llama.Attention.forward = attention_forward
m = reference_llama.Llama().eval()
x = torch.randint(0, 256, (2, 64))
torch.onnx.export(m, (x,), os.path.join(out, "llama.onnx"), input_names=["idx"], output_names=["logits"], opset_version=17)
np.save(os.path.join(out, "llama_in.npy"), x.numpy())
np.save(os.path.join(out, "llama_out.npy"), m(x).detach().numpy())
