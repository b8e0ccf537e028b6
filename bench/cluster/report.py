"""Turns harness.py's results.json into a markdown table and a PNG bar chart.

    .venv/bin/python bench/cluster/report.py results.json --md table.md --png chart.png

Table: one row per (model, P, mode) with the measured mean and median iteration time (slowest
rank per iteration), the median time from the start of backward to the last result (what the
planner's timeline predicts: docs/algorithms.md §3 starts it at backward), the last plan's
predicted time and their ratio, the speed-up against sparsync's dense mode of the same model
and P (dense median / this median), and for the sparse modes the speed-up against the better of
layerwise and single (the OMGS paper's comparison). Failed runs are listed as such. The chart
shows median iteration times per model and mode, one panel per P, on a log scale. Without --md
the table goes to stdout.
"""

import argparse
import json
import sys
from pathlib import Path

MODE_ORDER = ["dense", "ddp", "layerwise", "single", "fixed", "omgs", "optimal"]
SPARSE = {"layerwise", "single", "fixed", "omgs", "optimal"}


def _key(run):
    mode = run["mode"]
    return (run["nodes"], run["model"], MODE_ORDER.index(mode) if mode in MODE_ORDER else 99)


def _fmt(x, pattern="%.1f"):
    return "-" if x is None else pattern % x


def _ok(run):
    return run is not None and run.get("status") == "ok"


def table(results):
    runs = sorted(results["runs"], key=_key)
    by = {(r["model"], r["nodes"], r["mode"]): r for r in runs}
    head = ("| model | P | mode | mean (ms) | median (ms) | backward+comm median (ms) "
            "| predicted (ms) | (backward+comm) / predicted | speed-up vs dense "
            "| vs best(layerwise, single) |")
    lines = [head, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        if not _ok(r):
            lines.append("| %s | %d | %s | failed | | | | | | |" % (r["model"], r["nodes"],
                                                                     r["mode"]))
            continue
        med = r["median_ms"]
        pred = r.get("predicted_ms")
        bwd = r.get("backward_comm_median_ms")
        dense = by.get((r["model"], r["nodes"], "dense"))
        speedup = dense["median_ms"] / med if _ok(dense) and r["mode"] != "dense" else None
        base = [by.get((r["model"], r["nodes"], m)) for m in ("layerwise", "single")]
        base = [b["median_ms"] for b in base if _ok(b)]
        vs_best = min(base) / med if base and r["mode"] in SPARSE else None
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["model"], r["nodes"], r["mode"], _fmt(r["mean_ms"]), _fmt(med),
            _fmt(bwd), _fmt(pred), _fmt(bwd / pred if pred and bwd else None, "%.2f"),
            _fmt(speedup, "%.2fx"),
            _fmt(vs_best, "%.2fx")))
    return "\n".join(lines) + "\n"


def header(results):
    m = results.get("meta", {})
    net = m.get("network", {})
    parts = ["%s, tbf %s (burst %s, latency %s)" % (m.get("date", "?"), net.get("rate", "?"),
                                                   net.get("burst", "?"),
                                                   net.get("latency", "?")),
             "density %s" % m.get("density", "?"), "time scale %s" % m.get("time_scale", "?"),
             "%s warm-up + %s measured iterations" % (m.get("warmup", "?"), m.get("iters", "?"))]
    text = "Command: `%s`\n\n%s.\n" % (m.get("command", "?"), "; ".join(parts))
    for nodes, flows in sorted(m.get("bandwidth", {}).items()):
        rates = ", ".join("%s->%s %.3f" % (f["from"], f["to"], f["gbps"]) for f in flows)
        text += "\nMeasured TCP throughput at P=%s (Gb/s): %s.\n" % (nodes, rates)
    return text


def chart(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results["runs"] if _ok(r)]
    sizes = sorted({r["nodes"] for r in runs})
    if not sizes:
        raise ValueError("no successful runs to plot")
    fig, axes = plt.subplots(len(sizes), 1, figsize=(11, 4 * len(sizes)), squeeze=False)
    for ax, nodes in zip(axes[:, 0], sizes):
        sub = [r for r in runs if r["nodes"] == nodes]
        models = list(dict.fromkeys(r["model"] for r in sorted(sub, key=_key)))
        modes = [m for m in MODE_ORDER if any(r["mode"] == m for r in sub)]
        width = 0.8 / max(1, len(modes))
        for j, mode in enumerate(modes):
            xs, ys = [], []
            for i, model in enumerate(models):
                hit = [r for r in sub if r["model"] == model and r["mode"] == mode]
                if hit:
                    xs.append(i + (j - (len(modes) - 1) / 2) * width)
                    ys.append(hit[0]["median_ms"])
            ax.bar(xs, ys, width, label=mode)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models)
        ax.set_yscale("log")
        ax.set_ylabel("median iteration (ms)")
        ax.set_title("P = %d, 1 Gb/s links" % nodes)
        ax.legend(ncol=len(modes), fontsize="small")
        ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="results.json written by harness.py")
    p.add_argument("--md", default="", help="write the markdown here (default: stdout)")
    p.add_argument("--png", default="", help="write the bar chart here (needs matplotlib)")
    args = p.parse_args(argv)
    results = json.loads(Path(args.results).read_text())
    text = header(results) + "\n" + table(results)
    if args.md:
        Path(args.md).write_text(text)
    else:
        sys.stdout.write(text)
    if args.png:
        chart(results, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
