#!/usr/bin/env python3
"""bench/gpu/check.py — the comparisons of bench/gpu/run.sh, with nothing but the standard
library (the GPU machine's image may lack this project's Python packages):

    check.py losses A.log B.log KEY TOL [FIRST]   the KEY values of two JSON-lines logs agree
                                                   within TOL relative (FIRST: B's values
                                                   start at A's value number FIRST, 1-based)
    check.py same-ckpt DIR_A DIR_B                 the newest step's safetensors files of two
                                                   checkpoint directories hold the same
                                                   tensors, bit for bit

Each prints one line and exits 0 when it holds, 1 when not.
"""
import json, os, struct, sys


def values(path, key):
    out = []
    for line in open(path):
        line = line.strip()
        if line:
            v = json.loads(line).get(key)
            if v is not None:
                out.append(float(v))
    return out


def losses(a, b, key, tol, first=1):
    x, y = values(a, key), values(b, key)
    x = x[first - 1:first - 1 + len(y)]
    if not y or len(x) != len(y):
        print(f"{key}: {len(x)} values in {a}, {len(y)} in {b}")
        return 1
    worst = max(abs(p - q) / max(abs(p), 1e-30) for p, q in zip(x, y))
    ok = worst <= tol
    print(f"{key}: {len(y)} values, worst relative difference {worst:.3g} ({'within' if ok else 'OVER'} {tol:g})")
    return 0 if ok else 1


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items()}


def newest(d):
    latest = os.path.join(d, "latest")
    if os.path.exists(latest):
        name = open(latest).read().strip()
        if os.path.isdir(os.path.join(d, name)):
            return os.path.join(d, name)
    steps = sorted((e for e in os.listdir(d) if os.path.isdir(os.path.join(d, e))), key=lambda e: (len(e), e))
    return os.path.join(d, steps[-1])


def same_ckpt(a, b):
    da, db = newest(a), newest(b)
    bad = []
    for name in sorted(os.listdir(da)):
        if not name.endswith(".safetensors"):
            continue
        ta, tb = tensors(os.path.join(da, name)), tensors(os.path.join(db, name))
        if ta.keys() != tb.keys():
            bad.append(f"{name}: tensor names differ")
        bad += [f"{name}: {k}" for k in sorted(ta) if k in tb and ta[k] != tb[k]]
    print(f"{da} vs {db}: " + ("the same tensors, bit for bit" if not bad else "DIFFER in " + ", ".join(bad[:8])))
    return 0 if not bad else 1


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "losses" and len(sys.argv) in (6, 7):
        sys.exit(losses(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6]) if len(sys.argv) == 7 else 1))
    if cmd == "same-ckpt" and len(sys.argv) == 4:
        sys.exit(same_ckpt(sys.argv[2], sys.argv[3]))
    sys.exit(__doc__)
