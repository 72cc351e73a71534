#!/usr/bin/python3
"""Reference trajectories of PyTorch's optimizers, gradient clipping and LR schedules for dtrain's tests.

Writes tests/fixtures/optim_<case>.bin in the DTFIX001 format of gen_fixtures.py. Regenerate with
    /usr/bin/python3 tests/gen_optim_fixtures.py [outdir]

Each case optimises four parameter tensors of shapes (3,2), (3,), (2,3), (2,) -- the parameters of
Linear(2,3) and Linear(3,2), in that order -- for STEPS steps with gradients fixed in advance.
Records:
  cfg     [optim (0 sgd, 1 adam, 2 adamw), lr, momentum, dampening, weight_decay, nesterov, beta1, beta2,
           eps, clip_norm (0 none), sched (0 constant, 1 multistep, 2 cosine), milestone1, milestone2,
           gamma, t_max, min_lr, warmup, warmup_start, steps, frozen (number of leading tensors frozen)]
  p0      initial parameters, all tensors concatenated
  grads   [steps, n] the gradient given at each step (frozen tensors' entries included, ignored)
  traj    [steps, n] parameters after each step
  lrs     [steps] learning rate used at each step
  norms   [steps] total gradient norm returned by clip_grad_norm_ (0 when clip_norm is 0)
The schedule is stepped once per optimizer step (t = 0, 1, ...); warm-up is SequentialLR(LinearLR, main).
"""
import math
import os
import struct
import sys

import torch

MAGIC = b"DTFIX001"
SHAPES = [(3, 2), (3,), (2, 3), (2,)]
STEPS = 20


def write(path, records):
    with open(path, "wb") as f:
        f.write(MAGIC)
        for name, t in records:
            t = torch.as_tensor(t, dtype=torch.float32).detach().contiguous()
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<I", t.dim()))
            for d in t.shape:
                f.write(struct.pack("<q", d))
            f.write(t.numpy().astype("<f4").tobytes())


def run(case_id, optim="sgd", lr=0.1, momentum=0.0, dampening=0.0, wd=0.0, nesterov=False, betas=(0.9, 0.999),
        eps=1e-8, clip=0.0, sched="constant", milestones=(5, 12), gamma=0.1, t_max=15, min_lr=0.0, warmup=0,
        warmup_start=1.0 / 3.0, frozen=0):
    torch.manual_seed(100 + case_id)
    params = [torch.randn(s) for s in SHAPES]
    p0 = torch.cat([p.flatten() for p in params]).clone()
    grads = [[torch.randn(s) * 0.5 for s in SHAPES] for _ in range(STEPS)]
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    train = ps[frozen:]
    if optim == "sgd":
        opt = torch.optim.SGD(train, lr=lr, momentum=momentum, dampening=dampening, weight_decay=wd, nesterov=nesterov)
    elif optim == "adam":
        opt = torch.optim.Adam(train, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    else:
        opt = torch.optim.AdamW(train, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    if sched == "multistep":
        main = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=list(milestones), gamma=gamma)
    elif sched == "cosine":
        main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=t_max, eta_min=min_lr)
    else:
        main = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0)
    if warmup:
        warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=warmup_start, total_iters=warmup)
        scheduler = torch.optim.lr_scheduler.SequentialLR(opt, [warm, main], milestones=[warmup])
    else:
        scheduler = main
    traj, lrs, norms = [], [], []
    for s in range(STEPS):
        for p, g in zip(ps, grads[s]):
            p.grad = g.clone()
        lrs.append(opt.param_groups[0]["lr"])
        if clip > 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(train, clip)))
        else:
            norms.append(0.0)
        opt.step()
        scheduler.step()
        traj.append(torch.cat([p.detach().flatten() for p in ps]).clone())
    sk = {"constant": 0, "multistep": 1, "cosine": 2}[sched]
    ok = {"sgd": 0, "adam": 1, "adamw": 2}[optim]
    cfg = [ok, lr, momentum, dampening, wd, 1.0 if nesterov else 0.0, betas[0], betas[1], eps, clip, sk,
           milestones[0], milestones[1], gamma, t_max, min_lr, warmup, warmup_start, STEPS, frozen]
    return [("cfg", cfg), ("p0", p0), ("grads", torch.stack([torch.cat([g.flatten() for g in gs]) for gs in grads])),
            ("traj", torch.stack(traj)), ("lrs", lrs), ("norms", norms)]


CASES = {
    "sgd_plain": dict(optim="sgd", lr=0.1),
    "sgd_momentum": dict(optim="sgd", lr=0.05, momentum=0.9, dampening=0.1, wd=5e-4),
    "sgd_nesterov": dict(optim="sgd", lr=0.05, momentum=0.9, wd=1e-3, nesterov=True),
    "sgd_multistep": dict(optim="sgd", lr=0.1, momentum=0.9, wd=1e-4, sched="multistep", milestones=(5, 12), gamma=0.1),
    "sgd_warmup_cosine": dict(optim="sgd", lr=0.2, momentum=0.5, sched="cosine", t_max=12, min_lr=0.01, warmup=4,
                              warmup_start=0.25),
    "sgd_clip": dict(optim="sgd", lr=0.1, momentum=0.9, clip=0.8),
    "adam": dict(optim="adam", lr=0.01),
    "adam_wd": dict(optim="adam", lr=0.01, betas=(0.8, 0.99), eps=1e-6, wd=0.01),
    "adamw": dict(optim="adamw", lr=0.01, wd=0.05),
    "adam_cosine_clip": dict(optim="adam", lr=0.003, sched="cosine", t_max=20, min_lr=1e-4, clip=1.0),
    "sgd_frozen": dict(optim="sgd", lr=0.1, momentum=0.9, wd=1e-3, frozen=2, clip=0.5),
    "adamw_frozen_multistep": dict(optim="adamw", lr=0.01, wd=0.01, frozen=1, sched="multistep", milestones=(3, 9),
                                   gamma=0.5, warmup=2, warmup_start=0.5),
}

if __name__ == "__main__":
    torch.set_num_threads(1)
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    os.makedirs(out, exist_ok=True)
    for i, (name, kw) in enumerate(CASES.items()):
        write(os.path.join(out, f"optim_{name}.bin"), run(i, **kw))
        print("wrote", f"optim_{name}.bin")
