#!/usr/bin/env python3
"""A DistributedOptimizer step on a model of many small tensors, N simulated nodes on this
machine: sparsync builds against torch's DistributedDataParallel (gloo) and, when
bench/peers/setup.sh made its environment, Horovod 0.28.1's DistributedOptimizer (Gloo).

    .venv/bin/python bench/many_tensors_step.py [--np 4] [--rounds 3] [--steps 60] \\
        [--layers 80] [--width 64] [--daemon NAME=PATH ...] [--shim NAME=DIR ...] \\
        [--merge PLANNER]

The model is `--layers` x Linear(width, width) with ReLU between (2 x layers gradient tensors,
4160 float32 elements each at width 64): what a real network's many biases and small layers cost
per tensor, without the matrix products of bench/dense_allreduce.py's step hiding it. Each
worker runs one thread; a step is zero_grad, forward, backward and step(), timed on rank 0; the
median over the steps after the first 20 (sparsync plans after 5 and may re-plan) is the
round's figure. sparsync runs with compressor none and its default planner (or `--merge`).
Each --daemon adds a sparsync side run with SPARSYNC_DAEMON=PATH (e.g. a build of an earlier
commit); each --shim adds a side whose workers import the Python package from DIR (the
shims/python folder of another checkout) with this checkout's daemon; without either the side is
this checkout's daemon and package. The sides alternate, `--rounds` times;
the load average before and after is printed, then each side's median over the rounds and its
ratio to DDP (the median of the per-round ratios).
"""
import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEER_PYTHON = os.path.join(HERE, "peers", ".venv", "bin", "python")
SKIP = 20


def worker(kind, layers, width, steps):
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if kind in ("sparsync", "horovod"):
        if kind == "sparsync":
            import sparsync.torch as hvd
        else:
            import horovod.torch as hvd
        hvd.init()
        rank, finish = hvd.rank(), hvd.shutdown
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, finish = dist.get_rank(), dist.destroy_process_group
        model = torch.nn.parallel.DistributedDataParallel(model)
    x = torch.randn(32, width, generator=torch.Generator().manual_seed(rank))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print("median step %.3f ms" % (statistics.median(times[SKIP:]) * 1e3), flush=True)
    finish()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_ms(cmd, env, ranks=None):
    """Runs `cmd` once (a launcher), or `ranks` copies with RANK set; rank 0's median step in ms."""
    if ranks is None:
        runs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)]
    else:
        runs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for r in range(ranks)]
    outs = [p.communicate(timeout=900) for p in runs]
    text = "".join(o + e for o, e in outs)
    match = re.search(r"median step ([\d.]+) ms", text)
    if any(p.returncode != 0 for p in runs) or not match:
        raise SystemExit("failed: %s\n%s" % (" ".join(cmd), text[-3000:]))
    return float(match.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--daemon", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--shim", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--merge", help="SPARSYNC_MERGE for the sparsync sides (default: its own)")
    ap.add_argument("--no-horovod", action="store_true")
    ap.add_argument("--worker", choices=["sparsync", "ddp", "horovod"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps <= SKIP:
        ap.error("--steps must exceed %d (the steps left out of the median)" % SKIP)
    if args.worker:
        return worker(args.worker, args.layers, args.width, args.steps)

    model = ["--layers", str(args.layers), "--width", str(args.width), "--steps", str(args.steps)]
    me = os.path.abspath(__file__)
    runner = os.path.join(os.path.dirname(sys.executable), "sparsyncrun")
    base = dict(os.environ, SPARSYNC_COMPRESSOR="none", SPARSYNC_LOG_LEVEL="warn")
    if args.merge:
        base["SPARSYNC_MERGE"] = args.merge
    envs = []
    for spec in args.daemon or ([] if args.shim else ["sparsync="]):
        name, _, path = spec.partition("=")
        envs.append((name, dict(base, SPARSYNC_DAEMON=os.path.abspath(path)) if path else base))
    if args.shim:
        # Another checkout's package would look for the daemon and client library in its tree.
        from sparsync._paths import find_client_library, find_daemon
        here = dict(base, SPARSYNC_DAEMON=find_daemon(), SPARSYNC_CLIENT_LIB=find_client_library())
        envs += [(name, dict(here, PYTHONPATH=os.path.abspath(path)))
                 for name, path in (spec.split("=", 1) for spec in args.shim)]
    sides = []
    cmd = [runner, "-np", str(args.np), sys.executable, me, "--worker", "sparsync"] + model
    for name, env in envs:
        sides.append((name, lambda env=env: step_ms(cmd, env)))

    def ddp():
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   WORLD_SIZE=str(args.np), GLOO_SOCKET_IFNAME="lo")
        return step_ms([sys.executable, me, "--worker", "ddp"] + model, env, ranks=args.np)
    sides.append(("ddp", ddp))
    if not args.no_horovod and os.access(PEER_PYTHON, os.X_OK):
        hvdrun = os.path.join(os.path.dirname(PEER_PYTHON), "horovodrun")
        cmd = [hvdrun, "--gloo", "-np", str(args.np), "-H", "localhost:%d" % args.np,
               PEER_PYTHON, me, "--worker", "horovod"] + model
        sides.append(("horovod", lambda: step_ms(cmd, dict(os.environ, HOROVOD_GLOO_IFACE="lo"))))

    print("%d x Linear(%d, %d): %d gradient tensors; %d node(s), %d steps, median after %d"
          % (args.layers, args.width, args.width, 2 * args.layers, args.np, args.steps, SKIP))
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    times = {name: [] for name, _ in sides}
    for r in range(args.rounds):
        for name, run in sides:
            times[name].append(run())
        print("round %d: %s" % (r + 1, ", ".join("%s %.2f ms" % (n, t[-1])
                                                  for n, t in times.items())), flush=True)
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())
    print()
    print("| side | median step (ms) | / DDP |")
    print("|---|---:|---:|")
    for name, t in times.items():
        ratio = statistics.median(a / b for a, b in zip(t, times["ddp"]))
        print("| %s | %.2f | %.2f |" % (name, statistics.median(t), ratio))


if __name__ == "__main__":
    main()
