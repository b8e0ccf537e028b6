"""Writes per-model gradient profiles (JSON) for the emulated-cluster benchmark (bench/cluster/).

A profile lists a model's gradient tensors in the order backward produces them, each with its
name, shape, element count and backward time: the time from the previous tensor's gradient being
ready (or from the start of backward, for the first) to this one's. The times are measured the
way OMGS-SGD's profiler does (docs/algorithms.md §1 and §5.2, t_b[l]): a hook on each parameter's
AccumulateGrad node records when its gradient is ready; a few warm-up iterations, then the
per-tensor median over the measured ones. The forward time is recorded too.

    .venv/bin/python bench/profiles/make_profiles.py                       # all, CPU, 1 thread
    .venv/bin/python bench/profiles/make_profiles.py --models resnet20 --iters 5
    .venv/bin/python bench/profiles/make_profiles.py --device cuda --suffix _gpu

Output: bench/profiles/<model><suffix>.json. The models are described in models.py.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

import models

HERE = Path(__file__).resolve().parent


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _machine(device):
    m = {"hostname": socket.gethostname(), "cpu": _cpu_name(), "logical_cpus": os.cpu_count(),
         "os": platform.platform(), "python": platform.python_version(),
         "torch": torch.__version__}
    try:
        m["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    if device.type == "cuda":
        m["gpu"] = torch.cuda.get_device_name(device)
    return m


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _ReadyRecorder:
    """Records when each parameter's gradient has been accumulated, in backward order."""

    def __init__(self, named_params, device):
        self.device = device
        self.events = []  # (name, time)
        self._accs = []
        for name, p in named_params:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._hook(name))
            self._accs.append(acc)  # the hooks live as long as their nodes

    def _hook(self, name):
        def hook(*_):
            _sync(self.device)  # on a GPU the gradient is ready when its kernels are done
            self.events.append((name, time.perf_counter()))
        return hook


def profile(spec, device, batch_size, warmup, iters, seed):
    torch.manual_seed(seed)
    model = spec.build().to(device)
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    shapes = {n: list(p.shape) for n, p in named}
    recorder = _ReadyRecorder(named, device)
    gen = torch.Generator().manual_seed(seed)
    x, loss_of = spec.batch(batch_size, gen)
    x = x.to(device)
    forward, backward, deltas, order = [], [], {n: [] for n, _ in named}, None
    for it in range(warmup + iters):
        for _, p in named:
            p.grad = None
        recorder.events.clear()
        _sync(device)
        t0 = time.perf_counter()
        loss = loss_of(model(x).float().cpu() if device.type == "cuda" else model(x))
        _sync(device)
        t1 = time.perf_counter()
        loss.backward()
        _sync(device)
        t2 = time.perf_counter()
        if it < warmup:
            continue
        names = [n for n, _ in recorder.events]
        if len(names) != len(named) or len(set(names)) != len(named):
            raise RuntimeError("%s: %d gradient-ready events for %d parameters"
                               % (spec.name, len(names), len(named)))
        if order is None:
            order = names
        prev = t1
        for name, t in recorder.events:
            deltas[name].append(t - prev)
            prev = t
        forward.append(t1 - t0)
        backward.append(t2 - t1)
    tensors = []
    for name in order:
        numel = 1
        for d in shapes[name]:
            numel *= d
        tensors.append({"name": name, "shape": shapes[name], "numel": numel,
                        "backward_s": round(statistics.median(deltas[name]), 9)})
    return {
        "forward_s": round(statistics.median(forward), 6),
        "backward_s": round(statistics.median(backward), 6),
        "tensors": tensors,
    }


def _dump(doc):
    """JSON with one tensor per line: readable and diffable, not one number per line."""
    head = {k: v for k, v in doc.items() if k != "tensors"}
    text = json.dumps(head, indent=2)[:-2]
    rows = ",\n".join("    " + json.dumps(t) for t in doc["tensors"])
    return text + ',\n  "tensors": [\n' + rows + "\n  ]\n}\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(models.MODELS),
                   help="comma-separated subset of: %s" % ", ".join(models.MODELS))
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured iterations (default 2)")
    p.add_argument("--iters", type=int, default=5, help="measured iterations (default 5)")
    p.add_argument("--batch-size", type=int, default=0,
                   help="samples per iteration (default: per model, see models.py)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--suffix", default="", help="appended to each file name, e.g. _gpu")
    p.add_argument("--out-dir", default=str(HERE), help="where to write (default: this folder)")
    args = p.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in models.MODELS]
    if unknown:
        p.error("unknown models %s; known: %s" % (unknown, ", ".join(models.MODELS)))
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available")
    torch.set_num_threads(args.threads)
    command = "%s %s" % (Path(sys.executable).name, shlex.join(
        [os.path.relpath(__file__)] + (sys.argv[1:] if argv is None else list(argv))))
    for name in names:
        spec = models.MODELS[name]
        batch = args.batch_size or spec.batch_size
        t = time.perf_counter()
        measured = profile(spec, device, batch, args.warmup, args.iters, args.seed)
        doc = {
            "model": name,
            "dataset": spec.dataset,
            "description": spec.description,
            "input_shape": list(spec.input_shape),
            "num_tensors": len(measured["tensors"]),
            "total_numel": sum(x["numel"] for x in measured["tensors"]),
            "forward_s": measured["forward_s"],
            "backward_s": measured["backward_s"],
            "measurement": {
                "device": device.type, "batch_size": batch, "threads": args.threads,
                "warmup_iters": args.warmup, "measured_iters": args.iters, "seed": args.seed,
                "machine": _machine(device),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "command": command,
                "method": "tensors in the order their AccumulateGrad hooks fired; backward_s = "
                          "median over measured iterations of the time since the previous "
                          "gradient was ready (the first: since backward started); forward_s, "
                          "backward_s of the model: medians of whole passes",
            },
            "tensors": measured["tensors"],
        }
        out = Path(args.out_dir) / ("%s%s.json" % (name, args.suffix))
        out.write_text(_dump(doc))
        print("%-13s %4d tensors %11d elements  forward %.3f s  backward %.3f s  (%.0f s) -> %s"
              % (name, doc["num_tensors"], doc["total_numel"], doc["forward_s"],
                 doc["backward_s"], time.perf_counter() - t, out), flush=True)


if __name__ == "__main__":
    main()
