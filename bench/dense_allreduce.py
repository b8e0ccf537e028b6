#!/usr/bin/env python3
"""Dense allreduce on N simulated nodes: sparsync (compressor none) against torch.distributed's
gloo backend, on the same tensor sizes, in the same run, on the same machine.

    .venv/bin/python bench/dense_allreduce.py [--np 4] [--reps 20]

Each side runs N processes (sparsync: one worker per simulated node through sparsyncrun, so every
byte crosses its daemon's Gloo mesh); rank 0 times each in-place call (sparsync: hvd.allreduce_,
which copies the tensor into shared memory, waits, and copies the average back; torch:
dist.all_reduce followed by the division by N) and reports the median; the better of two
alternating runs per side is kept. Prints a Markdown table with the ratio.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 22, 1 << 24]  # float32 elements


def worker(kind, reps, out):
    import torch
    torch.set_num_threads(1)
    if kind == "sparsync":
        import sparsync.torch as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()

        def allreduce(t, name):
            return hvd.allreduce_(t, name=name)
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()

        def allreduce(t, name):
            dist.all_reduce(t)
            t.div_(size)
            return t
    results = {}
    for n in SIZES:
        x = torch.full((n,), float(rank + 1))
        times = []
        for i in range(reps + 2):
            t0 = time.perf_counter()
            y = allreduce(x, f"bench.{n}")
            dt = time.perf_counter() - t0
            if i >= 2:
                times.append(dt)
        expected = (size + 1) / 2
        assert abs(float(y[0]) - expected) < 1e-5, (float(y[0]), expected)
        times.sort()
        results[n] = times[len(times) // 2]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    if kind == "sparsync":
        hvd.shutdown()
    else:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(np_, reps, out):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(np_), GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "torch", "--reps", str(reps),
                               "--out", out], env=dict(env, RANK=str(r)))
             for r in range(np_)]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("torch.distributed run failed")


def run_sparsync(np_, reps, out):
    runner = os.path.join(os.path.dirname(sys.executable), "sparsyncrun")
    cmd = [runner, "-np", str(np_), sys.executable, __file__, "--worker", "sparsync",
           "--reps", str(reps), "--out", out]
    env = dict(os.environ, SPARSYNC_COMPRESSOR="none", SPARSYNC_LOG_LEVEL="warn")
    if subprocess.run(cmd, env=env).returncode != 0:
        raise SystemExit("sparsync run failed")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--worker", choices=["sparsync", "torch"])
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.reps, args.out)
    with tempfile.TemporaryDirectory() as d:
        # Alternate the two sides twice so that drift of the shared machine hits both.
        runs = {"sparsync": [], "torch": []}
        for _ in range(2):
            for kind, fn in (("sparsync", run_sparsync), ("torch", run_torch)):
                out = os.path.join(d, kind + ".json")
                fn(args.np, args.reps, out)
                with open(out) as f:
                    runs[kind].append({int(k): v for k, v in json.load(f).items()})
    print(f"| float32 elements | bytes | sparsync (ms) | torch.distributed gloo (ms) | sparsync / torch |")
    print("|---:|---:|---:|---:|---:|")
    for n in SIZES:
        s = min(r[n] for r in runs["sparsync"])
        t = min(r[n] for r in runs["torch"])
        print(f"| {n} | {4 * n} | {s * 1e3:.3f} | {t * 1e3:.3f} | {s / t:.2f} |")


if __name__ == "__main__":
    main()
