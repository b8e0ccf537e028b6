"""What the timeline costs (issue 19): step times with it on and off, alternating in one job.

    .venv/bin/python bench/timeline_overhead.py --np 2 --blocks 12 --steps 30 \\
        --out bench/results/timeline_overhead.json

Runs one sparsyncrun job (`--np` workers on as many simulated nodes) of a model with many
tensors (`--layers` linear layers of `--width`, so two tensors each: the timeline's per-tensor
events are what it records most of). The steps come in `--blocks` blocks; every other block
runs with the timeline on (every worker calls hvd.start_timeline at the block's start and
hvd.stop_timeline at its end, so the daemons write and close a file per block), the others
with it off, so that drift in the shared machine's load falls on both alike. Each block's first
`--skip` steps are not timed. Reported: the median step time of each block, the median over the
on blocks against the off blocks, the median of the ratios of neighbouring on/off pairs, and the
load average (1 min) before, during (per block) and after. Rank 0 writes the JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def worker(args):
    import time

    import torch

    import sparsync.torch as hvd

    torch.manual_seed(0)
    torch.set_num_threads(1)
    hvd.init()
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                   named_parameters=model.named_parameters())
    x = torch.randn(args.batch, args.width)

    def step():
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    for _ in range(10):  # warm-up: plans settle
        step()
    blocks = []
    for b in range(args.blocks):
        on = b % 2 == 1
        if on:
            hvd.start_timeline(os.path.join(args.trace_dir, "block%d-{node}.json" % b))
        times = []
        for i in range(args.skip + args.steps):
            t0 = time.perf_counter()
            step()
            if i >= args.skip:
                times.append(time.perf_counter() - t0)
        if on:
            hvd.stop_timeline()
        blocks.append({"timeline": on, "median_s": statistics.median(times),
                       "mean_s": statistics.fmean(times), "load": loadavg()})
    if hvd.rank() == 0:
        with open(args.result, "w") as f:
            json.dump(blocks, f)
    hvd.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=3)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--out", type=Path)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--trace-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    with tempfile.TemporaryDirectory(prefix="tl-bench-") as tmp:
        result = os.path.join(tmp, "result.json")
        before = loadavg()
        cmd = [sys.executable, "-m", "sparsync.run", "-np", str(args.np), sys.executable,
               str(HERE / "timeline_overhead.py"), "--worker", "--result", result,
               "--trace-dir", tmp] + [a for k in ("blocks", "steps", "skip", "layers", "width",
                                                 "batch")
                                      for a in ("--" + k, str(getattr(args, k)))]
        env = dict(os.environ, SPARSYNC_LOG_LEVEL="warn")
        subprocess.run(cmd, check=True, env=env)
        after = loadavg()
        blocks = json.load(open(result))
        traces = sorted(Path(tmp).glob("block*.json"))
        events = 0
        for t in traces:
            n = len(json.load(open(t)))  # each must be valid JSON
            if n == 0:
                sys.exit("%s is empty: the timeline recorded nothing, so the 'on' blocks did not "
                         "measure it" % t.name)
            events += n
        expected = sum(b["timeline"] for b in blocks) * args.np
        if len(traces) != expected:
            sys.exit("%d trace files for %d timed blocks on %d nodes: expected %d"
                     % (len(traces), sum(b["timeline"] for b in blocks), args.np, expected))
    on = [b["median_s"] for b in blocks if b["timeline"]]
    off = [b["median_s"] for b in blocks if not b["timeline"]]
    pairs = [blocks[i + 1]["median_s"] / blocks[i]["median_s"]
             for i in range(0, len(blocks) - 1, 2)]
    summary = {
        "command": " ".join(["bench/timeline_overhead.py"] + sys.argv[1:]),
        "np": args.np, "tensors": 2 * args.layers, "steps_per_block": args.steps,
        "median_step_off_ms": statistics.median(off) * 1e3,
        "median_step_on_ms": statistics.median(on) * 1e3,
        "overhead_of_medians": statistics.median(on) / statistics.median(off) - 1,
        "median_pair_overhead": statistics.median(pairs) - 1,
        "pair_overheads": [r - 1 for r in pairs],
        "load_before": before, "load_after": after,
        "load_per_block": [b["load"] for b in blocks],
        "trace_files": len(traces), "trace_events": events,
        "blocks": blocks,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "blocks"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
