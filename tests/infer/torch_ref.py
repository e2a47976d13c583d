"""PyTorch's side of tests/test_infer.c (and bench/infer.sh): models/mlp.kiln and
models/cnn.kiln written as torch.nn modules with the same state_dict names, initialised by
PyTorch (seeded), their state_dict saved as safetensors, and their eval-mode logits on the
first N Fashion-MNIST test images saved as .npy.

The safetensors file is written by hand (8-byte little-endian header length, the JSON
header, the raw little-endian data), as safetensors.torch.save_file writes it, since the
safetensors package may be missing where torch is installed.

usage: torch_ref.py mlp|cnn OUT_DIR N   -> OUT_DIR/MODEL.safetensors, OUT_DIR/MODEL_logits.npy
Exit status 3 when torch or numpy cannot be imported (the test then skips)."""
import gzip
import json
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # the caller skips with this message
    print(f"torch_ref.py: {e}", file=sys.stderr)
    sys.exit(3)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 10)

    def forward(self, image):
        x = torch.flatten(image.float() / 255, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.pool2 = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, image):
        x = (image.float() / 255).reshape(-1, 1, 28, 28)
        x = self.pool1(F.relu(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8"}


def save_safetensors(state, path):
    header, blobs, off = {}, [], 0
    for name, t in state.items():
        data = t.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def test_images(n):
    with gzip.open("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz") as f:
        data = f.read()
    return np.frombuffer(data, dtype=np.uint8, offset=16)[: n * 784].reshape(n, 28, 28)


def main():
    name, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(1234)
    torch.set_num_threads(2)
    model = (MLP if name == "mlp" else CNN)().eval()
    save_safetensors(model.state_dict(), f"{out}/{name}.safetensors")
    with torch.no_grad():
        logits = model(torch.from_numpy(test_images(n).copy()))
    np.save(f"{out}/{name}_logits.npy", logits.numpy().astype(np.float32))


if __name__ == "__main__":
    main()
