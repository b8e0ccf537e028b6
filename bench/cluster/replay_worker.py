"""Replays a model's backward pass against sparsyncd: a worker that emulates one training node.

Instead of computing, each iteration waits the profile's forward time (unless --no-forward), then
walks the gradient tensors in backward order: tensor l's gradient is due `ready_s[l]` after
backward started (model_profile.Schedule); the worker writes random values (fixed seed) into
that tensor's shared buffer, sleeps until it is due, and posts it to the daemon at once, so the
daemon can merge, sparsify and exchange while "backward" goes on. The iteration ends when every
result is back. This is the path DistributedOptimizer takes (sparsync._client: one registered
GRADIENT buffer per tensor, post_ready as its hook fires, wait_done in step()), without PyTorch,
so that a 2-core machine can emulate several GPU nodes.

Run under a daemon's environment (SPARSYNC_SOCKET, SPARSYNC_JOB_TOKEN, SPARSYNC_LOCAL_RANK, as
sparsyncrun or bench/cluster/harness.py set them):

    replay_worker.py --profile resnet50 --warmup 7 --iters 20 --out /tmp/run/w{rank}.json

Writes JSON (to --out, or stdout): the measured iterations' wall times and, per iteration, the
time from the start of backward to the last result ("backward_comm_s"), how late the latest post
was against its schedule ("post_lag_s"), and the wait after the last post ("tail_s").
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

import model_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "shims" / "python"))
from sparsync import _client as C  # noqa: E402
from sparsync._errors import SparsyncError  # noqa: E402

# Random source: gradients are tiled from one pool (not one copy per tensor), at an offset that
# changes with the iteration and the tensor so that top-k does not see the same values each time.
_POOL = 1 << 20
_SLACK = 65537


def _sleep_until(deadline):
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left)


class ReplayWorker:
    def __init__(self, client, schedule, seed, prefix="gradient."):
        self.client, self.schedule = client, schedule
        rank = client.world["rank"]
        rng = np.random.default_rng(seed + 1000003 * rank)
        self.pool = rng.standard_normal(_POOL + _SLACK, dtype=np.float32)
        self.regs, self.buffers = [], []
        for name, shape in zip(schedule.names, schedule.shapes):
            reg = client.register(prefix + name, C.OP_GRADIENT, C.FLOAT32, shape)
            self.regs.append(reg)
            self.buffers.append(reg.raw().view(np.float32))  # the shared region, no copy

    def _fill(self, buf, iteration, index):
        off = (iteration * 7919 + index * 104729) % _SLACK
        for start in range(0, buf.size, _POOL):
            n = min(_POOL, buf.size - start)
            np.copyto(buf[start:start + n], self.pool[off:off + n])

    def iteration(self, it, forward, timeout_s):
        """Runs one iteration; returns (wall, backward_comm, post_lag, tail) in seconds."""
        s = self.schedule
        t0 = time.perf_counter()
        if forward:
            _sleep_until(t0 + s.forward_s)
        start = time.perf_counter()
        lag = 0.0
        for i, reg in enumerate(self.regs):
            self._fill(self.buffers[i], it, i)
            due = start + s.ready_s[i]
            _sleep_until(due)
            lag = max(lag, time.perf_counter() - due)
            self.client.post(reg)
        last_post = time.perf_counter()
        for reg in self.regs:
            self.client.wait(reg, timeout_s)
        end = time.perf_counter()
        return end - t0, end - start, lag, end - last_post

    def close(self):
        for reg in self.regs:
            self.client.unregister(reg)
        self.regs, self.buffers = [], []


def _float_env(name, default):
    v = os.environ.get(name, "")
    return float(v) if v else default


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True, help="model name in bench/profiles/ or a path")
    p.add_argument("--iters", type=int, default=20, help="measured iterations (default 20)")
    p.add_argument("--warmup", type=int, default=7,
                   help="unmeasured iterations first; at least SPARSYNC_PLAN_WARMUP_STEPS + 2 "
                        "so that the planner's plan is in force (default 7)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiplies the profile's forward and backward times (default 1)")
    p.add_argument("--no-forward", action="store_true", help="skip the forward wait")
    p.add_argument("--seed", type=int, default=0, help="seed of the random gradients")
    p.add_argument("--out", default="-",
                   help="result file ({rank} is replaced by the worker's rank; - for stdout)")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    profile = model_profile.load(args.profile)
    schedule = model_profile.Schedule(profile, args.time_scale)
    timeout_s = _float_env("SPARSYNC_TIMEOUT_S", 300.0) + 5.0
    socket_path = os.environ.get("SPARSYNC_SOCKET")
    if not socket_path:
        p.error("SPARSYNC_SOCKET is not set (run under sparsyncrun or the cluster harness)")
    try:
        client = C.Client(socket_path, os.environ.get("SPARSYNC_JOB_TOKEN") or None,
                          int(os.environ.get("SPARSYNC_LOCAL_RANK", "0") or 0),
                          _float_env("SPARSYNC_CONNECT_TIMEOUT_S", 10.0))
        worker = ReplayWorker(client, schedule, args.seed)
        rows = []
        for it in range(args.warmup + args.iters):
            rows.append(worker.iteration(it, not args.no_forward, timeout_s))
        worker.close()
        client.close()
    except SparsyncError as e:
        sys.stderr.write("replay_worker: %s\n" % e)
        return 1
    result = {
        "worker": "sparsync", "rank": client.world["rank"], "size": client.world["size"],
        "model": profile["model"], "profile": str(model_profile.resolve(args.profile)),
        "num_tensors": len(schedule), "total_numel": schedule.total_numel,
        "time_scale": args.time_scale, "forward": not args.no_forward,
        "replayed_forward_s": schedule.forward_s if not args.no_forward else 0.0,
        "replayed_backward_s": schedule.backward_s,
        "warmup": args.warmup, "iters": args.iters,
    }
    model_profile.write_result(result, rows, args.warmup, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
