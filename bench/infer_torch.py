#!/usr/bin/env python3
"""PyTorch's side of bench/infer.sh: bench/reference.py's MLP in eval mode, eager, under
no_grad, with the weights of a safetensors file (the one Kiln's inference program loads).

    infer_torch.py latency WEIGHTS IMAGES.npy [--threads 2]
        one forward per image at batch 1 over every image of IMAGES.npy (one untimed call
        first); prints `bench: {...}` with the median and the mean milliseconds per image
    infer_torch.py first WEIGHTS IMAGES.npy OUT.npy [--threads 2]
        what a program does from its start to its first result: import torch, build the
        model, load the weights, one forward of the first image, its logits to OUT.npy
        (bench/infer.sh times the whole process)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import argparse
import statistics
import time

import numpy as np
import torch

from reference import MLP, read_safetensors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["latency", "first"])
    ap.add_argument("weights")
    ap.add_argument("images")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = MLP().eval()
    model.load_state_dict(read_safetensors(a.weights))
    images = torch.from_numpy(np.load(a.images))
    with torch.no_grad():
        if a.what == "first":
            np.save(a.out, model(images[:1]).numpy())
            return
        model(images[:1])
        times = []
        t0 = time.perf_counter()
        for i in range(len(images)):
            t = time.perf_counter()
            model(images[i:i + 1])
            times.append(time.perf_counter() - t)
        total = time.perf_counter() - t0
    print('bench: {"images": %d, "median_ms": %.5f, "mean_ms": %.5f}' % (len(images), 1e3 * statistics.median(times), 1e3 * total / len(images)))


if __name__ == "__main__":
    main()
