#!/usr/bin/env python3
"""JAX/XLA's training step of models/gpt.kiln, for bench/attention.sh's comparison (issue 38):
bench/reference_gpt.py's GPT in JAX (4 layers, 4 heads, width 128, tied head, GPT-2 init;
AdamW lr 3e-4, betas 0.9/0.95, weight decay 0.1 on matrices, gradient norm clipped to 1.0),
the whole step (forward, backward, clip, update) one jax.jit function, its attention
written out (mask, softmax) or jax.nn.dot_product_attention (JAX's fused SDPA, is_causal).
Random tokens: the time of a step does not depend on them. Prints the median of --steps
timed steps after --warmup (the first compiles) and the peak RSS, as bench/torch_bench.py:

    jax_bench.py [--seq T] [--batch B] [--steps N] [--sdpa]

    bench: {"train_step_ms_median": ..., "train_rss_mb": ...}
XLA's CPU threads: the machine's (bench/attention.sh runs it on 2 cores)."""
import argparse, json, math, resource, statistics, time

import jax
import jax.numpy as jnp

V, C, L, H = 256, 128, 4, 4


def init(key, T):
    keys = iter(jax.random.split(key, 64))
    normal = lambda shape, std: std * jax.random.normal(next(keys), shape, jnp.float32)
    proj = 0.02 / math.sqrt(2 * L)
    blocks = [dict(ln_1=(jnp.ones(C), jnp.zeros(C)), ln_2=(jnp.ones(C), jnp.zeros(C)),
                   c_attn=(normal((C, 3 * C), 0.02), jnp.zeros(3 * C)), attn_proj=(normal((C, C), proj), jnp.zeros(C)),
                   c_fc=(normal((C, 4 * C), 0.02), jnp.zeros(4 * C)), mlp_proj=(normal((4 * C, C), proj), jnp.zeros(C)))
              for _ in range(L)]
    return dict(wte=normal((V, C), 0.02), wpe=normal((T, C), 0.02), h=blocks, ln_f=(jnp.ones(C), jnp.zeros(C)))


def layer_norm(x, p):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5) * p[0] + p[1]


def linear(x, p):
    return x @ p[0] + p[1]


def attention(q, k, v, sdpa):
    """q, k, v [B, T, H, D]; the output [B, T, H, D]."""
    if sdpa:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)
    t, d = q.shape[1], q.shape[3]
    att = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d)
    att = jnp.where(jnp.tril(jnp.ones((t, t), bool)), att, -jnp.inf)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(att, axis=-1), v)


def loss_fn(params, idx, targets, sdpa):
    B, T = idx.shape
    x = params["wte"][idx] + params["wpe"][:T]
    for p in params["h"]:
        q, k, v = jnp.split(linear(layer_norm(x, p["ln_1"]), p["c_attn"]), 3, axis=-1)
        y = attention(*(z.reshape(B, T, H, C // H) for z in (q, k, v)), sdpa).reshape(B, T, C)
        x = x + linear(y, p["attn_proj"])
        x = x + linear(jax.nn.gelu(linear(layer_norm(x, p["ln_2"]), p["c_fc"]), approximate=True), p["mlp_proj"])
    logits = layer_norm(x, params["ln_f"]) @ params["wte"].T
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def make_step(sdpa, lr=3e-4, b1=0.9, b2=0.95, wd=0.1, clip=1.0, eps=1e-8):
    def step(params, m, v, t, idx, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, idx, targets, sdpa)
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
        scale = jnp.minimum(1.0, clip / (norm + 1e-6))
        grads = jax.tree_util.tree_map(lambda g: g * scale, grads)
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t

        def update(p, m, v):  # weight decay on matrices, as the recipe
            p = p * (1 - lr * wd) if p.ndim == 2 else p
            return p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps)

        return jax.tree_util.tree_map(update, params, m, v), m, v, loss

    return jax.jit(step, donate_argnums=(0, 1, 2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--sdpa", action="store_true", help="jax.nn.dot_product_attention")
    a = ap.parse_args()
    key = jax.random.PRNGKey(0)
    params = init(key, a.seq)
    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (a.batch, a.seq + 1), 0, V)
    idx, targets = tokens[:, :-1], tokens[:, 1:]
    step = make_step(a.sdpa)
    times = []
    for t in range(1, a.warmup + a.steps + 1):
        start = time.perf_counter()
        params, m, v, loss = step(params, m, v, float(t), idx, targets)
        loss.block_until_ready()
        if t > a.warmup:
            times.append((time.perf_counter() - start) * 1000)
    print("bench: " + json.dumps({"model": "gpt", "jax": jax.__version__, "seq": a.seq, "batch": a.batch, "sdpa": a.sdpa,
                                  "train_step_ms_median": round(statistics.median(times), 3),
                                  "train_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                                  "loss": float(loss)}))


if __name__ == "__main__":
    main()
