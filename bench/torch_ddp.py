#!/usr/bin/python3
"""bench/torch_ddp.py - PyTorch DDP (gloo) peer of examples/ddp under mpiexec: SimpleCNN (bench/torch_models.py's)
on the first LIMIT Fashion-MNIST training images, global batch 128 split over WORLD processes on localhost,
SGD lr 0.01 momentum 0.5 (ddp's defaults), one epoch, each process a DistributedSampler share with torch threads =
cores / WORLD (as dt_launch gives each rank), DDP's default buckets (25 MiB: SimpleCNN's 1.7 MB gradient is one).
Times the training loop of the epoch as examples/ddp does (no evaluation), the slowest rank's, after one warm-up
step. Prints one CSV line: ranks,sync,epoch_s,comm_s (comm_s empty: PyTorch does not report it).
usage: torch_ddp.py --world 2 --limit 8192 [--data DIR] [--batch 128]"""
import argparse, gzip, os, socket, sys, time
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import SimpleCNN   # noqa: E402  (the zoo's architecture)


def idx(path):
    """An IDX file (or path.gz) as a numpy array."""
    op = open if os.path.exists(path) else gzip.open
    with op(path if os.path.exists(path) else path + ".gz", "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def worker(rank, world, port, a, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = torch.from_numpy(idx(os.path.join(a.data, "train-images-idx3-ubyte"))[:a.limit].astype(np.float32) / 255.0)
    x = ((x - 0.2860) / 0.3530).unsqueeze(1)
    y = torch.from_numpy(idx(os.path.join(a.data, "train-labels-idx1-ubyte"))[:a.limit].astype(np.int64))
    torch.manual_seed(1)
    model = DDP(SimpleCNN())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    share = torch.randperm(a.limit, generator=torch.Generator().manual_seed(1))[rank::world]
    per = a.batch // world

    def step(ids):
        opt.zero_grad()
        F.nll_loss(model(x[ids]), y[ids]).backward()
        opt.step()

    step(share[:per])   # warm-up: DDP's buckets, gloo's connections
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(0, len(share) - per + 1, per):
        step(share[i:i + per])
    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put(t.item())
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--limit", type=int, default=8192)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ctx_procs = mp.spawn(worker, args=(a.world, port, a, q), nprocs=a.world, join=False)
    t = q.get()
    ctx_procs.join()
    print(f"{a.world},torch,{t:.3f},")


if __name__ == "__main__":
    main()
