#!/usr/bin/env python3
"""Soak (issue 16, item 4): a long top-k job on N nodes, the daemons' and workers' resident
memory and open descriptors sampled while it runs.

Runs worker.py on every node for --steps steps (top-k at density 0.01 with error feedback, three
gradients of 64 Ki, 293 Ki and 4 Ki elements), on loopback. Samples VmRSS and the descriptor
count of every daemon and worker every --every-s seconds. After the warm-up (the first
--warmup fraction of the steps), the growth of each process is (last - first) / first over the
samples after it; the soak passes when every process grows less than --max-growth (1 %) in RSS
and not at all in descriptors, and every worker completes its steps. With --daemon pointing at a
build with AddressSanitizer (-DSPARSYNC_SANITIZE=ON), the daemons' LeakSanitizer report at exit
is checked as well (the daemons must exit 0 and print no leak).

    nice -n 19 tests/faults/soak.py --steps 10000 --out bench/results/soak.json
    tests/faults/soak.py --steps 300 --daemon build-asan/daemon/sparsyncd   # LeakSanitizer
"""

import argparse
import json
import sys
import time

import cluster


def growth(samples, index):
    first, last = samples[0][index], samples[-1][index]
    return (last - first) / first if first else 0.0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--every-s", type=float, default=2.0)
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of the steps")
    p.add_argument("--max-growth", type=float, default=0.01)
    p.add_argument("--daemon", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    env = {"SPARSYNC_COMPRESSOR": "topk", "SPARSYNC_CALIBRATE": "0", "SPARSYNC_LOG_LEVEL": "warn",
           "SPARSYNC_MIN_COMPRESS_BYTES": "0", "SPARSYNC_TIMEOUT_S": "60",
           # LeakSanitizer runs at exit; the report must reach the daemon's log.
           "ASAN_OPTIONS": "detect_leaks=1:exitcode=23", "UBSAN_OPTIONS": "halt_on_error=1"}
    job = cluster.Job(args.nodes, env, daemon=args.daemon,
                      worker_env={"FAULT_STEPS": str(args.steps), "FAULT_STEP_PAUSE_S": "0"})
    start = time.monotonic()
    job.start()
    procs = job.daemons + job.workers
    warm_step = int(args.steps * args.warmup)
    series = {p.label: [] for p in procs}  # label -> [(step, rss_kib, fds)]
    while any(w.poll() is None for w in job.workers):
        step = min(job.steps_done(i) for i in range(args.nodes))
        # Only while every worker trains: a worker that has finished unmaps its regions, and the
        # daemons' memory then falls with it.
        running = all(w.poll() is None for w in job.workers)
        for proc in procs:
            s = cluster.sample(proc.pid)
            if s is not None and step >= warm_step and running:
                series[proc.label].append((step, s[0], s[1]))
        time.sleep(args.every_s)
    elapsed = time.monotonic() - start
    completed = [job.steps_done(i) for i in range(args.nodes)]
    worker_rcs = [w.proc.returncode for w in job.workers]
    job.stop_daemons()
    daemon_rcs = [d.proc.returncode for d in job.daemons]
    leaks = [d.label for d in job.daemons if "LeakSanitizer" in d.log()]
    result = {"steps": args.steps, "nodes": args.nodes, "seconds": round(elapsed, 1),
              "steps_per_s": round(min(completed) / elapsed, 1), "completed": completed,
              "worker_exit_codes": worker_rcs, "daemon_exit_codes": daemon_rcs,
              "leak_reports": leaks, "processes": {}}
    failures = []
    for label, samples in series.items():
        if len(samples) < 2:
            failures.append("%s: fewer than 2 samples after the warm-up" % label)
            continue
        g_rss, g_fds = growth(samples, 1), samples[-1][2] - samples[0][2]
        result["processes"][label] = {
            "samples": len(samples), "rss_kib_first": samples[0][1],
            "rss_kib_last": samples[-1][1], "rss_kib_max": max(s[1] for s in samples),
            "rss_growth": round(g_rss, 5), "fds_first": samples[0][2], "fds_last": samples[-1][2]}
        if g_rss >= args.max_growth:
            failures.append("%s: RSS grew %.2f %%" % (label, 100 * g_rss))
        if g_fds > 0:
            failures.append("%s: %d more open descriptors" % (label, g_fds))
    if any(c < args.steps for c in completed) or any(rc != 0 for rc in worker_rcs):
        failures.append("workers: steps %s, exit codes %s" % (completed, worker_rcs))
    if any(rc != 0 for rc in daemon_rcs) or leaks:
        failures.append("daemons: exit codes %s, leak reports from %s" % (daemon_rcs, leaks))
    left = job.leftovers()
    if any(left.values()):
        failures.append("left behind: %s" % left)
    result["failures"] = failures
    print(json.dumps(result, indent=1))
    if args.out:
        # The file also keeps every sample, [step, rss_kib, fds], to show whether a growth levels
        # off or keeps on.
        result["series"] = {label: [list(s) for s in samples] for label, samples in series.items()}
        with open(args.out, "w") as f:
            json.dump(result, f)
    if failures:
        print("soak: FAIL: %s (logs in %s)" % ("; ".join(failures), job.dir), file=sys.stderr)
        return 1
    job.remove()
    print("soak: pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
