#!/usr/bin/env python3
"""PyTorch DDP beside bench/dist.sh: models/gpt.kiln's GPT (bench/reference_gpt.py) trained
on random tokens, global batch 16 and AdamW with clipping as its recipe, as 1 process with
2 threads and as 2 processes (gloo, one thread each) with 8 samples each, which is what
Kiln's global batch means (DDP's batch is per process). Prints the median step time and
samples per second in bench/dist.sh's columns.      dist_torch.py [--steps N]"""
import argparse, os, statistics, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_gpt import GPT, V, T  # noqa: E402

BATCH = 16


def worker(rank, world, steps, threads, out):
    torch.set_num_threads(threads)
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29513")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = GPT()
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(rank)
    per = BATCH // world
    times = []
    for step in range(steps + 2):
        batch = torch.randint(0, V, (per, T + 1), generator=g)
        t0 = time.perf_counter()
        loss = F.cross_entropy(ddp(batch[:, :-1]).reshape(-1, V), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= 2:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        ms = 1000 * statistics.median(times)
        out.put(f"torch-gpt    {world} x {threads}            {per:4d}     {ms:8.1f}  {BATCH * 1000 / ms:9.1f}  (PyTorch {torch.__version__}, "
                f"{'DDP gloo' if world > 1 else 'one process'})")
    if world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    for world, threads in ((1, 2), (2, 1)):
        q = ctx.Queue()
        procs = [ctx.Process(target=worker, args=(r, world, a.steps, threads, q)) for r in range(world)]
        for p in procs:
            p.start()
        line = q.get()
        for p in procs:
            p.join()
        print(line, flush=True)


if __name__ == "__main__":
    main()
