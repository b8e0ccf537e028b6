"""Time to accuracy: iterations to a target (convergence runs) x per-iteration time (cluster).

    bench/fidelity/time_to_accuracy.py --runs DIR --task fmnist \
        --times bench/results/cluster_live_p4_resnet20_vgg16.json --model resnet20 --nodes 4 \
        [--target 88.0] [--pair dense=dense --pair topk-0.001=omgs ...] [--md out.md]
    bench/fidelity/time_to_accuracy.py --runs DIR --task fmnist \
        --times bench/results/cluster_dilated_p4_fmnist_cnn.json --model fmnist_cnn --nodes 4 \
        --dilation 20      # the trained CNN's own profile on the time-dilated cluster

The iterations come from bench/fidelity/convergence.py's results (DIR): the first iteration at
which a configuration's test metric, averaged over its seeds, reaches the target, interpolated
linearly between the per-epoch evaluations. The per-iteration times come from a cluster result
file: bench/cluster/harness.py's JSON ({"meta", "runs": [{"model", "nodes", "mode",
"median_ms"}, ...]}; the time-dilated harness writes the same fields) or a plain
{"mode": milliseconds} object. Each --pair CONFIG=MODE multiplies a configuration's iterations by
a mode's time; the default pairs dense with the dense ring and with torch DDP (same arithmetic),
and top-k at density 0.001 (its
convergence under the default planner) with every top-k merge mode the file has (layerwise,
single, fixed, omgs, optimal), which assumes the same iterations to target for each grouping.

When the times are of another model than the one trained (as with the emulated cluster's
profiles of the paper's models), the product is what the trained model's convergence would cost
at that model's per-iteration speed: a proxy, and the table says so. TASK_MODELS names the
profile of each task's own model (bench/profiles/models.py: fmnist_cnn is the demo's CNN).
"""

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import convergence  # noqa: E402

SPARSE_MODES = ("layerwise", "single", "fixed", "omgs", "optimal")


# The model each convergence task trains, as bench/profiles names its profile.
TASK_MODELS = {"fmnist": "fmnist_cnn"}


def load_times(path, model, nodes, dilation=None):
    """mode -> (median ms, where it came from)."""
    with open(path) as f:
        data = json.load(f)
    if "runs" not in data:
        return {str(k): (float(v), path) for k, v in data.items()}
    times = {}
    for r in data["runs"]:
        if r.get("status", "ok") != "ok" or r.get("median_ms") is None:
            continue
        name = os.path.splitext(os.path.basename(r["model"]))[0]  # a profile's name or path
        if (model and name != model) or (nodes and int(r["nodes"]) != nodes):
            continue
        if dilation is not None and float(r.get("dilation", 1)) != dilation:
            continue
        if r["mode"] in times:
            sys.exit("%s has more than one %s run of %s, P=%s: give --dilation"
                     % (path, r["mode"], r["model"], r["nodes"]))
        times[r["mode"]] = (float(r["median_ms"]), "%s P=%s%s" % (
            name, r["nodes"], " D=%g" % r["dilation"] if "dilation" in r else ""))
    return times


def iterations_to(target, curve, steps_per_epoch):
    """First iteration at which the per-epoch curve reaches target (linear between epochs; the
    first epoch's end when it is reached there, since nothing is measured before)."""
    for e, value in enumerate(curve, start=1):
        if value >= target:
            if e == 1:
                return steps_per_epoch
            lo = curve[e - 2]
            return (e - 1 + (target - lo) / (value - lo)) * steps_per_epoch
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, help="convergence.py's results folder")
    p.add_argument("--task", default="fmnist")
    p.add_argument("--times", required=True, help="per-iteration times (harness JSON or "
                   "{mode: ms})")
    p.add_argument("--model", help="the model of the times file to use (harness files)")
    p.add_argument("--nodes", type=int, help="the node count of the times file to use")
    p.add_argument("--dilation", type=float,
                   help="the time dilation of the times file to use (time-dilated harness files)")
    p.add_argument("--target", type=float,
                   help="test metric to reach (%%); default: dense's last-epoch mean minus 0.5")
    p.add_argument("--pair", action="append", default=[], metavar="CONFIG=MODE")
    p.add_argument("--md")
    args = p.parse_args()

    runs, records = convergence.collect(args.runs, args.task)
    if not runs:
        sys.exit("no finished %s runs under %s" % (args.task, args.runs))
    times = load_times(args.times, args.model, args.nodes, args.dilation)
    if not times:
        sys.exit("no per-iteration times for model %s, P=%s in %s"
                 % (args.model, args.nodes, args.times))
    curves = {c: [statistics.fmean(r[e] for r in rs) for e in range(min(map(len, rs)))]
              for c, rs in runs.items()}
    steps = {c: records[c][0]["steps_per_epoch"] for c in records}
    target = args.target
    if target is None:
        if "dense" not in curves:
            sys.exit("no dense runs: give --target")
        target = curves["dense"][-1] - convergence.TARGET_POINTS
    pairs = [tuple(s.split("=", 1)) for s in args.pair]
    if not pairs:
        pairs = [("dense", m) for m in ("dense", "ddp") if m in times]
        pairs += [(convergence.TARGET_CONFIGS[0], m) for m in SPARSE_MODES if m in times]
    metric = next(iter(records.values()))[0]["metric"]
    source = next(iter(times.values()))[1]
    lines = ["Target: %s %.2f %%. Iterations: mean curve over seeds of `%s` runs in %s; "
             "per-iteration times: median of %s from `%s`%s." % (
                 metric, target, args.task, args.runs, source, os.path.relpath(args.times),
                 "" if source.split()[0] == TASK_MODELS.get(args.task, args.task) else
                 " (another model than the one trained: a proxy)"), "",
             "| configuration | seeds | iterations to target | cluster mode | per iteration (ms) "
             "| time to target (s) | vs dense |", "|---|---:|---:|---|---:|---:|---:|"]
    dense_s = None
    rows = []
    for config, mode in pairs:
        if config not in curves or mode not in times:
            rows.append((config, mode, None, None, None, "missing %s" % (
                "runs" if config not in curves else "times")))
            continue
        its = iterations_to(target, curves[config], steps[config])
        ms = times[mode][0]
        seconds = its * ms / 1000.0 if its is not None else None
        if config == "dense" and mode == "dense":
            dense_s = seconds
        rows.append((config, mode, its, ms, seconds, ""))
    for config, mode, its, ms, seconds, why in rows:
        if why:
            lines.append("| %s | - | - | %s | - | - | %s |" % (config, mode, why))
            continue
        n = len(runs[config])
        if its is None:
            lines.append("| %s | %d | not reached in %d epochs | %s | %.1f | - | - |" % (
                config, n, len(curves[config]), mode, ms))
            continue
        vs = "%.2fx" % (dense_s / seconds) if dense_s else "-"
        lines.append("| %s | %d | %.0f | %s | %.1f | %.1f | %s |" % (config, n, its, mode, ms,
                                                                    seconds, vs))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
