"""Writes tests/infer/bad/: input files an inference program of models/mlp.kiln must refuse
with one clear message (tests/test_infer.c lists each with the message it expects). The
files are committed; run this again only to change them. Needs nothing but the standard
library."""
import gzip
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bad")


def idx(dims, data, code=0x08):
    return bytes([0, 0, code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)


def npy(descr, shape, data):
    shape_text = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    pad = (64 - (10 + len(header) + 1) % 64) % 64
    header = header + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


os.makedirs(OUT, exist_ok=True)
write("image_32x32.idx", idx([3, 32, 32], [7] * (3 * 32 * 32)))
write("image_truncated.npy", npy("|u1", [4, 28, 28], bytes(100)))
write("image_f4.npy", npy("<f4", [2, 28, 28], struct.pack("<%df" % (2 * 784), *([0.5] * (2 * 784)))))
write("image_flat.npy", npy("|u1", [2, 784], bytes(2 * 784)))
write("image_2.idx", idx([2, 28, 28], [i % 256 for i in range(2 * 784)]))
write("label_3.idx", idx([3], [1, 2, 3]))
write("label_11.idx", idx([2], [1, 11]))
write("image_empty.idx", idx([0, 28, 28], []))
write("not_data.txt", b"hello, this is not a data file\n")
write("image_truncated.idx.gz", gzip.compress(idx([10, 28, 28], bytes(50)), mtime=0))
