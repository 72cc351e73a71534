#!/usr/bin/python3
"""tests/diff_torch.py - dtrain's differential test's graphs against float64 PyTorch.

    tests/diff_torch.py DIR [--graph I] [-v]

DIR is what `test_diff --graphs N --dump DIR` wrote: per graph i, DIR/gNNNN.txt (the graph: its nodes, its
steps' optimizers, the layout of the flat parameter and buffer arrays) and DIR/gNNNN.bin (the input, the
labels, the state each step starts from and the default CPU tier's results). For each graph this builds the
same network in PyTorch (an interpreter over the node list, its parameters and buffers loaded from the flat
arrays by the layout) and, for each of the four steps (2 SGD, 2 Adam), from the dumped state: forward, loss and
backward in float64, compared with dtrain's logits, loss, running statistics, input gradient and every
parameter tensor's gradient; dtrain's parameters after its optimizer step against torch.optim's float64 step
on dtrain's own gradients; after the last step, dtrain's eval-mode logits against a float64 eval-mode forward
pass on dtrain's new parameters and buffers.

Tolerance. The same step runs twice more in float32 PyTorch (its own kernels: an independent float32
implementation), from the state and from the state moved by one unit in the last place (x, parameters and
buffers times 1 +- 2^-23), both with the ReLU masks and max pooling choices of the float64 run (so that their
difference is rounding, not a decision taken otherwise). A tensor passes when its largest difference from
float64 is at most C times float32 PyTorch's larger one plus F times the larger of its largest float64 value
and `family`, the largest value of its kind in the model (all gradients, all buffers): a gradient that is
rounding in exact arithmetic (a bias's before a batch norm) is held to the scale of its kind. The loss may
move by twice its logits' tolerance more. The run from the moved state is there for ill-conditioned graphs
(batch norm over two samples): float32 PyTorch from the exact state can be luckily exact there, 100 times
closer than float32 rounding allows. C and F: on 1000 graphs (seeds 20261127 and 7; 75,000 tensors)
dtrain's error over float32 PyTorch's had a median of 0.45, 99.9% under 17, at most 18 where the loss is
cross entropy and 78 where it was NLL on dtrain's log_softmax (dt_body_log_softmax_row computed x - (max +
log sum), rounding the sum to the largest logit's ulp, where PyTorch's (x - max) - log sum keeps a saturated
class's log-probability exact; dtrain now computes it PyTorch's way, and the worst of those graphs fell from 0.62
of its tolerance to 0.01); F needed at most 2e-8 with C = 128. C = 128 and F = 4e-6 (test_diff's). Every run
prints the distribution. The parameters after a step
are held to torch.optim's float64 update of dtrain's own gradients within the float32 rounding of the
update's inputs and result (Adam's first step turns gradients of +-1e-9, rounding, into steps of +-lr; the
gradients themselves are held to PyTorch's).

ReLU and max pooling decide discontinuously: dtrain's masks and argmaxes are compared with float64 PyTorch's;
a step where one differs still has its forward values compared, but its gradients and parameters are left
out and counted (more than 5% of the steps left out fail), and a decision taken otherwise where the float64
value is not within rounding of the boundary (1e-4 of the node's largest value, or C times float32 PyTorch's
difference there) fails; so does an argmax outside its window.

The last line is "N passed, M failed" (tests/run.sh adds them up): one test for every graph matching, one for
the steps left out (few, and each decision within rounding). Without torch it says it skipped and passes.
"""
import argparse
import glob
import math
import os
import re
import struct
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    print("skip diff_torch: python3-torch is not installed")
    print("0 passed, 0 failed")
    sys.exit(0)

C_SPREAD = 128.0     # dtrain's error may be this many times float32 PyTorch's ...
F_FLOOR = 4e-6       # ... plus this times the tensor's (or its kind's) largest value
FLIPS_MAX = 0.05     # the share of steps that a ReLU or pooling decision may leave out
BOUNDARY = 1e-4      # a decision taken otherwise is within rounding when the value is this close (relative) ...
STEPS = 4            # 2 SGD, then 2 Adam

f32 = lambda v: float(np.float32(v))


# ---------------------------------------------------------------------------------------------- reading
class Node:
    def __init__(self, nid, op, in0):
        self.id, self.op, self.in0, self.in1 = nid, op, in0, -1
        self.f = {}


class Graph:
    pass


def read_graph(path):
    G = Graph()
    G.nodes, G.steps, G.params, G.buffers = [], [], [], []
    with open(path) as fh:
        for line in fh:
            t = line.split()
            if not t:
                continue
            if t[0] == "graph":
                G.index, G.seed = int(t[1]), int(t[3])
            elif t[0] == "input":
                G.c, G.h, G.w, G.batch, G.classes = int(t[1]), int(t[2]), int(t[3]), int(t[5]), int(t[7])
                G.eval = t[9] == "eval"
            elif t[0] == "node":
                n = Node(int(t[1]), t[2], int(t[4]))
                r = t[5:]
                if n.op == "add":
                    n.in1 = int(r[0])
                elif n.op in ("conv", "maxpool", "avgpool"):
                    k = r.index("k")
                    n.f["k"] = (int(r[k + 1]), int(r[k + 2]))
                    n.f["s"] = (int(r[k + 4]), int(r[k + 5]))
                    n.f["p"] = (int(r[k + 7]), int(r[k + 8]))
                    if n.op == "conv":
                        n.f["oc"] = int(r[r.index("oc") + 1])
                        n.f["bias"] = int(r[r.index("bias") + 1])
                else:
                    for i in range(0, len(r) - 1, 2):
                        n.f[r[i]] = float(r[i + 1])
                if n.id != len(G.nodes) + 1:
                    raise ValueError("%s: node %d out of order" % (path, n.id))
                G.nodes.append(n)
            elif t[0] == "step":
                s = {"kind": t[2]}
                for i in range(3, len(t) - 1, 2):
                    s[t[i]] = float(t[i + 1])
                G.steps.append(s)
            elif t[0] in ("param", "buffer"):
                e = (t[1], int(t[3]), int(t[5]), int(t[7]))
                (G.params if t[0] == "param" else G.buffers).append(e)
    return G


def read_bin(path):
    out = {}
    with open(path, "rb") as fh:
        b = fh.read()
    if b[:8] != b"DTFIX001":
        raise ValueError("%s: not a DTFIX001 file" % path)
    o = 8
    while o < len(b):
        (ln,) = struct.unpack_from("<I", b, o); o += 4
        name = b[o:o + ln].decode(); o += ln
        (nd,) = struct.unpack_from("<I", b, o); o += 4
        dims = struct.unpack_from("<%dq" % nd, b, o); o += 8 * nd
        cnt = int(np.prod(dims)) if nd else 1
        out[name] = np.frombuffer(b, dtype="<f4", count=cnt, offset=o).reshape(dims)
        o += 4 * cnt
    return out


# ---------------------------------------------------------------------------------------------- the network
def param_tensors(G, flat, dtype, grad):
    """{node: {'weight': t, 'bias': t}} from the flat parameter array by the layout, in the layout's order"""
    P, order = {}, []
    nodes = {n.id: n for n in G.nodes}
    for name, nid, off, cnt in G.params:
        kind = name.rsplit(".", 1)[1]
        n = nodes[nid]
        v = torch.tensor(np.asarray(flat[off:off + cnt], dtype=np.float64), dtype=dtype)
        if kind == "weight" and n.op == "conv":
            o, (kh, kw) = n.f["oc"], n.f["k"]
            v = v.reshape(o, cnt // (o * kh * kw), kh, kw)
        elif kind == "weight" and n.op == "linear":
            o = int(n.f["out"])
            v = v.reshape(o, cnt // o)
        v.requires_grad_(grad)
        P.setdefault(nid, {})[kind] = v
        order.append(v)
    return P, order


def buffer_tensors(G, flat, dtype):
    Bf, order = {}, []
    for name, nid, off, cnt in G.buffers:
        v = torch.tensor(np.asarray(flat[off:off + cnt], dtype=np.float64), dtype=dtype)
        Bf.setdefault(nid, {})[name.rsplit(".", 1)[1]] = v
        order.append(v)
    return Bf, order


def forward(G, x, P, Bf, training, masks, force=None):
    """The graph's output for x. masks: {node: dropout mask} (None: no dropout); force: the ReLU masks and
    pooling indices to use ({node: tensor}, from the float64 run), or None to decide. Returns the output and
    rec: {node: (the node's input, the decision)} for every ReLU and max pooling."""
    vals, rec = {0: x}, {}
    B = x.shape[0]
    for n in G.nodes:
        a = vals[n.in0]
        if n.op == "conv":
            p = P[n.id]
            y = F.conv2d(a, p["weight"], p.get("bias"), stride=n.f["s"], padding=n.f["p"])
        elif n.op == "bn":
            p, b = P.get(n.id, {}), Bf[n.id]
            y = F.batch_norm(a, b["running_mean"], b["running_var"], p.get("weight"), p.get("bias"), training,
                             f32(n.f["momentum"]), f32(n.f["eps"]))
        elif n.op == "relu":
            if force is None:
                y = F.relu(a)
                rec[n.id] = (a, y > 0)
            else:
                y = a * force[n.id].to(a.dtype)
                rec[n.id] = (a, force[n.id])
        elif n.op == "maxpool":
            (kh, kw), (sh, sw), (ph, pw) = n.f["k"], n.f["s"], n.f["p"]
            if force is None:
                y, idx = F.max_pool2d(a, (kh, kw), (sh, sw), (ph, pw), return_indices=True)
            else:
                idx = force[n.id]
                y = a.flatten(2).gather(2, idx.flatten(2)).view(idx.shape)
            rec[n.id] = (a, idx)
        elif n.op == "avgpool":
            y = F.avg_pool2d(a, n.f["k"], n.f["s"], n.f["p"], count_include_pad=True)
        elif n.op == "gap":
            y = a.mean(dim=(2, 3))
        elif n.op == "flatten":
            y = a.reshape(B, -1)
        elif n.op == "linear":
            p = P[n.id]
            y = F.linear(a, p["weight"], p.get("bias"))
        elif n.op == "add":
            y = a + vals[n.in1]
        elif n.op == "pad_shortcut":
            s, c = int(n.f["s"]), a.shape[1]
            e = (int(n.f["oc"]) - c) // 2
            y = F.pad(a[:, :, ::s, ::s], (0, 0, 0, 0, e, e))
        elif n.op == "dropout":
            y = a if masks is None else a * masks[n.id].reshape(a.shape)
        elif n.op == "log_softmax":
            y = F.log_softmax(a, dim=1)
        else:
            raise ValueError("graph %d: unknown node kind %s" % (G.index, n.op))
        vals[n.id] = y
    return vals[G.nodes[-1].id], rec


def flat(ts):
    return np.concatenate([t.detach().double().reshape(-1).numpy() for t in ts]) if ts else np.zeros(0)


def perturbed(G, D, k, keys):
    """D with the records `keys` moved by one unit in the last place of float32 (each element times 1 +- 2^-23,
    the sign drawn per element; the same draw on every run of graph G's step k)"""
    rng = np.random.default_rng([G.seed % 2 ** 32, G.index, k])
    Dp = dict(D)
    for key in keys:
        a = D[key].astype(np.float32)
        Dp[key] = a * np.where(rng.integers(0, 2, a.shape) == 1, np.float32(1 + 2.0 ** -23), np.float32(1 - 2.0 ** -23))
    return Dp


def run_step(G, D, k, dtype, force=None):
    """step k from its dumped state in dtype: logits, loss, gradients, the input's gradient, buffers after"""
    training = not G.eval
    P, porder = param_tensors(G, D["p%d" % k], dtype, True)
    Bf, border = buffer_tensors(G, D["b%d" % k], dtype)
    x = torch.tensor(D["x"].astype(np.float64), dtype=dtype, requires_grad=True)
    masks = None
    if training:
        masks = {n.id: torch.tensor(D["mask%d_%d" % (k, n.id)].astype(np.float64), dtype=dtype)
                 for n in G.nodes if n.op == "dropout"}
    out, rec = forward(G, x, P, Bf, training, masks, force)
    labels = torch.tensor(D["labels"].astype(np.int64))
    loss = F.nll_loss(out, labels) if G.nodes[-1].op == "log_softmax" else F.cross_entropy(out, labels)
    loss.backward()
    for t in porder:
        if t.grad is None:
            t.grad = torch.zeros_like(t)
    return {"logits": out.detach(), "loss": loss.detach(), "grads": flat([t.grad for t in porder]),
            "dx": x.grad.detach(), "bufs": flat(border), "rec": rec, "porder": porder}


def eval_logits(G, D, pflat, bflat, dtype, force=None):
    with torch.no_grad():
        P, _ = param_tensors(G, pflat, dtype, False)
        Bf, _ = buffer_tensors(G, bflat, dtype)
        x = torch.tensor(D["x"].astype(np.float64), dtype=dtype)
        return forward(G, x, P, Bf, False, None, force)


# ---------------------------------------------------------------------------------------------- the optimizer
def torch_update(G, D, k, grads):
    """the parameters after torch.optim's step k (float64) from the dumped state on gradients `grads`"""
    s = G.steps[k]
    P, porder = param_tensors(G, D["p%d" % k], torch.float64, False)
    opt, ost = D["o%d" % k], D["ost%d" % k]
    npar = D["p%d" % k].size
    lr = f32(s["lr"])
    if s["kind"] == "sgd":
        mom = f32(s["momentum"])
        o = torch.optim.SGD(porder, lr=lr, momentum=mom, dampening=0.0, weight_decay=f32(s["wd"]),
                            nesterov=bool(int(s["nesterov"])), foreach=False)
    else:
        cls = torch.optim.AdamW if int(s["decoupled"]) else torch.optim.Adam
        o = cls(porder, lr=lr, betas=(f32(s["beta1"]), f32(s["beta2"])), eps=f32(s["eps"]),
                weight_decay=f32(s["wd"]), foreach=False)
    for t, (name, nid, off, cnt) in zip(porder, G.params):
        t.grad = torch.tensor(grads[off:off + cnt].astype(np.float64)).reshape(t.shape)
        ti = G.params.index((name, nid, off, cnt))
        steps = int(ost[ti])
        if s["kind"] == "sgd":
            if mom != 0.0 and steps > 0:
                o.state[t]["momentum_buffer"] = torch.tensor(opt[off:off + cnt].astype(np.float64)).reshape(t.shape)
        else:
            o.state[t]["step"] = torch.tensor(float(steps))
            o.state[t]["exp_avg"] = torch.tensor(opt[off:off + cnt].astype(np.float64)).reshape(t.shape)
            o.state[t]["exp_avg_sq"] = torch.tensor(opt[npar + off:npar + off + cnt].astype(np.float64)).reshape(t.shape)
    o.step()
    return flat(porder)


def formula_update(G, D, k, grads):
    """the update by dtrain's formulas (float32 constants), in float64, and what float32 rounding of its
    inputs (g + wd p, Adam's first moment: sums that may cancel) and of its result may move each parameter"""
    s = G.steps[k]
    p = D["p%d" % k].astype(np.float64)
    g = grads.astype(np.float64)
    opt = D["o%d" % k].astype(np.float64)
    steps = np.zeros(p.size)
    for ti, (name, nid, off, cnt) in enumerate(G.params):
        steps[off:off + cnt] = D["ost%d" % k][ti]
    lr = f32(s["lr"])
    eps23 = 2.0 ** -23
    if s["kind"] == "sgd":
        mom, wd = f32(s["momentum"]), f32(s["wd"])
        dd = eps23 * (np.abs(g) + np.abs(wd * p))
        d = g + wd * p
        if mom != 0.0:
            buf = np.where(steps == 0, d, mom * (opt if opt.size else 0.0) + d)
            dd = 2.0 * (dd + eps23 * (np.abs(buf) + np.abs(d)))
            d = d + mom * buf if int(s["nesterov"]) else buf
        want = p - lr * d
        slack = lr * dd + 2.0 ** -22 * (np.abs(p) + lr * np.abs(d))
        return want, slack
    b1, b2, eps, wd = np.float32(s["beta1"]), np.float32(s["beta2"]), f32(s["eps"]), f32(s["wd"])
    m0, v0 = opt[:p.size], opt[p.size:]
    t = steps + 1.0
    bc1, bc2 = 1.0 - float(b1) ** t, 1.0 - float(b2) ** t
    c1, c2 = float(np.float32(1) - b1), float(np.float32(1) - b2)

    def upd(d):
        m = float(b1) * m0 + c1 * d
        v = float(b2) * v0 + c2 * d * d
        return (lr / bc1) * m / (np.sqrt(v) / np.sqrt(bc2) + eps)

    d = g.copy()
    if int(s["decoupled"]):
        p = p * float(np.float32(1) - np.float32(lr) * np.float32(wd))
    else:
        d = d + wd * p
    dd = eps23 * (np.abs(g) + np.abs(wd * p)) + eps23 * (np.abs(0.9 * m0) + np.abs(0.1 * d)) / 0.1
    u, um, up = upd(d), upd(d - dd), upd(d + dd)
    slack = np.maximum(np.abs(up - u), np.abs(um - u)) + 2.0 ** -21 * (np.abs(p) + np.abs(u))
    return p - u, slack


# ---------------------------------------------------------------------------------------------- comparing
def maxabs(a):
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0:
        return 0.0
    if not np.all(np.isfinite(a)):
        return math.inf
    return float(np.max(np.abs(a)))


def npd(t):
    return t.detach().double().reshape(-1).numpy() if torch.is_tensor(t) else np.asarray(t, dtype=np.float64).reshape(-1)


class Stats:
    def __init__(self):
        self.compared = 0
        self.fail_lines = []
        self.failed_graphs = set()
        self.worst_ratio, self.worst_what = 0.0, "-"
        self.worst_rel, self.worst_rel_what = 0.0, "-"
        self.over32 = []           # dtrain's error / float32 PyTorch's
        self.overscale = []        # dtrain's error / the tensor's (or its kind's) largest value
        self.over32_zero = 0       # tensors where float32 PyTorch was exact (it says nothing there)
        self.step_ratio, self.step_what = 0.0, "-"
        self.formula_vs_torch = 0.0
        self.steps, self.left_out = 0, 0
        self.far_flips = []
        self.flips_seen = 0
        self.records = []          # (graph, step, what, dtrain's error, float32 PyTorch's, the scale)


ST = Stats()
ARGS = None


def replay(G):
    return "replay: build/tests/test_diff --seed %d --graph %d --dump DIR; tests/diff_torch.py DIR --graph %d" % (
        G.seed, G.index, G.index)


def fail(G, msg):
    ST.failed_graphs.add(G.index)
    if len(ST.fail_lines) < 60:
        line = "    FAIL graph %d (seed %d), %s\n      %s" % (G.index, G.seed, msg, replay(G))
        ST.fail_lines.append(line)
        print(line)


def compare(G, k, what, dt, t64, t32, family=0.0, extra=0.0):
    """t32: float32 PyTorch's runs of the tensor (from the state, and from the state moved by one ulp)"""
    dt, t64 = npd(dt), npd(t64)
    if dt.size != t64.size:
        fail(G, "step %d, %s: dtrain has %d values, PyTorch %d" % (k, what, dt.size, t64.size))
        return math.inf
    e, r = maxabs(dt - t64), maxabs(t64)
    e32s = [maxabs(npd(t) - t64) for t in t32]
    e32 = max(e32s)
    scale = max(r, family)
    tol = C_SPREAD * e32 + F_FLOOR * scale + extra
    ratio = e / tol if tol > 0 else (math.inf if e > 0 else 0.0)
    ST.compared += 1
    ST.records.append((G.index, k, what, e, e32, scale, e32s[0]))
    if e32 > 0:
        ST.over32.append(e / e32)
    else:
        ST.over32_zero += 1
    if scale > 0:
        ST.overscale.append(e / scale)
    if r > 0 and e32 <= 1e-4 * r and e / r > ST.worst_rel:
        ST.worst_rel, ST.worst_rel_what = e / r, "graph %d, step %d, %s" % (G.index, k, what)
    if ratio > ST.worst_ratio:
        ST.worst_ratio, ST.worst_what = ratio, "graph %d, step %d, %s" % (G.index, k, what)
    if ARGS.v:
        print("      graph %d step %d %-32s dtrain %.3g, float32 torch %.3g, largest %.3g (of its kind %.3g): %.3g of "
              "the tolerance" % (G.index, k, what, e, e32, r, family, ratio))
    if not ratio <= 1.0:
        fail(G, "step %d, %s: largest difference from float64 PyTorch %.4g (relative %.3g) > tolerance %.4g "
             "(float32 PyTorch's difference %.3g, largest value %.3g, of its kind %.3g)" %
             (k, what, e, e / r if r > 0 else e, tol, e32, r, family))
    return tol


def check_decisions(G, k, D, R64, R32):
    """dtrain's ReLU masks and max pooling argmaxes against float64 PyTorch's; True when they agree. A
    decision taken otherwise must be within rounding of its boundary."""
    same = True
    for kind, key in (("relu", "relu%d" % k), ("maxpool", "argmax%d" % k)):
        dtv = D[key].reshape(-1)
        off = 0
        for n in G.nodes:
            if n.op != kind:
                continue
            a64, dec = R64["rec"][n.id]
            a32 = [R["rec"][n.id][0] for R in R32]
            cnt = dec.numel()
            mine = dtv[off:off + cnt]
            off += cnt
            if mine.size != cnt:
                fail(G, "step %d: dtrain's %s decisions are fewer than its nodes' outputs" % (k, kind))
                return False
            ref = dec.reshape(-1).numpy().astype(np.float64)
            bad = np.nonzero(mine.astype(np.float64) != ref)[0]
            if bad.size == 0:
                continue
            same = False
            ST.flips_seen += bad.size
            z = a64.detach().double()
            zmax = maxabs(npd(z))
            thr = max(BOUNDARY * zmax, C_SPREAD * max(maxabs(npd(a) - npd(z)) for a in a32))
            if kind == "relu":
                zf = npd(z)
                gap = np.abs(zf[bad])
                where = ["element %d: pre-activation %.4g, dtrain's mask %d" % (i, zf[i], int(mine[i])) for i in bad[:3]]
            else:
                N, Cc, H, W = z.shape
                oh, ow = dec.shape[2], dec.shape[3]
                (kh, kw), (sh, sw), (ph, pw) = n.f["k"], n.f["s"], n.f["p"]
                zp = z.reshape(N * Cc, H * W).numpy()
                gap, where = np.zeros(bad.size), []
                for j, i in enumerate(bad):
                    plane, pos = divmod(int(i), oh * ow)
                    oy, ox = divmod(pos, ow)
                    c = int(mine[i])
                    cy, cx = divmod(c, W) if c >= 0 else (-10 ** 9, 0)
                    y0, x0 = oy * sh - ph, ox * sw - pw
                    inside = y0 <= cy < y0 + kh and x0 <= cx < x0 + kw and 0 <= c < H * W
                    gap[j] = zp[plane, int(ref[i])] - zp[plane, c] if inside else math.inf
                    if j < 3:
                        where.append("output %d: PyTorch's maximum at %d (%.6g), dtrain's at %d (%s)" % (
                            i, int(ref[i]), zp[plane, int(ref[i])], c,
                            "%.6g" % zp[plane, c] if inside else "outside the window"))
            if ARGS.v:
                print("      graph %d step %d %s node %d: %d decisions taken otherwise, farthest %.3g from the "
                      "boundary (rounding: %.3g)" % (G.index, k, kind, n.id, bad.size, float(np.max(gap)), thr))
            if not float(np.max(gap)) <= thr:
                ST.far_flips.append(G.index)
                fail(G, "step %d, %s node %d: %d decisions differ from float64 PyTorch's, %.4g from the boundary, "
                     "more than rounding (%.3g): %s" % (k, kind, n.id, bad.size, float(np.max(gap)), thr,
                                                        "; ".join(where)))
        if off != dtv.size:
            fail(G, "step %d: dtrain has %d %s decisions, the graph's nodes %d" % (k, dtv.size, kind, off))
            return False
    return same


def compare_eval(G, D, k):
    """dtrain's eval-mode logits on its parameters and buffers after step k"""
    e64, rec = eval_logits(G, D, D["pnew%d" % k], D["bufs%d" % k], torch.float64)
    force = {nid: dec for nid, (a, dec) in rec.items()}
    Dp = perturbed(G, D, 4, ("x", "pnew%d" % k, "bufs%d" % k))
    e32 = [eval_logits(G, D, D["pnew%d" % k], D["bufs%d" % k], torch.float32, force)[0],
           eval_logits(G, Dp, Dp["pnew%d" % k], Dp["bufs%d" % k], torch.float32, force)[0]]
    compare(G, k, "eval-mode logits", D["eval"], e64, e32)


def run_graph(txt):
    G = read_graph(txt)
    D = read_bin(txt[:-4] + ".bin")
    G.D = D
    for k in range(STEPS):
        R64 = run_step(G, D, k, torch.float64)
        force = {nid: dec for nid, (a, dec) in R64["rec"].items()}
        R32 = [run_step(G, D, k, torch.float32, force),
               run_step(G, perturbed(G, D, k, ("x", "p%d" % k, "b%d" % k)), k, torch.float32, force)]
        ST.steps += 1
        tol = compare(G, k, "logits", D["logits%d" % k], R64["logits"], [R["logits"] for R in R32])
        compare(G, k, "loss", D["loss%d" % k], R64["loss"], [R["loss"] for R in R32], 0.0, 2.0 * tol)
        bfam = maxabs(R64["bufs"])
        for name, nid, off, cnt in G.buffers:
            compare(G, k, name, D["bufs%d" % k][off:off + cnt], R64["bufs"][off:off + cnt],
                    [R["bufs"][off:off + cnt] for R in R32], bfam)
        if k == STEPS - 1:
            compare_eval(G, D, k)
        if not check_decisions(G, k, D, R64, R32):
            ST.left_out += 1
            continue
        compare(G, k, "input gradient", D["dx%d" % k], R64["dx"], [R["dx"] for R in R32])
        gfam = maxabs(R64["grads"])
        for name, nid, off, cnt in G.params:
            compare(G, k, name + " gradient", D["grads%d" % k][off:off + cnt], R64["grads"][off:off + cnt],
                    [R["grads"][off:off + cnt] for R in R32], gfam)
        # the step: torch.optim's float64 update of dtrain's own gradients, within the rounding of its inputs
        grads = D["grads%d" % k].reshape(-1)
        want = torch_update(G, D, k, grads)
        mine, slack = formula_update(G, D, k, grads)
        fd = np.abs(mine - want) / np.maximum(2.0 * slack, 1e-300)
        ST.formula_vs_torch = max(ST.formula_vs_torch, float(np.max(fd)) if fd.size else 0.0)
        pnew = D["pnew%d" % k].reshape(-1).astype(np.float64)
        for name, nid, off, cnt in G.params:
            d = np.abs(pnew[off:off + cnt] - want[off:off + cnt])
            s2 = 2.0 * slack[off:off + cnt]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(d == 0, 0.0, d / s2)
            ratio[~np.isfinite(pnew[off:off + cnt])] = math.inf
            r = float(np.max(ratio)) if ratio.size else 0.0
            ST.compared += 1
            if r > ST.step_ratio:
                ST.step_ratio, ST.step_what = r, "graph %d, step %d, %s" % (G.index, k, name)
            if ARGS.v:
                print("      graph %d step %d %-32s after the %s step: %.3g of the rounding allowed" % (
                    G.index, k, name, G.steps[k]["kind"], r))
            if not r <= 1.0:
                i = int(np.argmax(ratio))
                fail(G, "step %d, %s after the %s step: element %d is %.9g, torch.optim's float64 step of dtrain's "
                     "gradient %.9g gives %.9g (+- %.3g); it was %.9g" % (
                         k, name, G.steps[k]["kind"], i, pnew[off + i], grads[off + i], want[off + i],
                         s2[i], D["p%d" % k].reshape(-1)[off + i]))


def hist(vals, lo, hi):
    """counts by decade, from <= 1e(lo) to > 1e(hi-1)"""
    edges = list(range(lo, hi))
    counts = [0] * (len(edges) + 1)
    for v in vals:
        b = 0 if v <= 0 else int(math.floor(math.log10(v))) - lo + 1 if math.isfinite(v) else len(edges)
        counts[min(max(b, 0), len(edges))] += 1
    parts = ["<1e%d: %d" % (lo, counts[0])]
    parts += ["<1e%d: %d" % (e + 1, counts[i + 1]) for i, e in enumerate(edges[:-1])]
    parts += [">=1e%d: %d" % (edges[-1], counts[-1])]
    return ", ".join(parts)


def main():
    global ARGS
    ap = argparse.ArgumentParser(description="dtrain's test_diff dumps against float64 PyTorch")
    ap.add_argument("dir")
    ap.add_argument("--graph", type=int, default=None, help="only graph I")
    ap.add_argument("-v", action="store_true", help="every tensor's comparison")
    ARGS = ap.parse_args()
    torch.set_num_threads(1)
    if ARGS.graph is not None:
        files = [os.path.join(ARGS.dir, "g%04d.txt" % ARGS.graph)]
    else:
        files = sorted(glob.glob(os.path.join(ARGS.dir, "g[0-9]*.txt")))
    t0 = time.time()
    passed = failed = 0
    missing = [f for f in files if not (os.path.exists(f) and os.path.exists(f[:-4] + ".bin"))]
    if not files or missing:
        print("FAIL diff_torch: no dumped graphs in %s%s" % (ARGS.dir, " (missing %s)" % missing[0] if missing else ""))
        print("0 passed, 1 failed")
        return 1
    for f in files:
        try:
            run_graph(f)
        except Exception as ex:   # a graph PyTorch cannot run, a damaged dump: that graph fails
            G = Graph()
            m = re.search(r"g(\d+)\.txt$", f)
            G.index, G.seed = int(m.group(1)) if m else -1, -1
            try:
                G.seed = read_graph(f).seed
            except Exception:
                pass
            fail(G, "could not be compared: %s: %s" % (type(ex).__name__, ex))
    dt = time.time() - t0
    n = len(files)
    if ST.failed_graphs:
        failed += 1
        print("FAIL dtrain against float64 PyTorch: %d of %d graphs differ (%s)" % (
            len(ST.failed_graphs), n, " ".join(str(i) for i in sorted(ST.failed_graphs)[:20])))
    else:
        passed += 1
        print("ok   dtrain against float64 PyTorch on %d graphs, %d steps (%.1f s)" % (n, ST.steps, dt))
    over = ST.left_out > FLIPS_MAX * ST.steps and ARGS.graph is None   # (one graph's replay: its steps are few)
    if over or ST.far_flips:
        failed += 1
        print("FAIL steps left out for a ReLU or max pooling decided otherwise: %d of %d%s%s" % (
            ST.left_out, ST.steps, ", more than %.0f%%" % (100 * FLIPS_MAX) if over else "",
            ", decisions away from their boundary in graphs %s" % sorted(set(ST.far_flips)) if ST.far_flips else ""))
    else:
        passed += 1
        print("ok   %d of %d steps' gradients left out for a ReLU or max pooling decided otherwise within rounding "
              "(%d decisions)" % (ST.left_out, ST.steps, ST.flips_seen))
    print("     %d comparisons; worst difference / tolerance %.3g (%s); worst relative error of a tensor float32 "
          "determines well (PyTorch's float32 difference under 1e-4 of it) %.3g (%s)" % (
              ST.compared, ST.worst_ratio, ST.worst_what, ST.worst_rel, ST.worst_rel_what))
    print("     parameters after the steps: worst difference / rounding allowed %.3g (%s); dtrain's formulas "
          "against torch.optim: %.3g of it" % (ST.step_ratio, ST.step_what, ST.formula_vs_torch))
    print("     dtrain's error / float32 PyTorch's (C = %g): %s; float32 PyTorch exact: %d" % (
        C_SPREAD, hist(ST.over32, -3, 4), ST.over32_zero))
    print("     dtrain's error / largest value of the tensor or its kind (F = %g): %s" % (
        F_FLOOR, hist(ST.overscale, -9, -3)))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
