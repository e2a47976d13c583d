#!/usr/bin/env python3
"""Exports bench/reference.py's PyTorch twins of models/mlp.kiln and cnn.kiln with
torch.onnx.export (opset 13, the batch a dynamic axis), seeded, with an input of 4 images and
the model's output, for tests/test_onnx.c:  export_twins.py BENCH_DIR OUT_DIR
Exit status 77 when PyTorch is not installed."""
import os, sys

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
