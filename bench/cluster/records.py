"""What one harness run records: the workers' timings summarised, and node 0's plan lines.

Times in a record are modelled milliseconds: what was measured divided by the run's dilation
(dilation.py); the wall-clock figures are kept beside them ("wall_*").
"""

import re
import statistics

PREDICTED_RE = r"predicted ([0-9.]+) ?ms"


def parse_plans(log_text):
    """[(line, predicted ms or None)] for each line of a daemon log that announces a plan; the
    predictions are the daemon's own, in wall-clock ms."""
    plans = []
    for line in log_text.splitlines():
        m = re.search(PREDICTED_RE, line)
        if re.search(r"plan v\d+", line) or m:
            plans.append({"line": line.strip(), "predicted_ms": float(m.group(1)) if m else None})
    return plans


def summarize(worker_results, dilation=1.0):
    """Per measured iteration the slowest rank's time; statistics over iterations, in modelled
    ms (measured / dilation)."""
    per_iter = [max(vals) for vals in zip(*[w["iter_s"] for w in worker_results])]
    bwd = [max(vals) for vals in zip(*[w["backward_comm_s"] for w in worker_results])]
    ms = [1e3 * x / dilation for x in per_iter]
    out = {
        "iteration_ms": [round(x, 3) for x in ms],
        "mean_ms": round(statistics.mean(ms), 3),
        "median_ms": round(statistics.median(ms), 3),
        "stdev_ms": round(statistics.stdev(ms), 3) if len(ms) > 1 else 0.0,
        "min_ms": round(min(ms), 3),
        "backward_comm_median_ms": round(1e3 * statistics.median(bwd) / dilation, 3),
        "post_lag_max_ms": round(1e3 * max(max(w["post_lag_s"]) for w in worker_results)
                                 / dilation, 3),
        "replayed_forward_ms": round(1e3 * worker_results[0]["replayed_forward_s"] / dilation, 3),
        "replayed_backward_ms": round(1e3 * worker_results[0]["replayed_backward_s"] / dilation,
                                      3),
        "wall_median_ms": round(1e3 * statistics.median(per_iter), 3),
    }
    selects = [w["select_s"] for w in worker_results if w.get("select_s")]
    if selects:
        out["select_median_ms"] = round(1e3 * statistics.median(
            max(v) for v in zip(*selects)) / dilation, 3)
    return out
