#!/usr/bin/env python3
"""torch_optim.py FILE -- Kiln's optimizers and schedules (tests/test_optim_parity.c) against
PyTorch's own.

FILE is JSON written by test_optim_parity.c:
  "optim": cases of N optimizer steps on a few named parameters with fixed gradients; each
    parameter is its own torch param group with the lr and weight_decay Kiln used for it
    (weight_decay 0 where Kiln's decay does not apply). torch.optim runs the single-tensor
    path (foreach=False); Lion, not in torch.optim, is lucidrains/lion-pytorch's step
    written out below. The parameters after every step and the state after the last are
    compared within a relative 1e-5 of each tensor's largest element.
  "sched": learning rates of Kiln's schedules for each step against torch.optim.lr_scheduler
    stepped once per optimizer step, within a relative 1e-6.
Exit status: 0 all match, 1 a mismatch (listed), 77 no PyTorch."""
import json
import math
import sys

try:
    import torch
except ImportError:
    print("PyTorch is not installed")
    sys.exit(77)

torch.set_default_dtype(torch.float32)


def lion_step(group, state):
    # lucidrains/lion-pytorch, lion_pytorch.py: update_fn
    lr, wd = group["lr"], group["weight_decay"]
    beta1, beta2 = group["betas"]
    for p in group["params"]:
        grad = p.grad
        st = state.setdefault(p, {"exp_avg": torch.zeros_like(p)})
        exp_avg = st["exp_avg"]
        p.data.mul_(1 - lr * wd)
        update = exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_()
        p.add_(update, alpha=-lr)
        exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)


def close(a, b, rel):
    scale = max(float(b.abs().max()), 1e-30)
    return float((a - b).abs().max()) <= rel * scale


def run_optim(case):
    names = [p["name"] for p in case["params"]]
    params = [torch.tensor(p["data"], dtype=torch.float32).reshape(p["shape"]).requires_grad_(False) for p in case["params"]]
    groups = [{"params": [t], "lr": p["lr"], "weight_decay": p["weight_decay"]} for t, p in zip(params, case["params"])]
    kind, args = case["kind"], dict(case["args"])
    lion_state = {}
    if kind == "Lion":
        opt = None
        for g in groups:
            g["betas"] = tuple(args["betas"])
    else:
        if "betas" in args:
            args["betas"] = tuple(args["betas"])
        opt = getattr(torch.optim, kind)(groups, foreach=False, **args)
    bad = []
    for step, grads in enumerate(case["grads"]):
        for t, g, p in zip(params, grads, case["params"]):
            t.grad = torch.tensor(g, dtype=torch.float32).reshape(p["shape"])
        with torch.no_grad():
            if opt is None:
                for g in groups:
                    lion_step(g, lion_state)
            else:
                opt.step()
        for t, name, want in zip(params, names, case["after"][step]):
            got = torch.tensor(want, dtype=torch.float32).reshape(t.shape)
            if not close(got, t, 1e-5):
                bad.append("%s step %d: %s: kiln %s torch %s" % (case["name"], step + 1, name, got.flatten()[:6].tolist(),
                                                                 t.flatten()[:6].tolist()))
    state = lion_state if opt is None else opt.state
    for key, per_param in case["state"].items():
        for t, name, want in zip(params, names, per_param):
            ref = state[t][key]
            got = torch.tensor(want, dtype=torch.float32).reshape(t.shape)
            if not close(got, ref, 1e-5):
                bad.append("%s: state %s of %s: kiln %s torch %s" % (case["name"], key, name, got.flatten()[:6].tolist(),
                                                                     ref.flatten()[:6].tolist()))
    return bad


def torch_schedule(case, opt):
    s = torch.optim.lr_scheduler
    kind, a = case["kind"], case["args"]
    total = case["total_steps"]
    if kind == "onecycle":
        return s.OneCycleLR(opt, max_lr=a.get("max_lr", case["lr"]), total_steps=total, pct_start=a["pct_start"], anneal_strategy=a["anneal_strategy"],
                            div_factor=a["div_factor"], final_div_factor=a["final_div_factor"], three_phase=a["three_phase"],
                            cycle_momentum=False)
    if kind == "exponential":
        return s.ExponentialLR(opt, gamma=a["gamma"])
    if kind == "polynomial":
        return s.PolynomialLR(opt, total_iters=a["total_iters"], power=a["power"])
    if kind == "cosine_restarts":
        return s.CosineAnnealingWarmRestarts(opt, T_0=a["T_0"], T_mult=a["T_mult"], eta_min=a["eta_min"])
    raise ValueError(kind)


def run_sched(case):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=case["lr"])
    sch = torch_schedule(case, opt)
    bad = []
    for step, want in enumerate(case["lrs"]):
        got = opt.param_groups[0]["lr"]
        if abs(got - want) > 1e-6 * max(abs(got), 1e-12):
            bad.append("%s step %d: kiln %.10g torch %.10g" % (case["name"], step, want, got))
        opt.step()
        sch.step()
    return bad


def main():
    with open(sys.argv[1]) as f:
        data = json.load(f)
    bad = []
    for case in data.get("optim", []):
        bad += run_optim(case)
    for case in data.get("sched", []):
        bad += run_sched(case)
    print("torch %s: %d optimizer cases, %d schedules, %d mismatches" % (torch.__version__, len(data.get("optim", [])),
                                                                          len(data.get("sched", [])), len(bad)))
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
