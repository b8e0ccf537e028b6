#!/usr/bin/env python3
"""Peak memory of one sparsyncd serving one worker with ResNet-50-sized gradients
(torchvision's resnet50: 161 tensors, 25.6 M float32), compressor none, default merge.

    .venv/bin/python bench/daemon_memory.py [--steps 5] [--compressor topk]

Starts the daemon in a private directory, reads its resident set size when idle (the fixed
base), runs one worker that takes `steps` DistributedOptimizer steps, then reads the daemon's
peak resident set (VmHWM) and compares the growth over the base with the gradients' own bytes.
The last two columns say what the peak is made of, sampled every 5 ms while the worker runs: the
daemon's private memory (RssAnon: residuals, scratch) over its idle value, and the shared regions
it has touched (RssShmem). Those regions are the worker's `.grad` storage itself (gradients are
born in them), so they are memory the job would hold without the daemon too.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class PeakSampler:
    """Samples the daemon's private (RssAnon) and shared-memory (RssShmem) resident sets every
    5 ms: VmHWM is the peak of their sum, these say what it was made of."""

    def __init__(self, pid):
        self.pid, self.anon, self.shmem = pid, 0, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.wait(0.005):
            try:
                self.anon = max(self.anon, status_kib(self.pid, "RssAnon"))
                self.shmem = max(self.shmem, status_kib(self.pid, "RssShmem"))
            except (OSError, KeyError):
                return

    def stop(self):
        self.done.set()
        self.thread.join()


def worker(steps):
    import torch
    import torchvision
    import sparsync.torch as hvd
    torch.set_num_threads(1)
    hvd.init()
    model = torchvision.models.resnet50()
    params = [p for p in model.parameters()]
    coeffs = [torch.randn_like(p) for p in params]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters())
    for _ in range(steps):
        opt.zero_grad()
        # d/dp sum(p * c) = c: real gradients of every parameter without a forward pass.
        sum((p * c).sum() for p, c in zip(params, coeffs)).backward()
        opt.step()
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    print(f"GRAD_BYTES {grad_bytes} TENSORS {len(params)}", flush=True)
    hvd.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--compressor", default="none",
                    help="SPARSYNC_COMPRESSOR of the daemon (topk: error feedback keeps residuals)")
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return worker(args.steps)
    daemon_bin = os.environ.get("SPARSYNC_DAEMON", os.path.join(REPO, "build/daemon/sparsyncd"))
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, SPARSYNC_SOCKET=os.path.join(d, "d.sock"),
                   SPARSYNC_JOB_TOKEN="mem", SPARSYNC_LOG_LEVEL=os.environ.get("SPARSYNC_LOG_LEVEL", "warn"),
                   SPARSYNC_COMPRESSOR=args.compressor)
        daemon = subprocess.Popen([daemon_bin], env=env)
        try:
            for _ in range(200):
                if os.path.exists(env["SPARSYNC_SOCKET"]):
                    break
                time.sleep(0.05)
            time.sleep(0.2)
            base = status_kib(daemon.pid, "VmRSS")
            base_anon = status_kib(daemon.pid, "RssAnon")
            sampler = PeakSampler(daemon.pid)
            out = subprocess.run([sys.executable, __file__, "--worker", "--steps", str(args.steps)],
                                 env=dict(env, SPARSYNC_LOCAL_RANK="0"), check=True,
                                 capture_output=True, text=True).stdout
            peak = status_kib(daemon.pid, "VmHWM")
            sampler.stop()
        finally:
            daemon.terminate()
            daemon.wait()
    grad = int(out.split("GRAD_BYTES")[1].split()[0])
    growth = peak * 1024 - base * 1024
    anon_growth = (sampler.anon - base_anon) * 1024
    print("| compressor | gradients (MiB) | daemon idle RSS (MiB) | daemon peak RSS (MiB) | peak - idle (MiB) | (peak - idle) / gradients | sampled peak: private growth / gradients | sampled peak: shared regions / gradients |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.compressor} | {grad / 2**20:.1f} | {base / 1024:.1f} | {peak / 1024:.1f} | {growth / 2**20:.1f} | {growth / grad:.2f} | {anon_growth / grad:.2f} | {sampler.shmem * 1024 / grad:.2f} |")


if __name__ == "__main__":
    main()
