"""The variance study of Wangni et al. through the daemons, on real gradients of the demo CNN.

    SPARSYNC_ERROR_FEEDBACK=0 SPARSYNC_MIN_COMPRESS_BYTES=0 SPARSYNC_MERGE=fixed:4 \
        sparsyncrun -np 4 python bench/fidelity/variance.py run --out variance.json
    python bench/fidelity/variance.py report variance.json --md variance.md --png variance.png

`run` (under sparsyncrun) trains the demo's CNN (examples/torch_fashion_mnist.py, seed 0) with
the exact dense path and stops at a few points of training. At each, every worker takes one
fixed batch of its shard; the exact average of the workers' gradients g is one exact allreduce.
Then, for each compressor and density, a probe copy of the model sends the same gradients
through a DistributedOptimizer with that compressor `--trials` times (fresh random draws each
time) and the averaged estimate Q is compared with g:

    variance ratio = mean over trials of ||Q - g||^2 / ||g||^2

at equal expected density: `wangni` (kept with p_i = min(lambda |g_i|, 1), scaled by 1/p_i) and
`randomk` without error feedback, which sends k = rho d shared coordinates scaled by d/k. For
random-k the expected ratio is known, sum over tensors (d/k - 1) ||g_t||^2 / ||g||^2, and is
printed beside the measurement as a check of the harness. The daemons must run with error
feedback off (random-k is unbiased only then) and every tensor compressed alone
(SPARSYNC_MERGE=fixed:4, SPARSYNC_MIN_COMPRESS_BYTES=0), so that the groups do not depend on
timing.
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def flat_grads(model):
    import torch
    return torch.cat([p.grad.detach().reshape(-1).double() for p in model.parameters()])


def run(args):
    import torch

    sys.path.insert(0, HERE)
    import tasks
    import sparsync.torch as hvd

    needed = {"SPARSYNC_ERROR_FEEDBACK": "0", "SPARSYNC_MIN_COMPRESS_BYTES": "0",
              "SPARSYNC_MERGE": "fixed:4"}
    wrong = {k: os.environ.get(k) for k, v in needed.items() if os.environ.get(k) != v}
    if wrong:
        sys.exit("variance.py run needs the daemons started with %s (got %s)"
                 % (" ".join("%s=%s" % kv for kv in needed.items()), wrong))
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    rank, size = hvd.rank(), hvd.size()
    task = tasks.FashionMnist(rank, size, seed=0)
    model = task.model()
    optimizer = task.optimizer(model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         sparsify=hvd.Dense())
    compressors = {"wangni": hvd.Wangni, "randomk": hvd.RandomK}
    densities = [float(d) for d in args.densities.split(",")]
    probes = []
    for name in args.compressors.split(","):
        for density in densities:
            probe = copy.deepcopy(model)
            opt = hvd.DistributedOptimizer(
                torch.optim.SGD(probe.parameters(), lr=0.0),
                named_parameters=[("%s.%g.%s" % (name, density, n), p)
                                  for n, p in probe.named_parameters()],
                sparsify=compressors[name](density=density))
            probes.append((name, density, probe, opt))
    sizes = [p.numel() for p in model.parameters()]
    checkpoints = sorted(int(s) for s in args.at_steps.split(","))
    rows = []
    step, start = 0, time.monotonic()
    epoch = 0
    while checkpoints:
        epoch += 1
        for x, y in task.batches(epoch):
            if checkpoints and step == checkpoints[0]:
                checkpoints.pop(0)
                rows.extend(measure(hvd, task, model, probes, sizes, step, epoch, args.trials))
                if rank == 0:
                    print("step %d measured (%.0f s)" % (step, time.monotonic() - start),
                          flush=True)
            if not checkpoints:
                break
            optimizer.zero_grad()
            task.loss(model, x, y).backward()
            optimizer.step()
            step += 1
    if rank == 0:
        env = {k: v for k, v in os.environ.items() if k.startswith("SPARSYNC_")
               and k not in ("SPARSYNC_JOB_TOKEN", "SPARSYNC_SOCKET")}
        with open(args.out, "w") as f:
            json.dump({"workers": size, "trials": args.trials, "tensor_sizes": sizes,
                       "env": env, "wall_s": time.monotonic() - start, "rows": rows}, f,
                      indent=1)
    hvd.shutdown()


def measure(hvd, task, model, probes, sizes, step, epoch, trials):
    """Variance ratios of every probe at the model's current weights, on one batch per worker."""
    import torch

    # A fixed batch of this worker's shard: the first of the next epoch's order.
    x, y = next(iter(task.batches(epoch + 1000)))
    exact = copy.deepcopy(model)
    exact.zero_grad()
    task.loss(exact, x, y).backward()
    g = hvd.allreduce(flat_grads(exact), name="variance.exact.%d" % step)  # average, exact
    g2 = float(g.dot(g))
    per_tensor = torch.split(g, sizes)
    rows = []
    for name, density, probe, opt in probes:
        probe.load_state_dict(model.state_dict())
        ratios, nonzero, along = [], [], []
        mean = torch.zeros_like(g)
        for _ in range(trials):
            opt.zero_grad()
            task.loss(probe, x, y).backward()
            opt.synchronize()
            q = flat_grads(probe)
            ratios.append(float((q - g).dot(q - g)) / g2)
            along.append(float(q.dot(g)) / g2)
            nonzero.append(int((q != 0).sum()))
            mean += q / trials
        row = {"step": step, "compressor": name, "density": density, "g_norm2": g2,
               "variance_ratio": statistics.fmean(ratios),
               "variance_ratio_sd": statistics.stdev(ratios) if trials > 1 else 0.0,
               "along_mean": statistics.fmean(along),
               "mean_relative_error": float((mean - g).norm()) / g2 ** 0.5,
               "nonzero_fraction": statistics.fmean(nonzero) / g.numel()}
        if name == "randomk":
            expected = 0.0
            for t, d in zip(per_tensor, sizes):
                k = min(d, max(1, int(density * d)))
                expected += (d / k - 1) * float(t.dot(t))
            row["expected_ratio"] = expected / g2
        rows.append(row)
    return rows


def report(args):
    with open(args.results) as f:
        data = json.load(f)
    rows = data["rows"]
    steps = sorted({r["step"] for r in rows})
    densities = sorted({r["density"] for r in rows})
    by = {(r["step"], r["compressor"], r["density"]): r for r in rows}
    lines = ["Variance ratio E||Q - g||^2 / ||g||^2 of the averaged estimate over %d workers, "
             "%d trials each (mean ± sd over trials); random-k's expected value in brackets; "
             "nnz: fraction of coordinates nonzero in the averaged estimate."
             % (data["workers"], data["trials"]), "",
             "| training step | density | wangni | randomk (unbiased) [expected] | "
             "randomk / wangni | nnz wangni | nnz randomk |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for s in steps:
        for d in densities:
            w, r = by.get((s, "wangni", d)), by.get((s, "randomk", d))
            if not (w and r):
                continue
            lines.append("| %d | %g | %.3g ± %.2g | %.3g ± %.2g [%.3g] | %.1fx | %.4f | %.4f |" % (
                s, d, w["variance_ratio"], w["variance_ratio_sd"], r["variance_ratio"],
                r["variance_ratio_sd"], r["expected_ratio"],
                r["variance_ratio"] / w["variance_ratio"], w["nonzero_fraction"],
                r["nonzero_fraction"]))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 5))
        for s in steps:
            for name, style in (("wangni", "-o"), ("randomk", "--s")):
                pts = [(d, by[(s, name, d)]["variance_ratio"]) for d in densities
                       if (s, name, d) in by]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, ms=4,
                        label="%s, step %d" % (name, s))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("density (expected fraction of coordinates per worker)")
        ax.set_ylabel("E||Q - g||^2 / ||g||^2")
        ax.set_title("Demo CNN gradients through 4 daemons: Wangni vs uniform random-k",
                     fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="the measurement (under sparsyncrun)")
    r.add_argument("--out", required=True)
    r.add_argument("--at-steps", default="0,50,234,702",
                   help="training steps at which to measure (234 steps = 1 epoch on 4 workers)")
    r.add_argument("--densities", default="0.001,0.01,0.05")
    r.add_argument("--compressors", default="wangni,randomk")
    r.add_argument("--trials", type=int, default=30)
    s = sub.add_parser("report", help="table and plot from a run's JSON")
    s.add_argument("results")
    s.add_argument("--md")
    s.add_argument("--png")
    args = p.parse_args()
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
