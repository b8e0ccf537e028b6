#!/usr/bin/env python3
"""The dense path on N simulated nodes of one machine: sparsync (compressor none) against
torch.distributed's gloo backend and Horovod 0.28.1 (Gloo), same sizes, same machine, in one run.

    .venv/bin/python bench/dense_allreduce.py [--np 4] [--reps 20] [--rounds 2] [--no-horovod]

Two measurements, each side as N processes (sparsync: one worker per simulated node through
sparsyncrun, so every byte crosses its daemon's Gloo mesh; Horovod: horovodrun --gloo):
  allreduce  an in-place call on a float32 tensor (hvd.allreduce_ vs dist.all_reduce + the
             division by N), median per call on rank 0, for each size;
  step       one training step of a 4-layer MLP with 64 MiB of float32 gradients (4 Linear
             2048x2048): forward, backward, optimizer step with sparsync's and Horovod's
             DistributedOptimizer and torch's DistributedDataParallel (gloo, default buckets);
             median per step on rank 0.
A fourth side, "no reduction", runs the same step in N processes at once with the plain
optimizer and nothing exchanged: the floor under every transport's step on this machine, since
the N workers' matrix products share its cores whichever library reduces their gradients.
The sides alternate (`--rounds` times each; the best round of each side is kept), so that drift
of the shared machine hits all of them; the load average before and after is printed. Horovod
comes from bench/peers/setup.sh's environment (bench/peers/.venv); without it that column is
left out. Prints Markdown tables with the ratios.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 22, 1 << 24]  # float32 elements
HIDDEN, LAYERS, BATCH = 2048, 4, 32
PEER_PYTHON = os.path.join(HERE, "peers", ".venv", "bin", "python")


# ---- the workers ----

def setup(kind):
    """(rank, size, allreduce_(t, name), finish) of the side `kind`."""
    if kind == "sparsync":
        import sparsync.torch as hvd
        hvd.init()
        return hvd.rank(), hvd.size(), (lambda t, name: hvd.allreduce_(t, name=name)), \
            hvd.shutdown
    if kind == "horovod":
        import horovod.torch as hvd
        hvd.init()
        return hvd.rank(), hvd.size(), (lambda t, name: hvd.allreduce_(t, name=name)), \
            hvd.shutdown
    import torch.distributed as dist
    dist.init_process_group("gloo")
    size = dist.get_world_size()

    def allreduce(t, name):
        dist.all_reduce(t)
        t.div_(size)
        return t
    return dist.get_rank(), size, allreduce, dist.destroy_process_group


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def bench_allreduce(rank, size, allreduce, reps):
    import torch
    results = {}
    for n in SIZES:
        x = torch.full((n,), float(rank + 1))
        times = []
        for i in range(reps + 2):
            t0 = time.perf_counter()
            y = allreduce(x, f"bench.{n}")
            if i >= 2:
                times.append(time.perf_counter() - t0)
            expected = (size + 1) / 2  # y is x itself for the in-place ops: check, then refill
            assert abs(float(y[0]) - expected) < 1e-5, (n, float(y[0]), expected)
            x.fill_(float(rank + 1))
        results[n] = median(times)
    return results


def bench_step(kind, rank, reps):
    import torch
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    if kind == "sparsync":
        import sparsync.torch as hvd
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif kind == "horovod":
        import horovod.torch as hvd
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif kind == "torch":
        model = torch.nn.parallel.DistributedDataParallel(model)
    x = torch.randn(BATCH, HIDDEN, generator=torch.Generator().manual_seed(rank))
    times = []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return median(times)


def worker(kind, reps, out):
    import torch
    torch.set_num_threads(1)
    if kind == "local":  # the step alone, nothing exchanged
        step = bench_step(kind, int(os.environ["RANK"]), max(5, reps // 2))
        if os.environ["RANK"] == "0":
            with open(out, "w") as f:
                json.dump({"step": step}, f)
        return
    rank, size, allreduce, finish = setup(kind)
    results = {"allreduce": bench_allreduce(rank, size, allreduce, reps),
               "step": bench_step(kind, rank, max(5, reps // 2))}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    finish()


# ---- the sides ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_argv(python, kind, reps, out):
    return [python, os.path.abspath(__file__), "--worker", kind, "--reps", str(reps), "--out", out]


def run_torch(np_, reps, out):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(np_), GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen(worker_argv(sys.executable, "torch", reps, out),
                              env=dict(env, RANK=str(r))) for r in range(np_)]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("torch.distributed run failed")


def run_local(np_, reps, out):
    procs = [subprocess.Popen(worker_argv(sys.executable, "local", reps, out),
                              env=dict(os.environ, RANK=str(r))) for r in range(np_)]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("the run without reduction failed")


def run_sparsync(np_, reps, out):
    runner = os.path.join(os.path.dirname(sys.executable), "sparsyncrun")
    env = dict(os.environ, SPARSYNC_COMPRESSOR="none", SPARSYNC_LOG_LEVEL="warn")
    cmd = [runner, "-np", str(np_)] + worker_argv(sys.executable, "sparsync", reps, out)
    if subprocess.run(cmd, env=env).returncode != 0:
        raise SystemExit("sparsync run failed")


def run_horovod(np_, reps, out):
    runner = os.path.join(os.path.dirname(PEER_PYTHON), "horovodrun")
    cmd = [runner, "--gloo", "-np", str(np_), "-H", "localhost:%d" % np_] + \
        worker_argv(PEER_PYTHON, "horovod", reps, out)
    if subprocess.run(cmd, env=dict(os.environ, HOROVOD_GLOO_IFACE="lo")).returncode != 0:
        raise SystemExit("horovod run failed")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-horovod", action="store_true")
    ap.add_argument("--worker", choices=["sparsync", "torch", "horovod", "local"])
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.reps, args.out)
    sides = [("sparsync", run_sparsync), ("torch", run_torch)]
    if not args.no_horovod and os.access(PEER_PYTHON, os.X_OK):
        sides.append(("horovod", run_horovod))
    sides.append(("local", run_local))
    load_before = os.getloadavg()
    runs = {kind: [] for kind, _ in sides}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(args.rounds):
            for kind, fn in sides:
                out = os.path.join(d, kind + ".json")
                fn(args.np, args.reps, out)
                with open(out) as f:
                    runs[kind].append(json.load(f))
    load_after = os.getloadavg()
    best = {kind: {"allreduce": {n: min(r["allreduce"][str(n)] for r in rs) for n in SIZES}
                   if "allreduce" in rs[0] else {},  # none without reduction
                   "step": min(r["step"] for r in rs)} for kind, rs in runs.items()}
    print("load average before %.2f %.2f %.2f, after %.2f %.2f %.2f; %d round(s) per side, "
          "the best kept" % (*load_before, *load_after, args.rounds))
    hvd = "horovod" in best
    print()
    print("| float32 elements | bytes | sparsync (ms) | torch.distributed gloo (ms) |"
          + (" Horovod (ms) |" if hvd else "") + " sparsync / torch |"
          + (" sparsync / Horovod |" if hvd else ""))
    print("|---:|---:|---:|---:|" + ("---:|" if hvd else "") + "---:|" + ("---:|" if hvd else ""))
    for n in SIZES:
        s, t = best["sparsync"]["allreduce"][n], best["torch"]["allreduce"][n]
        row = f"| {n} | {4 * n} | {s * 1e3:.3f} | {t * 1e3:.3f} |"
        if hvd:
            h = best["horovod"]["allreduce"][n]
            row += f" {h * 1e3:.3f} |"
        row += f" {s / t:.2f} |"
        if hvd:
            row += f" {s / h:.2f} |"
        print(row)
    print()
    s, t = best["sparsync"]["step"], best["torch"]["step"]
    print(f"DistributedOptimizer step, {LAYERS} x Linear({HIDDEN}, {HIDDEN}) "
          f"({LAYERS * HIDDEN * (HIDDEN + 1) * 4 / 2 ** 20:.0f} MiB of gradients), batch {BATCH}:")
    print()
    floor = best["local"]["step"]
    columns = [("sparsync DistributedOptimizer (ms)", f"{s * 1e3:.1f}"),
               ("DDP gloo (ms)", f"{t * 1e3:.1f}")]
    if hvd:
        h = best["horovod"]["step"]
        columns.append(("Horovod DistributedOptimizer (ms)", f"{h * 1e3:.1f}"))
    columns += [("no reduction (ms)", f"{floor * 1e3:.1f}"), ("sparsync / DDP", f"{s / t:.2f}")]
    if hvd:
        columns.append(("sparsync / Horovod", f"{s / h:.2f}"))
    columns.append(("no reduction / DDP", f"{floor / t:.2f}"))
    if hvd:
        columns.append(("no reduction / Horovod", f"{floor / h:.2f}"))
    print("| " + " | ".join(name for name, _ in columns) + " |")
    print("|" + "---:|" * len(columns))
    print("| " + " | ".join(value for _, value in columns) + " |")


if __name__ == "__main__":
    main()
