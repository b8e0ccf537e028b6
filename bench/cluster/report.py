"""Turns harness.py's results.json into markdown tables and PNG charts.

    .venv/bin/python bench/cluster/report.py results.json --md table.md --png chart.png
    .venv/bin/python bench/cluster/report.py sweep.json --md sweep.md --sweep-png sweep.png
    .venv/bin/python bench/cluster/report.py a.json b.json --md table.md --png chart.png

Several results files (invocations measured apart, e.g. the long dense modes of a model in one
and its sparse modes and peers in another) make one report: a header per invocation, naming the
modes it ran, then the tables and charts over all their runs. The same mode of the same model, P
and D in two files is merged like harness.py --rounds (below).

All times are modelled ms (measured / the run's dilation D). The header gives the command, the
modelled and shaped links, D, how sparsification was modelled, the profiles' sources and the
machine's load averages at the start and end of the invocation.

Runs table: one row per (D, P, model, mode): mean and median iteration time (slowest rank per
iteration), the median time from the start of backward to the last result (what the planner's
timeline predicts: docs/algorithms.md §3 starts it at backward), the last plan's predicted time
and their ratio, the speed-up against sparsync's dense mode of the same model, P and D (dense
median / this median), and for the sparse modes the speed-up against the better of layerwise and
single (the OMGS paper's comparison). Failed runs are listed as such.

Runs from harness.py --rounds are merged: each cell is the median over the rounds (the median
column also gives the range of the rounds' medians and their number), and a table of each
mode's median in the forward and in the reversed rounds shows what the place in a round does.

Comparisons table: per (D, P, model), the issue's comparisons where both runs exist: omgs and
optimal against best(layerwise, single); the slowest sparse mode against dense; sparsync dense /
Horovod dense; sparsync single / TopK-SGD over Horovod; omgs and optimal against DDP+PowerSGD.

Ceiling table: per (D, P, model), what merging could give at best by the planner's own cost
model. Every plan line node 0 logs lists each planner's prediction under the cost model of that
moment ("predicted: optimal 94.18 ms omgs 125.60 ms layerwise 357.03 ms single 125.60 ms");
`optimal` is the exact optimum over contiguous groupings, so no merge plan is predicted faster.
From the last plan of every sparse run, the replayed forward added to each (the ratios above are
of whole iterations): (forward + the better of layerwise and single) / (forward + optimal), the
range over the runs; beside it the measured `optimal vs best(lw, single)`.

Sweep table (results with several D): per (P, model, mode) the median at each D and the ratio of
each D's median to the next D's. Charts: per model, the median of every mode (peers included)
at each P; the sweep chart plots each mode's median against D.
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

MODE_ORDER = ["dense", "ddp", "ddp_powersgd", "hvd_dense", "hvd_fp16", "hvd_topk", "layerwise",
              "single", "fixed", "omgs", "optimal", "optimal_always"]
SPARSE = {"layerwise", "single", "fixed", "omgs", "optimal", "optimal_always"}
PROFILES = Path(__file__).resolve().parents[1] / "profiles"


def _dil(run):
    return run.get("dilation", 1.0)


def _mode_rank(mode):
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else 99


def _key(run):
    return (_dil(run), run["nodes"], run["model"], _mode_rank(run["mode"]))


def _fmt(x, pattern="%.1f"):
    return "-" if x is None else pattern % x


def _ok(run):
    return run is not None and run.get("status") == "ok"


def _median_of(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def merged_runs(results):
    """One record per (model, P, D, mode): a single run as it is; the rounds of harness.py
    --rounds merged into the median of their medians (and of their means, backward+comm and
    predictions), with `rounds` (successful runs), `median_range` (their lowest and highest
    median) and `failed_rounds`. A mode counts as failed only when no round succeeded."""
    groups = {}
    for r in results["runs"]:
        groups.setdefault((r["model"], r["nodes"], _dil(r), r["mode"]), []).append(r)
    merged = []
    for runs in groups.values():
        ok = [r for r in runs if _ok(r)]
        if not ok:
            merged.append(dict(runs[-1], rounds=0, failed_rounds=len(runs)))
            continue
        m = dict(ok[0], rounds=len(ok), failed_rounds=len(runs) - len(ok))
        if len(ok) > 1:
            m["median_range"] = [min(r["median_ms"] for r in ok), max(r["median_ms"] for r in ok)]
        for field in ("median_ms", "mean_ms", "backward_comm_median_ms", "predicted_ms"):
            m[field] = _median_of(r.get(field) for r in ok)
        merged.append(m)
    return merged


def _index(results):
    return {(r["model"], r["nodes"], _dil(r), r["mode"]): r for r in merged_runs(results)}


def _median(by, model, nodes, d, mode):
    r = by.get((model, nodes, d, mode))
    return r["median_ms"] if _ok(r) else None


def _best_baseline(by, model, nodes, d):
    base = [_median(by, model, nodes, d, m) for m in ("layerwise", "single")]
    base = [b for b in base if b]
    return min(base) if base else None


def prediction_ratio(run):
    pred, bwd = run.get("predicted_ms"), run.get("backward_comm_median_ms")
    return bwd / pred if pred and bwd else None


def _median_cell(run):
    """The median, with the rounds' range where several ran: `20.3 (19.0-21.4, 5 rounds)`."""
    text = _fmt(run["median_ms"])
    if run.get("median_range"):
        lo, hi = run["median_range"]
        text += " (%.1f-%.1f, %d rounds)" % (lo, hi, run["rounds"])
    if run.get("failed_rounds"):
        text += " (%d failed)" % run["failed_rounds"]
    return text


def table(results):
    by = _index(results)
    runs = sorted(by.values(), key=_key)
    lines = ["| model | P | D | mode | mean (ms) | median (ms) | backward+comm median (ms) "
             "| predicted (ms) | (backward+comm) / predicted | speed-up vs dense "
             "| vs best(layerwise, single) |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        d = _dil(r)
        if not _ok(r):
            lines.append("| %s | %d | %g | %s | %s | | | | | | |"
                         % (r["model"], r["nodes"], d, r["mode"], r.get("status", "failed")))
            continue
        med = r["median_ms"]
        dense = _median(by, r["model"], r["nodes"], d, "dense")
        speedup = dense / med if dense and r["mode"] != "dense" else None
        base = _best_baseline(by, r["model"], r["nodes"], d)
        vs_best = base / med if base and r["mode"] in SPARSE else None
        lines.append("| %s | %d | %g | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["model"], r["nodes"], d, r["mode"], _fmt(r["mean_ms"]), _median_cell(r),
            _fmt(r.get("backward_comm_median_ms")), _fmt(r.get("predicted_ms")),
            _fmt(prediction_ratio(r), "%.2f"), _fmt(speedup, "%.2fx"),
            _fmt(vs_best, "%.2fx")))
    return "\n".join(lines) + "\n"


def _ratio(a, b, pattern="%.2fx"):
    return _fmt(a / b if a and b else None, pattern)


def comparisons(results):
    by = _index(results)
    groups = sorted({(_dil(r), r["nodes"], r["model"]) for r in results["runs"]})
    lines = ["| model | P | D | omgs vs best(lw, single) | optimal vs best(lw, single) "
             "| slowest sparse mode vs dense | sparsync dense / hvd_dense "
             "| sparsync single / hvd_topk | omgs vs ddp_powersgd | optimal vs ddp_powersgd |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for d, nodes, model in groups:
        def m(mode):
            return _median(by, model, nodes, d, mode)
        base = _best_baseline(by, model, nodes, d)
        sparse = [m(x) for x in SPARSE if m(x)]
        lines.append("| %s | %d | %g | %s | %s | %s | %s | %s | %s | %s |" % (
            model, nodes, d, _ratio(base, m("omgs")), _ratio(base, m("optimal")),
            _ratio(m("dense"), max(sparse)) if sparse else "-",
            _ratio(m("dense"), m("hvd_dense"), "%.2f"),
            _ratio(m("single"), m("hvd_topk"), "%.2f"),
            _ratio(m("ddp_powersgd"), m("omgs")), _ratio(m("ddp_powersgd"), m("optimal"))))
    return "\n".join(lines) + "\n"


def compress_table(results):
    """Compress only where it pays: optimal under `auto` against optimal_always, per model, P
    and D where both ran ("" when none)."""
    by = _index(results)
    lines = ["| model | P | D | optimal, auto (ms) | optimal_always (ms) | auto / always "
             "| dense (ms) | auto / dense |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for d, nodes, model in sorted({(_dil(r), r["nodes"], r["model"]) for r in results["runs"]}):
        if (model, nodes, d, "optimal_always") not in by:
            continue
        auto = _median(by, model, nodes, d, "optimal")
        always = _median(by, model, nodes, d, "optimal_always")
        dense = _median(by, model, nodes, d, "dense")
        lines.append("| %s | %d | %g | %s | %s | %s | %s | %s |" % (
            model, nodes, d, _fmt(auto), _fmt(always), _ratio(auto, always, "%.2f"),
            _fmt(dense), _ratio(auto, dense, "%.2f")))
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def order_table(results):
    """Under --rounds: each mode's median over the rounds in the listed order (0, 2, ...) and
    over the reversed ones (1, 3, ...), to show whether the place in a round moves a mode
    ("" when no mode ran in both)."""
    groups = {}
    for r in results["runs"]:
        if _ok(r):
            key = _key(r) + (r["mode"],)
            groups.setdefault(key, ([], []))[r.get("round", 0) % 2].append(r["median_ms"])
    lines = ["| model | P | D | mode | median, listed order (ms) | median, reversed (ms) "
             "| listed / reversed |", "|---|---:|---:|---|---:|---:|---:|"]
    for (d, nodes, model, _, mode), (listed, reversed_) in sorted(groups.items()):
        if listed and reversed_:
            a, b = _median_of(listed), _median_of(reversed_)
            lines.append("| %s | %d | %g | %s | %s | %s | %s |" % (
                model, nodes, d, mode, _fmt(a), _fmt(b), _ratio(a, b, "%.2f")))
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def prediction_summary(results, tolerance=0.15):
    """(within, total) sparsync runs whose backward+comm is within `tolerance` of the plan's
    prediction."""
    ratios = [prediction_ratio(r) for r in results["runs"] if _ok(r)]
    ratios = [x for x in ratios if x is not None]
    return sum(1 for x in ratios if abs(x - 1) <= tolerance), len(ratios)


def plan_predictions(line):
    """{planner: predicted ms} from a plan line's "predicted: optimal 94.18 ms omgs ..." list
    ({} when the line has none)."""
    m = re.search(r"predicted: ([^;)]*)", line)
    return {k: float(v) for k, v in re.findall(r"([\w-]+) ([\d.]+) ms", m.group(1))} if m else {}


def merge_ceiling(run):
    """(forward + best(layerwise, single)) / (forward + optimal), modelled, by the last plan of
    `run` that predicts all three; None when it has none."""
    for line in reversed(run.get("plans") or []):
        p = plan_predictions(line)
        if {"optimal", "layerwise", "single"} <= p.keys() and p["optimal"] > 0:
            d, fwd = _dil(run), run.get("replayed_forward_ms") or 0.0
            return (fwd + min(p["layerwise"], p["single"]) / d) / (fwd + p["optimal"] / d)
    return None


def ceiling_table(results):
    """The cost model's own bound on merging, per (D, P, model) ("" when no plan line
    predicts optimal, layerwise and single)."""
    by = _index(results)
    ceilings = {}
    for r in results["runs"]:
        if _ok(r) and r["mode"] in SPARSE:
            c = merge_ceiling(r)
            if c is not None:
                ceilings.setdefault((_dil(r), r["nodes"], r["model"]), []).append(c)
    lines = ["| model | P | D | runs | predicted optimal vs best(lw, single), range "
             "| median | measured optimal vs best(lw, single) |",
             "|---|---:|---:|---:|---|---:|---:|"]
    for (d, nodes, model), cs in sorted(ceilings.items()):
        base = _best_baseline(by, model, nodes, d)
        lines.append("| %s | %d | %g | %d | %.2f-%.2fx | %.2fx | %s |" % (
            model, nodes, d, len(cs), min(cs), max(cs), statistics.median(cs),
            _ratio(base, _median(by, model, nodes, d, "optimal"))))
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def sweep_table(results):
    by = _index(results)
    factors = sorted({_dil(r) for r in results["runs"]})
    if len(factors) < 2:
        return ""
    head = "| model | P | mode | " + " | ".join("D=%g (ms)" % d for d in factors) + " | " + \
        " | ".join("D=%g / D=%g" % (a, b) for a, b in zip(factors, factors[1:])) + " |"
    lines = [head, "|---|---:|---|" + "---:|" * (2 * len(factors) - 1)]
    for nodes, model, mode in sorted({(r["nodes"], r["model"], r["mode"])
                                      for r in results["runs"]},
                                     key=lambda k: (k[0], k[1], _mode_rank(k[2]))):
        meds = [_median(by, model, nodes, d, mode) for d in factors]
        lines.append("| %s | %d | %s | %s | %s |" % (
            model, nodes, mode, " | ".join(_fmt(x) for x in meds),
            " | ".join(_ratio(a, b, "%.3f") for a, b in zip(meds, meds[1:]))))
    return "\n".join(lines) + "\n"


def _profile_note(model):
    try:
        doc = json.loads((PROFILES / ("%s.json" % model)).read_text())
    except (OSError, ValueError):
        return "%s: profile not found" % model
    m = doc.get("measurement", {})
    src = m.get("source", {})
    kind = src.get("kind") or "measured on %s (%s)" % (m.get("device", "?"),
                                                       m.get("machine", {}).get("cpu", "?"))
    return "%s: %s, batch %s" % (model, kind, m.get("batch_size", "?"))


def header(results):
    parts = results.get("invocations")
    if parts:
        def modes(part):
            return ", ".join(sorted({r["mode"] for r in part["runs"]}, key=_mode_rank))

        return "".join("**Invocation %d of %d** (modes %s):\n\n%s\n"
                       % (i + 1, len(parts), modes(part), header(part))
                       for i, part in enumerate(parts))
    m = results.get("meta", {})
    net = m.get("network", {})
    runs = results.get("runs", [])
    links = sorted({(_dil(r), r["link"]["rate"], r["link"]["latency"]) for r in runs
                    if r.get("link")})
    parts = ["%s; modelled links tbf %s (burst %s, queue latency %s)"
             % (m.get("date", "?"), net.get("rate", "?"), net.get("burst", "?"),
                net.get("latency", "?")),
             "dilation D = %s" % ", ".join("%g" % d for d in m.get("dilation", [1.0])),
             "density %s" % m.get("density", "?"), "time scale %s" % m.get("time_scale", "?"),
             "%s warm-up (peers %s) + %s measured iterations"
             % (m.get("warmup", "?"), m.get("peer_warmup", "?"), m.get("iters", "?"))]
    text = "Command: `%s`\n\n%s.\n" % (m.get("command", "?"), "; ".join(parts))
    if links:
        text += "\nShaped (real) links: %s.\n" % "; ".join(
            "D=%g: rate %s, latency %s" % link for link in links)
    text += "\nSparsification: %s.\n" % m.get("sparsification", "not recorded")
    models = sorted({r["model"] for r in runs})
    if models:
        text += "\nProfiles: %s.\n" % "; ".join(_profile_note(x) for x in models)
    if m.get("load_average_start") or m.get("load_average_end"):
        text += ("\nLoad average (1, 5, 15 min) of this shared 2-core machine: %s at the start, "
                 "%s at the end.\n" % (m.get("load_average_start"), m.get("load_average_end")))
    def bw_order(key):  # "8", or "8@D20" when the invocation swept dilations
        nodes, _, d = key.partition("@D")
        return int(nodes), float(d or 1)

    for key, flows in sorted(m.get("bandwidth", {}).items(), key=lambda kv: bw_order(kv[0])):
        rates = ", ".join("%s->%s %.3f" % (f["from"], f["to"], f.get("modelled_gbps", f["gbps"]))
                          for f in flows)
        text += "\nMeasured TCP throughput at P=%s, modelled (measured x D, Gb/s): %s.\n" % (
            key, rates)
    within, total = prediction_summary(results)
    if total:
        text += "\nMeasured within 15 %% of predicted: %d of %d sparsync runs.\n" % (within,
                                                                                  total)
    return text


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _compute_line(ax, runs):
    """The replayed forward + backward: an iteration with free communication."""
    bound = [r["replayed_forward_ms"] + r["replayed_backward_ms"] for r in runs
             if "replayed_backward_ms" in r]
    if bound:
        ax.axhline(max(bound), color="gray", linestyle="--", linewidth=1,
                   label="forward + backward alone")


def chart(results, path):
    """One panel per model: median per mode, one bar per P (and D, if several)."""
    plt = _plt()
    runs = [r for r in merged_runs(results) if _ok(r)]
    models = list(dict.fromkeys(r["model"] for r in sorted(runs, key=_key)))
    if not models:
        raise ValueError("no successful runs to plot")
    fig, axes = plt.subplots(len(models), 1, figsize=(12, 3.6 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models):
        sub = [r for r in runs if r["model"] == model]
        modes = [x for x in MODE_ORDER if any(r["mode"] == x for r in sub)]
        series = sorted({(r["nodes"], _dil(r)) for r in sub})
        width = 0.8 / max(1, len(series))
        for j, (nodes, d) in enumerate(series):
            xs, ys = [], []
            for i, mode in enumerate(modes):
                hit = [r for r in sub if r["mode"] == mode and r["nodes"] == nodes
                       and _dil(r) == d]
                if hit:
                    xs.append(i + (j - (len(series) - 1) / 2) * width)
                    ys.append(hit[0]["median_ms"])
            ax.bar(xs, ys, width, label="P = %d, D = %g" % (nodes, d))
        _compute_line(ax, sub)
        ax.set_xticks(range(len(modes)))
        ax.set_xticklabels(modes, fontsize="small")
        ax.set_yscale("log")
        ax.set_ylabel("median iteration (modelled ms)")
        ax.set_title("%s, %s links" % (model, results.get("meta", {}).get("network", {}).get(
            "rate", "?")))
        ax.legend(fontsize="small")
        ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def sweep_chart(results, path):
    plt = _plt()
    runs = [r for r in merged_runs(results) if _ok(r)]
    groups = sorted({(r["nodes"], r["model"]) for r in runs})
    if not groups:
        raise ValueError("no successful runs to plot")
    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups), 4.5), squeeze=False)
    for ax, (nodes, model) in zip(axes[0], groups):
        sub = [r for r in runs if r["nodes"] == nodes and r["model"] == model]
        for mode in [x for x in MODE_ORDER if any(r["mode"] == x for r in sub)]:
            pts = sorted((_dil(r), r["median_ms"]) for r in sub if r["mode"] == mode)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
        _compute_line(ax, sub)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("dilation D")
        ax.set_ylabel("median iteration (modelled ms)")
        ax.set_title("%s, P = %d" % (model, nodes))
        ax.legend(fontsize="small")
        ax.grid(which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def render(results):
    text = header(results) + "\n" + table(results)
    sweep = sweep_table(results)
    if sweep:
        text += "\nThe same medians by dilation:\n\n" + sweep
    text += "\nComparisons (speed-ups: baseline / mode; ratios: mode / peer):\n\n" + \
        comparisons(results)
    order = order_table(results)
    if order:
        text += ("\nThe place in a round (harness.py --rounds runs the modes in the listed order "
                 "in rounds 0, 2, ... and reversed in rounds 1, 3, ...):\n\n" + order)
    ceiling = ceiling_table(results)
    if ceiling:
        text += ("\nWhat merging could give by the cost model (each run's last plan: its "
                 "optimum against its prediction of the better baseline, forward added):\n\n"
                 + ceiling)
    compress = compress_table(results)
    if compress:
        text += ("\nCompress only where it pays (`optimal` under the default "
                 "SPARSYNC_COMPRESS=auto against every group sparse):\n\n" + compress)
    return text


def load(paths):
    """The results of one harness invocation, or of several as one document: every run, and under
    "invocations" each file's own meta and runs (header() describes each)."""
    docs = [json.loads(Path(path).read_text()) for path in paths]
    if len(docs) == 1:
        return docs[0]
    return {"meta": docs[0].get("meta", {}),
            "runs": [run for doc in docs for run in doc.get("runs", [])],
            "invocations": [{"meta": doc.get("meta", {}), "runs": doc.get("runs", [])}
                            for doc in docs]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+",
                   help="results.json written by harness.py (several: one report of them all)")
    p.add_argument("--md", default="", help="write the markdown here (default: stdout)")
    p.add_argument("--png", default="", help="write the per-model chart here (matplotlib)")
    p.add_argument("--sweep-png", default="", help="write the dilation chart here")
    args = p.parse_args(argv)
    results = load(args.results)
    text = render(results)
    if args.md:
        Path(args.md).write_text(text)
    else:
        sys.stdout.write(text)
    if args.png:
        chart(results, args.png)
    if args.sweep_png:
        sweep_chart(results, args.sweep_png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
