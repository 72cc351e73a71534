#!/usr/bin/python3
"""PyTorch gloo all_reduce (float32 SUM, in place) on localhost, measured like bench_comm.c: sizes 1 KiB..64 MiB,
5 warm-up calls, repetitions sized for ~window seconds, 7 windows with a barrier before each, the slowest rank's
time per window, the median window. One torch thread per process. Prints CSV lines like bench_comm:
backend,ranks,algo,bytes,reps,time_us,algbw_GBps,correct.   Usage: gloo_allreduce.py --world 2 [--max-bytes N]"""
import argparse, os, socket, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def worker(rank, world, port, max_bytes, window):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for nbytes in [s for s in SIZES if s <= max_bytes]:
        t = torch.full((nbytes // 4,), float(rank + 1))
        dist.all_reduce(t)
        ok = bool((t == world * (world + 1) / 2).all())
        for _ in range(4):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(t)
        est = torch.tensor([(time.perf_counter() - t0) / 3], dtype=torch.float64)
        dist.broadcast(est, 0)
        reps = int(min(20000, max(2, window / est.item())))
        tw = []
        for _ in range(7):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                dist.all_reduce(t)
            x = torch.tensor([(time.perf_counter() - t0) / reps], dtype=torch.float64)
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
            tw.append(x.item())
        if rank == 0:
            med = sorted(tw)[3]
            print("gloo,%d,gloo,%d,%d,%.2f,%.3f,%d" % (world, nbytes, reps, med * 1e6, nbytes / med / 1e9, int(ok)), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--window", type=float, default=0.2)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a.world, port, a.max_bytes, a.window), nprocs=a.world, join=True)
