#!/usr/bin/python3
"""bench/torch_models.py - PyTorch's training-step throughput for the models bench_models.c measures:
forward, loss, backward and an SGD step (momentum 0.9) on random inputs, batch 128.

usage: /usr/bin/python3 bench/torch_models.py --model resnet20 [--threads 2] [--batch 128] [--warmup 3] [--iters 3] [--windows 7]
                                             [--device cpu|cuda] [--tf32] [--bf16]
--device cuda runs on the GPU (each window ends with torch.cuda.synchronize()); --tf32 lets its matrix
products and convolutions use TF32 (off by default: full fp32, as dtrain's GPU backend). --bf16 runs the forward
pass and the loss under torch.autocast with bfloat16 (CPU autocast: bf16 convolutions and linear layers, fp32
master weights), as a dtrain model with precision bf16.
Prints one CSV line as bench_models does:
  model,batch,threads,params,img_per_s_median,img_per_s_min,img_per_s_max,base_rss_mb,peak_rss_mb
The architectures are the zoo's: SimpleCNN (log-softmax + NLL, dropout), ResNet-20 with option-A shortcuts,
VGG-11 with batch normalisation for 3x32x32 (cross-entropy)."""
import argparse, resource, statistics, time
import torch
import torch.nn as nn
import torch.nn.functional as F


class SimpleCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.dropout(F.max_pool2d(F.relu(self.conv2(x)), 2), 0.25, self.training).flatten(1)
        x = F.dropout(F.relu(self.fc1(x)), 0.5, self.training)
        return F.log_softmax(self.fc2(x), dim=1)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.pad, self.stride = (cout - cin if stride != 1 or cin != cout else 0), stride

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        sc = x
        if self.pad:   # option A: subsample and pad channels with zeros
            sc = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, self.pad // 2, self.pad // 2))
        return F.relu(out + sc)


class ResNet20(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(3):
                layers.append(Block(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class VGG11(nn.Module):
    CFG = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]

    def __init__(self):
        super().__init__()
        layers, cin = [], 3
        for v in self.CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
                cin = v
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, 10)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


MODELS = {"simplecnn": (SimpleCNN, (1, 28, 28), F.nll_loss), "resnet20": (ResNet20, (3, 32, 32), F.cross_entropy),
          "vgg11": (VGG11, (3, 32, 32), F.cross_entropy)}


def set_threads(n):
    """torch.set_num_threads does not limit the OpenBLAS pool Debian's torch uses for linear layers: set both."""
    import ctypes
    torch.set_num_threads(n)
    for lib in ("libopenblas.so.0", "libblas.so.3"):
        try:
            ctypes.CDLL(lib).openblas_set_num_threads(ctypes.c_int(n))
            break
        except (OSError, AttributeError):
            pass


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1048576


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="simplecnn", choices=sorted(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--windows", type=int, default=7)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    set_threads(a.threads)
    base = rss_mb()
    torch.manual_seed(0)
    cls, shape, lossf = MODELS[a.model]
    model = cls().to(a.device)
    x, y = torch.randn(a.batch, *shape).to(a.device), torch.randint(0, 10, (a.batch,)).to(a.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        with torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=a.bf16):
            loss = lossf(model(x), y)
        loss.backward()
        opt.step()
    for _ in range(a.warmup):
        step()
    sync()
    rates = []
    for _ in range(a.windows):
        t = time.perf_counter()
        for _ in range(a.iters):
            step()
        sync()
        rates.append(a.iters * a.batch / (time.perf_counter() - t))
    params = sum(p.numel() for p in model.parameters())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{a.model},{a.batch},{torch.get_num_threads()},{params},{statistics.median(rates):.1f},{min(rates):.1f},"
          f"{max(rates):.1f},{base:.1f},{peak:.1f}")
