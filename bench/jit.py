#!/usr/bin/env python3
"""kiln train's JIT (cli/jit_train.c) against the program kiln train builds and runs
(--no-jit), in one run, rounds alternating:

  start: seconds from starting `kiln train models/mlp.kiln --steps 1` to the line the
         training prints just before its first step (the data loaded, the model compiled or
         read from the cache, linked and set up), cold (empty cache: the compile included)
         and warm (the cache filled by the previous run); median of ROUNDS. Twice: with the
         recipe's data (Fashion-MNIST, 70,000 gzipped images to inflate) and with 384
         images in plain IDX files, where what remains is kiln's own time;
  step:  the training step (--bench-steps N, train_step_ms_median) of each model both
         ways, median of the rounds' medians; ratio JIT / program.

Then one warm and one cold JIT run's --time-passes, to say where the time goes.

    ROUNDS=5 bench/jit.py | tee bench/results/jit-$(date +%F).txt
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN = os.environ.get("KILN", os.path.join(ROOT, "build", "kiln"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
MODELS = os.environ.get("MODELS", "mlp gpt").split()
THREADS = os.environ.get("THREADS", str(os.cpu_count()))


def env_for(cache):
    e = dict(os.environ, XDG_CACHE_HOME=cache)
    e.pop("CC", None)
    return e


SMALL = ["--data", "image=img.idx", "--data", "label=lab.idx", "--eval-data", "image=img.idx", "--eval-data", "label=lab.idx"]


def write_small_data(work):
    """384 images of 28x28 and their labels, u8 IDX files (as tests/support.c writes)."""
    n = 384
    with open(os.path.join(work, "img.idx"), "wb") as f:
        f.write(bytes([0, 0, 8, 3]) + n.to_bytes(4, "big") + (28).to_bytes(4, "big") + (28).to_bytes(4, "big"))
        f.write(bytes((i * 1103515245 + 12345) >> 16 & 255 for i in range(n * 28 * 28)))
    with open(os.path.join(work, "lab.idx"), "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + n.to_bytes(4, "big") + bytes(i % 10 for i in range(n)))


def start_seconds(cache, jit, work, data):
    """Seconds to the training's banner line (stdout line-buffered by stdbuf, which the
    program kiln executes inherits)."""
    cmd = ["stdbuf", "-oL", KILN, "train", os.path.join(ROOT, "models/mlp.kiln")] + ([] if jit else ["--no-jit"])
    cmd += ["--steps", "1", "--eval-batches", "1", "--checkpoint-dir", os.path.join(work, "ck")] + data
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env_for(cache), text=True, cwd=work)
    banner = None
    for line in p.stdout:
        if banner is None and " parameters, " in line:
            banner = time.monotonic() - t0
    p.wait()
    if p.returncode or banner is None:
        sys.exit(f"jit.py: {' '.join(cmd)} failed ({p.returncode})")
    return banner


def step_ms(model, cache, jit, work):
    cmd = [KILN, "train", os.path.join(ROOT, f"models/{model}.kiln")] + ([] if jit else ["--no-jit"])
    steps = {"mlp": "100", "gpt2-124m": "3"}.get(model, "10")  # mlp's 1.5 ms steps: 10 of them are noise on a shared machine
    cmd += ["--bench-steps", steps, "--threads", THREADS]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env_for(cache), cwd=work)
    m = re.search(r'"train_step_ms_median": ([0-9.]+)', out.stdout)
    if not m:
        sys.exit(f"jit.py: {' '.join(cmd)}: no bench line\n{out.stdout}\n{out.stderr}")
    return float(m.group(1))


def main():
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet"]).returncode != 0
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"commit {commit}{'-dirty' if dirty else ''}, {os.cpu_count()} CPUs, {THREADS} threads, {cpu}; kiln {KILN}")
    work = tempfile.mkdtemp(prefix="kiln-jit-bench-")
    try:
        write_small_data(work)
        for label, data in (("the recipe's data", []), ("384 images, plain IDX (" + " ".join(SMALL) + ")", SMALL)):
            times = {k: [] for k in ("jit cold", "jit warm", "program cold", "program warm")}
            for _ in range(ROUNDS):
                for jit in (True, False):
                    name = "jit" if jit else "program"
                    cache = os.path.join(work, "cache-" + name)
                    shutil.rmtree(cache, ignore_errors=True)
                    times[name + " cold"].append(start_seconds(cache, jit, work, data))
                    times[name + " warm"].append(start_seconds(cache, jit, work, data))
            print("\nkiln train models/mlp.kiln --steps 1, %s: start to first step, seconds (median of %d; min-max)" % (label, ROUNDS))
            for k, v in times.items():
                print(f"  {k:13s} {statistics.median(v):6.3f}   ({min(v):.3f}-{max(v):.3f})")
        print("\ntraining step, ms (--bench-steps, --threads %s; median of %d rounds' medians)" % (THREADS, ROUNDS))
        print(f"  {'model':10s} {'jit':>9s} {'program':>9s} {'ratio':>7s}")
        for model in MODELS:
            cache = os.path.join(work, "cache-step")
            step_ms(model, cache, True, work)  # compiles and caches both
            step_ms(model, cache, False, work)
            j, p = [], []
            for _ in range(ROUNDS):
                j.append(step_ms(model, cache, True, work))
                p.append(step_ms(model, cache, False, work))
            mj, mp = statistics.median(j), statistics.median(p)
            print(f"  {model:10s} {mj:9.2f} {mp:9.2f} {mj / mp:7.3f}")
        for label, fresh in (("cold", True), ("warm", False)):
            cache = os.path.join(work, "cache-jit")
            if fresh:
                shutil.rmtree(cache, ignore_errors=True)
            t0 = time.monotonic()
            out = subprocess.run([KILN, "train", os.path.join(ROOT, "models/mlp.kiln"), "--time-passes", "--steps", "1", "--eval-batches", "1",
                                  "--checkpoint-dir", os.path.join(work, "ck")], capture_output=True, text=True, env=env_for(cache), cwd=work)
            print(f"\nkiln train models/mlp.kiln --time-passes --steps 1 ({label}; {time.monotonic() - t0:.3f} s in all):")
            print("".join(l + "\n" for l in out.stderr.splitlines() if re.match(r"^(pass|lower|simplify|fusion|memplan|autodiff|precision|remat|codegen|compile|prepare|link) ", l)), end="")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
