#!/usr/bin/env python3
"""PyTorch reference for Kiln's mlp.kiln and cnn.kiln: the same modules (same state_dict
names), the same recipe (AdamW lr 1e-3, weight decay 0.01 on matrices only, as Kiln's
default `decay = matrices`; batch 128; shuffled each epoch), trained on the same
Fashion-MNIST files. Prints test accuracy and wall time per epoch.

    reference.py mlp|cnn [--epochs N] [--threads N]
    reference.py eval mlp|cnn CHECKPOINT_DIR     # a Kiln checkpoint in PyTorch
"""
import argparse, gzip, json, os, struct, sys, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 256), nn.Linear(256, 256), nn.Linear(256, 10)

    def forward(self, image):
        x = torch.flatten(image.float() / 255, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(64 * 7 * 7, 128), nn.Linear(128, 10)

    def forward(self, image):
        x = (image.float() / 255).reshape(-1, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def accuracy(model, images, labels):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(images), 1000):
            correct += (model(images[i:i + 1000]).argmax(1) == labels[i:i + 1000]).sum().item()
    model.train()
    return correct / len(images)


def test_set():
    return (torch.from_numpy(load_idx(f"{DATA}/t10k-images-idx3-ubyte.gz").copy()),
            torch.from_numpy(load_idx(f"{DATA}/t10k-labels-idx1-ubyte.gz").astype(np.int64)))


def train(name, epochs):
    model = (MLP if name == "mlp" else CNN)()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=1e-3)
    images = torch.from_numpy(load_idx(f"{DATA}/train-images-idx3-ubyte.gz").copy())
    labels = torch.from_numpy(load_idx(f"{DATA}/train-labels-idx1-ubyte.gz").astype(np.int64))
    timages, tlabels = test_set()
    for epoch in range(epochs):
        t0 = time.time()
        perm = torch.randperm(len(images))
        for i in range(0, len(images) - 127, 128):
            idx = perm[i:i + 128]
            loss = F.cross_entropy(model(images[idx]), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        t = time.time() - t0
        print(f"pytorch {name} epoch {epoch + 1}: test accuracy {accuracy(model, timages, tlabels):.4f}  {t:.1f} s", flush=True)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    types = {"F32": np.float32, "I64": np.int64, "F64": np.float64, "I32": np.int32, "U8": np.uint8}
    out = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[key] = torch.from_numpy(np.frombuffer(body[b:e], dtype=types[info["dtype"]]).reshape(info["shape"]).copy())
    return out


def latest_model(ckdir):
    """The newest checkpoint's weights: the step directory ckdir/latest names (Kiln's
    layout, docs/training.md), or ckdir/model.safetensors as older versions wrote it."""
    pointer = os.path.join(ckdir, "latest")
    if os.path.exists(pointer):
        with open(pointer) as f:
            return os.path.join(ckdir, f.read().strip(), "model.safetensors")
    return os.path.join(ckdir, "model.safetensors")


def evaluate_checkpoint(name, ckdir):
    model = (MLP if name == "mlp" else CNN)()
    path = latest_model(ckdir)
    model.load_state_dict(read_safetensors(path))  # strict: names and shapes must match
    print(f"pytorch loading kiln's {path}: test accuracy {accuracy(model, *test_set()):.4f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "eval":
        evaluate_checkpoint(sys.argv[2], sys.argv[3])
        sys.exit(0)
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["mlp", "cnn"])
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    train(a.model, a.epochs or (5 if a.model == "mlp" else 3))
