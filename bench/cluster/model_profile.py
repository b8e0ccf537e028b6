"""Model profiles (bench/profiles/<model>.json) and the replay schedule made from them.

A profile lists gradient tensors in backward order with their element counts and backward times
(bench/profiles/make_profiles.py). The replay workers turn it into a schedule: tensor l's gradient
is ready `ready_s[l]` seconds after backward starts (the running sum of the backward times, times
a scale), which is when a worker emulating that model hands it to the reducer.
"""

import json
from pathlib import Path

PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"


def resolve(name_or_path):
    """The file of a profile given by model name (bench/profiles/<name>.json) or path."""
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        return p
    return PROFILES_DIR / ("%s.json" % name_or_path)


def available():
    """Model names with a profile in bench/profiles/ (CPU profiles: no suffix)."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def load(name_or_path):
    """The profile as a dict; raises ValueError naming the file when it is malformed."""
    path = resolve(name_or_path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError("no profile %s (known: %s)" % (path, ", ".join(available())))
    except json.JSONDecodeError as e:
        raise ValueError("profile %s is not valid JSON: %s" % (path, e))
    tensors = doc.get("tensors")
    if not isinstance(tensors, list) or not tensors:
        raise ValueError("profile %s has no tensors" % path)
    for i, t in enumerate(tensors):
        if not isinstance(t.get("name"), str) or not isinstance(t.get("numel"), int) \
                or t["numel"] < 1 or not isinstance(t.get("backward_s"), (int, float)) \
                or t["backward_s"] < 0:
            raise ValueError("profile %s: tensor %d needs a name, numel >= 1 and backward_s >= 0, "
                             "got %r" % (path, i, t))
    if len({t["name"] for t in tensors}) != len(tensors):
        raise ValueError("profile %s: tensor names are not unique" % path)
    doc.setdefault("forward_s", 0.0)
    doc.setdefault("model", path.stem)
    return doc


class Schedule:
    """When each gradient is ready, relative to the start of backward, for a time scale."""

    def __init__(self, profile, time_scale=1.0):
        tensors = profile["tensors"]
        self.names = [t["name"] for t in tensors]
        self.numels = [int(t["numel"]) for t in tensors]
        self.shapes = [tuple(t.get("shape") or (t["numel"],)) for t in tensors]
        self.ready_s, total = [], 0.0
        for t in tensors:
            total += float(t["backward_s"]) * time_scale
            self.ready_s.append(total)
        self.backward_s = total
        self.forward_s = float(profile.get("forward_s", 0.0)) * time_scale

    def __len__(self):
        return len(self.names)

    @property
    def total_numel(self):
        return sum(self.numels)


def write_result(result, rows, warmup, out):
    """Adds the per-iteration timings (rows of (iteration, backward+comm, post lag, tail) seconds,
    warm-up first) to a worker's `result` and writes it as JSON to `out` ("-": stdout; "{rank}"
    is replaced by the result's rank)."""
    import json
    from pathlib import Path
    measured = rows[warmup:]
    result.update({
        "warmup_iter_s": [r[0] for r in rows[:warmup]],
        "iter_s": [r[0] for r in measured],
        "backward_comm_s": [r[1] for r in measured],
        "post_lag_s": [r[2] for r in measured],
        "tail_s": [r[3] for r in measured],
    })
    text = json.dumps(result, indent=1)
    if out == "-":
        print(text)
    else:
        Path(out.replace("{rank}", str(result["rank"]))).write_text(text + "\n")
