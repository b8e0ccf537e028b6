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

The warm-up configurations (convergence.WARMUP_EPOCHS) are priced with --warmup-times: a harness
run made with --density-warmup-steps gives a median per density of the warm-up and one after it;
each iteration to target is priced at its own density's, scaled so that the steps after the
warm-up cost the plain mode's median from --times (the run of the dense baseline).

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


def load_warmup_stages(path, model, nodes, dilation=None):
    """mode -> the median ms of each density of a warm-up ([stage 0..3, after it]) and where it
    came from, from harness runs made with --density-warmup-steps (iteration i is the tensors'
    step meta.warmup + i)."""
    with open(path) as f:
        data = json.load(f)
    stages = {}
    for r in data.get("runs", []):
        steps = int(r.get("env", {}).get("SPARSYNC_DENSITY_WARMUP_STEPS", 0))
        name = os.path.splitext(os.path.basename(r["model"]))[0]
        if (r.get("status", "ok") != "ok" or not steps or (model and name != model)
                or (nodes and int(r["nodes"]) != nodes)
                or (dilation is not None and float(r.get("dilation", 1)) != dilation)):
            continue
        parts = [[] for _ in range(5)]
        for i, ms in enumerate(r["iteration_ms"]):
            step = data["meta"]["warmup"] + i
            parts[4 * step // steps if step < steps else 4].append(ms)
        if not all(parts):
            sys.exit("%s: the %s run measured no iteration of some warm-up density (give the "
                     "harness --warmup W --iters N with N > 4 * SPARSYNC_DENSITY_WARMUP_STEPS / 4 "
                     "- W)" % (path, r["mode"]))
        stages[r["mode"]] = ([statistics.median(x) for x in parts], "%s P=%s%s" % (
            name, r["nodes"], " D=%g" % r["dilation"] if "dilation" in r else ""))
    return stages


def warmup_seconds(iterations, warmup_steps, stage_ms):
    """Time of `iterations` steps of a job whose first `warmup_steps` go through the four warm-up
    densities (a quarter each, stage_ms[0..3] per step) and the rest at stage_ms[4]."""
    quarter = warmup_steps / 4.0
    ms = sum(min(max(iterations - s * quarter, 0.0), quarter) * stage_ms[s] for s in range(4))
    return (ms + max(iterations - warmup_steps, 0.0) * stage_ms[4]) / 1000.0


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
    p.add_argument("--warmup-times", help="a harness JSON of sparse runs made with "
                   "--density-warmup-steps: prices the warm-up configurations ("
                   + ", ".join(convergence.WARMUP_EPOCHS) + ") density by density")
    p.add_argument("--md")
    args = p.parse_args()

    runs, records = convergence.collect(args.runs, args.task)
    if not runs:
        sys.exit("no finished %s runs under %s" % (args.task, args.runs))
    times = load_times(args.times, args.model, args.nodes, args.dilation)
    warmup_stages = (load_warmup_stages(args.warmup_times, args.model, args.nodes, args.dilation)
                     if args.warmup_times else {})
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
        if args.warmup_times:
            pairs += [(c, m) for c in convergence.WARMUP_EPOCHS for m in SPARSE_MODES
                      if m in warmup_stages and c in curves]
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
        warm = config in convergence.WARMUP_EPOCHS
        if config not in curves or mode not in (warmup_stages if warm else times):
            rows.append((config, mode, None, None, None, "missing %s" % (
                "runs" if config not in curves else
                "warm-up times (--warmup-times)" if warm else "times")))
            continue
        its = iterations_to(target, curves[config], steps[config])
        if warm:
            # The warm-up run gives each density's cost relative to its own steps after the
            # warm-up; the plain mode's median (the run the dense baseline came from) sets the
            # level, so that run-to-run drift between the two files does not enter the ratio.
            own = warmup_stages[mode][0]
            level = times[mode][0] if mode in times else own[4]
            stage_ms = [level * x / own[4] for x in own]
            warmup_steps = convergence.WARMUP_EPOCHS[config] * steps[config]
            seconds = warmup_seconds(its, warmup_steps, stage_ms) if its is not None else None
            ms = 1000.0 * seconds / its if its else stage_ms[4]
        else:
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
    if warmup_stages:
        lines += ["", "Warm-up configurations: per iteration is the mean over the iterations to "
                  "target, each priced at its density's median from `%s` (%s), a run made with "
                  "SPARSYNC_DENSITY_WARMUP_STEPS, scaled by the plain mode's median above over "
                  "that run's own median after its warm-up (densities, then after): %s." % (
                      os.path.relpath(args.warmup_times),
                      next(iter(warmup_stages.values()))[1],
                      "; ".join("%s %s ms" % (m, " / ".join("%.1f" % x for x in v[0]))
                                for m, v in warmup_stages.items()))]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
