#!/usr/bin/python3
"""Generate PyTorch reference fixtures for the dtrain C tests.

Writes one binary file per test case, ``<outdir>/<case>.bin``, plus
``<outdir>/param_counts.txt`` (lines "name count" with PyTorch parameter
counts of reference models); the counts are also printed to stdout.

Regenerate (from the repository root) with:

    /usr/bin/python3 tests/gen_fixtures.py            # outdir = tests/fixtures
    /usr/bin/python3 tests/gen_fixtures.py some/dir   # custom outdir

Everything is float32 on the CPU, computed exactly as PyTorch does by default;
each case starts from torch.manual_seed(SEED + case index), so reruns with the
same PyTorch version reproduce the same values (tiny last-bit differences are
possible across versions/CPUs; the C tests compare with a tolerance).

File format (little-endian):
    8 bytes magic b"DTFIX001", then records until EOF, each:
        uint32 name_len, name bytes (ASCII, no NUL),
        uint32 ndim, int64 dims[ndim],
        float32 data[prod(dims)]   (row-major / contiguous)
Integer tensors (labels, configuration) are stored as float32 values.
Every file has a record "cfg": a 1-D vector of the case's configuration
numbers.  Gradients of non-scalar outputs are those of (y * dy).sum() for a
random upstream gradient "dy"; for losses they are the gradients of the loss.
"""
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

SEED = 1234
MAGIC = b"DTFIX001"

torch.set_num_threads(1)
torch.set_default_dtype(torch.float32)


# ----------------------------------------------------------------- writer
def write_case(outdir, case, cfg, records):
    """records: list of (name, tensor); cfg: list of numbers."""
    path = os.path.join(outdir, case + ".bin")
    with open(path, "wb") as f:
        f.write(MAGIC)
        allrec = [("cfg", torch.tensor([float(v) for v in cfg], dtype=torch.float32))]
        allrec += list(records)
        seen = set()
        for name, t in allrec:
            assert name not in seen, (case, name)
            seen.add(name)
            t = torch.as_tensor(t).detach().to(torch.float32).contiguous().cpu()
            nb = name.encode("ascii")
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<I", t.dim()))
            if t.dim():
                f.write(struct.pack("<%dq" % t.dim(), *t.shape))
            f.write(t.numpy().astype("<f4", copy=False).tobytes())
    return path


def read_case(path):
    """Reader for the format above (used by the self-check)."""
    import numpy as np
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == MAGIC
    p = 8
    while p < len(data):
        (nl,) = struct.unpack_from("<I", data, p); p += 4
        name = data[p:p + nl].decode("ascii"); p += nl
        (nd,) = struct.unpack_from("<I", data, p); p += 4
        dims = struct.unpack_from("<%dq" % nd, data, p); p += 8 * nd
        n = 1
        for d in dims:
            n *= d
        arr = np.frombuffer(data, dtype="<f4", count=n, offset=p).reshape(dims)
        p += 4 * n
        out[name] = arr
    assert p == len(data)
    return out


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def distinct(shape, scale=4.0):
    """Random tensor with all-distinct values (no ties for max pooling)."""
    n = 1
    for s in shape:
        n *= s
    v = (torch.randperm(n).to(torch.float32) + torch.rand(n) * 0.5) / n
    return ((v - 0.5) * scale).reshape(shape)


def nonzero_randn(*shape):
    x = torch.randn(*shape)
    x[x.abs() < 1e-3] = 0.5  # keep relu away from its kink
    return x


# ------------------------------------------------------------------ models
class SimpleCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(3136, 128)
        self.dropout2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False); self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False); self.bn2 = nn.BatchNorm2d(cout)
        self.pad = cout - cin if (stride != 1 or cin != cout) else 0  # option A shortcut
        self.stride = stride

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        sc = x
        if self.pad:
            sc = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, self.pad // 2, self.pad // 2))
        return F.relu(out + sc)


class ResNetCifar(nn.Module):
    def __init__(self, n=3, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False); self.bn1 = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(BasicBlock(cin, cout, stride if i == 0 else 1)); cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def fedavg_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 10))


def fedavg_2nn():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU(),
                         nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10))


def lenet5():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10))


def vgg11_bn():
    cfg = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]
    layers, cin = [], 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU()]
            cin = v
    layers += [nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


def nparams(m):
    return sum(p.numel() for p in m.parameters())


# ------------------------------------------------------------------- cases
def weighted_records(x, w, b, y):
    """Records of a layer with weight w and optional bias b: inputs, a random upstream gradient dy,
    the output and the gradients of (y * dy).sum()."""
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    rec = [("x", x), ("w", w)] + ([("b", b)] if b is not None else [])
    rec += [("dy", dy), ("y", y), ("dx", x.grad), ("dw", w.grad)]
    return rec + ([("db", b.grad)] if b is not None else [])


def case_linear(cfg):
    N, IN, OUT, has_bias = cfg
    x = torch.randn(N, IN, requires_grad=True)
    w = torch.randn(OUT, IN, requires_grad=True)
    b = torch.randn(OUT, requires_grad=True) if has_bias else None
    y = F.linear(x, w, b)
    return weighted_records(x, w, b, y)


def case_conv2d_rect(cfg):
    """A kh x kw window, strides sh, sw, padding ph, pw (the same draws as case_conv2d when square)."""
    N, C, H, W, OC, KH, KW, SH, SW, PH, PW, has_bias = cfg
    x = torch.randn(N, C, H, W, requires_grad=True)
    w = (torch.randn(OC, C, KH, KW) * 0.5).requires_grad_()
    b = torch.randn(OC, requires_grad=True) if has_bias else None
    y = F.conv2d(x, w, b, stride=(SH, SW), padding=(PH, PW))
    return weighted_records(x, w, b, y)


def case_conv2d(cfg):
    N, C, H, W, OC, K, stride, pad, has_bias = cfg
    return case_conv2d_rect([N, C, H, W, OC, K, K, stride, stride, pad, pad, has_bias])


def pool_records(x, pool):
    y = pool(x)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    return [("x", x), ("dy", dy), ("y", y), ("dx", x.grad)]


def case_maxpool_rect(cfg):
    N, C, H, W, KH, KW, SH, SW, PH, PW = cfg
    x = distinct((N, C, H, W)).requires_grad_()
    return pool_records(x, lambda v: F.max_pool2d(v, (KH, KW), (SH, SW), (PH, PW)))


def case_avgpool_rect(cfg):
    N, C, H, W, KH, KW, SH, SW, PH, PW = cfg
    x = torch.randn(N, C, H, W, requires_grad=True)
    # count_include_pad=True, ceil_mode=False: the padding's zeros count in every window's mean
    return pool_records(x, lambda v: F.avg_pool2d(v, (KH, KW), (SH, SW), (PH, PW)))


def case_maxpool(cfg):
    N, C, H, W, K, stride, pad = cfg
    return case_maxpool_rect([N, C, H, W, K, K, stride, stride, pad, pad])


def case_avgpool(cfg):
    N, C, H, W, K, stride, pad = cfg
    return case_avgpool_rect([N, C, H, W, K, K, stride, stride, pad, pad])


def case_gap(cfg):
    N, C, H, W = cfg
    x = torch.randn(N, C, H, W, requires_grad=True)
    y = F.adaptive_avg_pool2d(x, 1).flatten(1)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    return [("x", x), ("dy", dy), ("y", y), ("dx", x.grad)]


def case_relu(cfg):
    N, D = cfg
    x = nonzero_randn(N, D).requires_grad_()
    y = F.relu(x)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    return [("x", x), ("dy", dy), ("y", y), ("dx", x.grad)]


def case_bn(cfg, train, two_d):
    if two_d:
        N, C, H, W, eps, mom = cfg
        bn = nn.BatchNorm2d(C, eps=eps, momentum=mom)
        x = (torch.randn(N, C, H, W) * 1.7 + 0.3).requires_grad_()
    else:
        N, C, eps, mom = cfg
        bn = nn.BatchNorm1d(C, eps=eps, momentum=mom)
        x = (torch.randn(N, C) * 1.7 + 0.3).requires_grad_()
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.copy_(torch.randn(C) * 0.5)
        bn.running_var.copy_(torch.rand(C) * 1.5 + 0.5)
    rm0 = bn.running_mean.clone()
    rv0 = bn.running_var.clone()
    bn.train(train)
    y = bn(x)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    rec = [("x", x), ("w", bn.weight), ("b", bn.bias), ("rm0", rm0), ("rv0", rv0),
           ("dy", dy), ("y", y), ("dx", x.grad), ("dw", bn.weight.grad), ("db", bn.bias.grad)]
    if train:
        rec += [("rm1", bn.running_mean), ("rv1", bn.running_var)]
    return rec


def case_log_softmax(cfg):
    N, K = cfg
    x = (torch.randn(N, K) * 2).requires_grad_()
    y = F.log_softmax(x, dim=1)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    return [("x", x), ("dy", dy), ("y", y), ("dx", x.grad)]


def case_xent(cfg):
    N, K = cfg
    x = (torch.randn(N, K) * 2).requires_grad_()
    labels = torch.randint(0, K, (N,))
    loss = F.cross_entropy(x, labels)
    loss.backward()
    return [("x", x), ("labels", labels), ("loss", loss.reshape(1)), ("dx", x.grad)]


def case_nll(cfg):
    N, K = cfg
    x = F.log_softmax(torch.randn(N, K) * 2, dim=1).detach().requires_grad_()
    labels = torch.randint(0, K, (N,))
    loss = F.nll_loss(x, labels)
    loss.backward()
    return [("x", x), ("labels", labels), ("loss", loss.reshape(1)), ("dx", x.grad)]


def case_mse(cfg):
    N, D = cfg
    x = torch.randn(N, D, requires_grad=True)
    target = torch.randn(N, D)
    loss = F.mse_loss(x, target)
    loss.backward()
    return [("x", x), ("target", target), ("loss", loss.reshape(1)), ("dx", x.grad)]


def case_pad_shortcut(cfg):
    N, C, H, W, stride, pe = cfg
    x = torch.randn(N, C, H, W, requires_grad=True)
    y = F.pad(x[:, :, ::stride, ::stride], (0, 0, 0, 0, pe, pe))
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    return [("x", x), ("dy", dy), ("y", y), ("dx", x.grad)]


def case_simplecnn(cfg):
    (N,) = cfg
    model = SimpleCNN()
    model.eval()
    x = torch.randn(N, 1, 28, 28)
    labels = torch.randint(0, 10, (N,))
    params = flat(model.parameters())
    out = model(x)
    loss = F.nll_loss(out, labels)
    loss.backward()
    grads = flat(p.grad for p in model.parameters())
    return [("x", x), ("labels", labels), ("params", params), ("out", out),
            ("loss", loss.reshape(1)), ("grads", grads)]


def bn_buffers(model):
    bufs = []
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            bufs += [m.running_mean, m.running_var]
    return flat(bufs)


def case_resnet20(cfg):
    (N,) = cfg
    model = ResNetCifar()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    model.train()
    x = torch.randn(N, 3, 32, 32)
    labels = torch.randint(0, 10, (N,))
    params = flat(model.parameters())
    buffers_before = bn_buffers(model)
    out = model(x)
    loss = F.cross_entropy(out, labels)
    loss.backward()
    grads = flat(p.grad for p in model.parameters())
    buffers_after = bn_buffers(model)
    return [("x", x), ("labels", labels), ("params", params),
            ("buffers_before", buffers_before), ("out", out),
            ("loss", loss.reshape(1)), ("grads", grads),
            ("buffers_after", buffers_after)]


CASES = [
    ("linear_a", [3, 5, 4, 1], case_linear),
    ("linear_b", [2, 7, 3, 0], case_linear),
    ("conv2d_a", [2, 3, 7, 6, 4, 3, 1, 1, 1], case_conv2d),
    ("conv2d_b", [2, 2, 8, 9, 3, 3, 2, 0, 0], case_conv2d),
    ("conv2d_c", [1, 3, 9, 9, 2, 5, 1, 2, 1], case_conv2d),
    ("conv2d_d", [2, 4, 7, 7, 5, 1, 2, 0, 1], case_conv2d),
    ("conv2d_e", [2, 3, 9, 8, 4, 3, 2, 1, 1], case_conv2d),
    ("maxpool_a", [2, 3, 6, 6, 2, 2, 0], case_maxpool),
    ("maxpool_b", [1, 2, 7, 7, 3, 2, 0], case_maxpool),
    ("maxpool_c", [2, 2, 7, 6, 3, 2, 1], case_maxpool),
    ("avgpool_a", [2, 3, 6, 6, 2, 2, 0], case_avgpool),
    ("avgpool_b", [2, 2, 7, 7, 3, 2, 1], case_avgpool),
    ("gap_a", [2, 3, 5, 4], case_gap),
    ("relu_a", [3, 11], case_relu),
    ("bn2d_train", [3, 4, 5, 3, 1e-5, 0.1], lambda c: case_bn(c, True, True)),
    ("bn2d_eval", [3, 4, 5, 3, 1e-5, 0.1], lambda c: case_bn(c, False, True)),
    ("bn1d_train", [5, 6, 1e-5, 0.1], lambda c: case_bn(c, True, False)),
    ("bn1d_eval", [5, 6, 1e-5, 0.1], lambda c: case_bn(c, False, False)),
    ("log_softmax_a", [4, 7], case_log_softmax),
    ("xent_a", [5, 7], case_xent),
    ("nll_a", [5, 7], case_nll),
    ("mse_a", [4, 3], case_mse),
    ("pad_shortcut_a", [2, 3, 6, 5, 2, 2], case_pad_shortcut),
    ("simplecnn", [3], case_simplecnn),
    ("resnet20", [2], case_resnet20),
    # rectangular windows (appended: each case's seed is SEED + its index, so the cases above keep theirs)
    # conv: N C H W OC KH KW SH SW PH PW bias
    ("conv2d_rect_a", [2, 3, 7, 9, 4, 1, 3, 1, 2, 0, 1, 1], case_conv2d_rect),
    ("conv2d_rect_b", [2, 3, 9, 7, 4, 3, 1, 2, 1, 1, 0, 1], case_conv2d_rect),
    ("conv2d_rect_c", [2, 2, 11, 8, 3, 5, 2, 2, 2, 2, 1, 1], case_conv2d_rect),
    ("conv2d_rect_d", [2, 2, 8, 11, 3, 2, 5, 1, 1, 1, 2, 1], case_conv2d_rect),
    ("conv2d_rect_e", [3, 2, 1, 13, 3, 1, 4, 1, 3, 0, 2, 0], case_conv2d_rect),
    # pooling: N C H W KH KW SH SW PH PW
    ("maxpool_rect_a", [2, 3, 7, 8, 2, 3, 2, 1, 1, 1], case_maxpool_rect),
    ("maxpool_rect_b", [2, 2, 9, 6, 3, 1, 2, 1, 1, 0], case_maxpool_rect),
    ("maxpool_rect_c", [1, 2, 5, 9, 1, 3, 1, 2, 0, 1], case_maxpool_rect),
    ("avgpool_rect_a", [2, 3, 7, 8, 2, 3, 2, 1, 1, 1], case_avgpool_rect),
    ("avgpool_rect_b", [2, 2, 9, 6, 3, 1, 2, 1, 1, 0], case_avgpool_rect),
    ("avgpool_rect_c", [2, 2, 6, 9, 2, 4, 2, 3, 0, 2], case_avgpool_rect),
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "fixtures")
    os.makedirs(outdir, exist_ok=True)
    for i, (case, cfg, fn) in enumerate(CASES):
        torch.manual_seed(SEED + i)
        rec = fn(cfg)
        path = write_case(outdir, case, cfg, rec)
        print("wrote %-40s %8d bytes" % (path, os.path.getsize(path)))

    torch.manual_seed(SEED)
    counts = [
        ("simplecnn", nparams(SimpleCNN())),
        ("resnet20", nparams(ResNetCifar())),
        ("fedavg_cnn", nparams(fedavg_cnn())),
        ("fedavg_2nn", nparams(fedavg_2nn())),
        ("lenet5", nparams(lenet5())),
        ("vgg11", nparams(vgg11_bn())),
    ]
    with open(os.path.join(outdir, "param_counts.txt"), "w") as f:
        for name, n in counts:
            f.write("%s %d\n" % (name, n))
            print("params %-12s %d" % (name, n))


if __name__ == "__main__":
    main()
