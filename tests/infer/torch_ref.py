"""PyTorch's side of tests/test_infer.c and bench/infer.sh: bench/reference.py's MLP and
CNN (models/mlp.kiln and models/cnn.kiln as torch.nn modules, the same state_dict names),
initialised by PyTorch (seeded), their state_dict saved as safetensors, and their
eval-mode logits on the first N Fashion-MNIST test images saved as .npy.

The safetensors file is written by hand (8-byte little-endian header length, the JSON
header, the raw little-endian data), as safetensors.torch.save_file writes it, since the
safetensors package may be missing where torch is installed.

usage: torch_ref.py mlp|cnn OUT_DIR N   -> OUT_DIR/MODEL.safetensors, OUT_DIR/MODEL_logits.npy
Exit status 3 when torch or numpy cannot be imported (the test then skips)."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
try:
    import numpy as np
    import torch
    from reference import CNN, DATA, MLP, load_idx
except ImportError as e:  # the caller skips with this message
    print(f"torch_ref.py: {e}", file=sys.stderr)
    sys.exit(3)

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


def main():
    name, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(1234)
    torch.set_num_threads(2)
    model = (MLP if name == "mlp" else CNN)().eval()
    save_safetensors(model.state_dict(), f"{out}/{name}.safetensors")
    images = load_idx(f"{DATA}/t10k-images-idx3-ubyte.gz")[:n]
    np.save(f"{out}/images.npy", images)
    with torch.no_grad():
        logits = model(torch.from_numpy(images.copy()))
    np.save(f"{out}/{name}_logits.npy", logits.numpy().astype(np.float32))


if __name__ == "__main__":
    main()
