#!/usr/bin/env python3
"""The scaling model of docs/distributed.md: one data-parallel step of gpt2-124m on N
machines, from bench/dist.sh's measured figures (give them as arguments).

  compute(N)   = tokens per step x seconds per token (one machine) / N
  allreduce(N) = 2 (N - 1) / N x gradient bytes / bandwidth  (a ring: each machine sends and
                 receives that much), not overlapped with the compute: OpenMPI progresses
                 a non-blocking all-reduce only inside MPI calls (measured: the 2-rank step
                 waited 35 ms for a 2.3 s transfer that its hooks had carried out)
  fixed        = what every machine repeats in full whatever N: the update (gradient norm,
                 clipping, AdamW over all 124M parameters); derived from the 2-rank
                 measurement (2 ranks x 1 thread on one 2-CPU machine took 32.56 s, one rank
                 x 2 threads 27.13 s, the all-reduce 2.26 s of the difference: 3.2 s left)
  step(N)      = compute(N) + fixed + allreduce(N); efficiency = compute(1) / (N step(N)).

  dist_scaling.py --step-s 27.13 --tokens 1024 --attention 1.16 --grad-mb 497.8 --measured-gbs 0.22 --fixed-s 3.2"""
import argparse

ap = argparse.ArgumentParser()
ap.add_argument("--step-s", type=float, required=True, help="measured step seconds on one machine")
ap.add_argument("--tokens", type=int, required=True, help="tokens of that step")
ap.add_argument("--attention", type=float, default=1.0, help="cost per token at T=1024 over the measured T")
ap.add_argument("--grad-mb", type=float, required=True)
ap.add_argument("--measured-gbs", type=float, required=True, help="the all-reduce's measured GB/s")
ap.add_argument("--fixed-s", type=float, default=0, help="seconds every machine repeats per step")
ap.add_argument("--global-tokens", type=int, default=512 * 1024, help="tokens of a global step (GPT-2: 512 x 1024)")
a = ap.parse_args()
per_token = a.step_s / a.tokens * a.attention
t1 = per_token * a.global_tokens
links = [("measured", a.measured_gbs), ("10 Gb/s", 1.25), ("100 Gb/s", 12.5)]
print(f"one machine: {per_token * 1e3:.1f} ms per token, {t1:.0f} s per step of {a.global_tokens} tokens")
print("machines  compute s  " + "  ".join(f"{n:>8s} all-reduce s  eff" for n, _ in links))
for n in (1, 2, 4, 8, 16, 32, 64):
    c = t1 / n
    cells = []
    for _, gbs in links:
        ar = 2 * (n - 1) / n * a.grad_mb / 1e3 / gbs
        cells.append(f"{ar:21.2f}  {c / (c + a.fixed_s * (n > 1) + ar):4.0%}")
    print(f"{n:8d}  {c:9.0f}  " + "  ".join(cells))
