#!/usr/bin/env python3
"""Writes the generated members of the bad-input corpus (tests/bad/).

Run once from the repository root (python3 tests/bad/gen_large.py); the outputs are
committed, so the test suite never runs this. Deterministic: a fixed seed and fixed sizes,
so rerunning it reproduces the same bytes. The .expected files are written by hand.
"""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))


def write(name, data, pending=False):
    """pending: the input shows a compiler problem; it goes to pending/ (not scanned)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(HERE, "pending" if pending else "", name), "wb") as f:
        f.write(data)


HEADER = "model deep\n\nfc = Linear(4, 4)\n\n"
TRAIN = "\ntrain { batch = 8 }\n"

# Random bytes, NULs and all control bytes included.
rng = random.Random(20240611)
write("raw_binary_garbage.kiln", bytes(rng.randrange(256) for _ in range(4096)))

# A model whose forward has a single ~1 MB line: y = x + 1 + 1 + ... (flat, not nested).
n = (1 << 20) // 4
write("raw_long_line_1mb.kiln",
      "# A 1 MB line: one flat sum of 262,144 terms.\n" + HEADER +
      "forward(x: f32[B, 4]) -> y {\n    y = fc(x)" + " + 1" * n + "\n}\n" + TRAIN)

# 10,000 nested parentheses around the forward's input.
d = 10000
write("raw_nested_parens_10000.kiln",
      "# 10,000 nested parentheses.\n" + HEADER +
      "forward(x: f32[B, 4]) -> y {\n    y = fc(" + "(" * d + "x" + ")" * d + ")\n}\n" + TRAIN)

# 10,000 unary minus signs in a row.
write("raw_nested_unary_minus_10000.kiln",
      "# 10,000 unary minus signs.\n" + HEADER +
      "forward(x: f32[B, 4]) -> y {\n    y = fc(" + "-" * d + "x)\n}\n" + TRAIN)

# 10,000 nested list brackets.
write("raw_nested_brackets_10000.kiln",
      "# 10,000 nested list brackets.\n" + HEADER +
      "forward(x: f32[B, 4]) -> y {\n    y = fc(x) + sum(" + "[" * d + "1" + "]" * d + ")\n}\n" + TRAIN)

# 10,000 bare '{' in a forward body, never closed.
write("raw_nested_braces_10000.kiln",
      "# 10,000 unclosed braces in the forward body.\n" + HEADER +
      "forward(x: f32[B, 4]) -> y {\n    y = fc(x)\n" + "{" * d + "\n}\n" + TRAIN)

# 300 nested for loops, each properly closed: deeper than the parser's limit.
lines = ["# 300 nested for loops.", "model deep", "", "fc = Linear(4, 4)", "h = [fc for 1]", "",
         "forward(x: f32[B, 4]) -> y {"]
for i in range(300):
    lines.append(" " + "for b%d in h {" % i)
lines.append(" x = b0(x)")
for i in reversed(range(300)):
    lines.append(" }")
lines += ["    y = x", "}", "", "train { batch = 8 }", ""]
write("raw_nested_for_300.kiln", "\n".join(lines))

# A 64 KB identifier used as an unknown name.
write("raw_long_name_64k.kiln",
      "# An unknown name 65,536 characters long.\n" + HEADER +
      "forward(x: f32[B, 4]) -> y {\n    y = fc(" + "x" * 65536 + ")\n}\n" + TRAIN)

# The reference GPT cut off in the middle of a token (inside `transpose`).
with open(os.path.join(HERE, "..", "..", "models", "gpt.kiln"), "rb") as f:
    gpt = f.read()
cut = gpt.index(b"@ transp") + len(b"@ transp")
write("raw_truncated_gpt.kiln", gpt[:cut])

# CRLF line endings throughout, with one mistake (fc2 is used but never defined).
crlf = ("# CRLF line endings; fc2 is used but the member is fc1.\n"
        "model mlp\n\nfc1 = Linear(784, 10)\n\n"
        "forward(image: u8[B, 28, 28]) -> logits {\n"
        "    logits = fc2(flatten(f32(image) / 255))\n}\n\ntrain { batch = 128 }\n")
write("raw_crlf_line_endings.kiln", crlf.replace("\n", "\r\n"))

# A UTF-8 byte-order mark before an otherwise valid model with one mistake.
write("raw_utf8_bom.kiln", b"\xef\xbb\xbf" +
      b"# A UTF-8 byte-order mark starts the file; fc2 is used but the member is fc1.\n"
      b"model mlp\n\nfc1 = Linear(784, 10)\n\n"
      b"forward(image: u8[B, 28, 28]) -> logits {\n"
      b"    logits = fc2(flatten(f32(image) / 255))\n}\n\ntrain { batch = 128 }\n")

# A NUL byte in the middle of a line.
write("raw_nul_byte.kiln",
      b"# A NUL byte inside the forward body.\nmodel mlp\n\nfc1 = Linear(784, 10)\n\n"
      b"forward(image: u8[B, 28, 28]) -> logits {\n"
      b"    logits = fc1(flatten(f32(image)\x00 / 255))\n}\n\ntrain { batch = 128 }\n")

# ---- large generated inputs that once showed compiler problems (now fixed) ----

# 20,000 members: compile time grows quadratically (minutes).
write("members_20000_slow.kiln",
      "# 20,000 members, and forward calls fc20000, which does not exist; kiln check should\n"
      "# report that in well under a second, not after minutes.\nmodel wide\n\n" +
      "".join("fc%d = Linear(4, 4)\n" % i for i in range(20000)) +
      "\nforward(x: f32[B, 4]) -> y {\n    y = fc20000(x)\n}\n" + TRAIN)

# A metric name repeated after the 256th metric: the duplicate check stops at 256 names.
write("dup_metric_beyond_256.kiln",
      "# metric m280 is defined twice; the duplicate comes after 300 metrics.\nmodel many\n\n" +
      "forward(x: f32[B, 4]) -> y {\n    y = x * 2\n}\n\n" +
      "".join("metric m%d = mean(y) * %d\n" % (i, i) for i in range(300)) +
      "metric m280 = sum(y)\n" + TRAIN)

# A constant redefined after the 4096th declaration: accepted silently, the last value wins.
write("dup_const_beyond_4096.kiln",
      "# const c4099 is defined twice (4099, then 5); kiln accepts it and uses 5.\nmodel many\n\n" +
      "".join("const c%d = %d\n" % (i, i) for i in range(4100)) +
      "const c4099 = 5\n\nfc = Linear(4, c4099)\n\n" +
      "forward(x: f32[B, 4]) -> y {\n    y = fc(x)\n}\n" + TRAIN)
