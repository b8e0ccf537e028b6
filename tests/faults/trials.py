#!/usr/bin/env python3
"""Fault trials (issue 16, item 3): break a running job on N nodes and check that it ends well.

Kinds of fault, each at a random step of a random victim:
  worker       kill -9 of a worker
  daemon       kill -9 of a daemon other than node 0's
  coordinator  kill -9 of node 0's daemon (it hosts the coordinator)
  stop         SIGSTOP of a daemon (a hung node)
  link         the victim's network link set down (its namespace's veth)
Each daemon runs in its own network namespace (198.18.0.0/24), one worker per node (worker.py:
top-k gradients through the real client library). After the fault the harness waits for every
worker to end on its own, then stops the daemons as sparsyncrun does (SIGTERM and SIGCONT,
SIGKILL after 5 s). A trial passes when
  - every worker ended by itself within 2 x SPARSYNC_TIMEOUT_S of the fault,
  - every live worker's first error names the lost node ("node V"; the cut-off or hung node's
    own worker may name the nodes it lost instead),
  - every daemon honoured SIGTERM within the grace period (and the whole job ended within
    2 x SPARSYNC_TIMEOUT_S + that grace),
  - nothing was left: no process, memfd, socket or token file, nothing in the namespaces.
Each trial's record (exit codes, times, first errors, leftovers) goes to --out as JSON lines; a
summary per kind is printed at the end. Needs root (namespaces).

    tests/faults/trials.py --trials 3 --timeout-s 8      # CI: 3 of each kind
    nice -n 19 tests/faults/trials.py --trials 100 --out bench/results/fault_trials.jsonl
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import sys
import time

import cluster

KINDS = ["worker", "daemon", "coordinator", "stop", "link"]


def first_error(log):
    for line in log.splitlines():
        if line.startswith("ERROR: "):
            return line[len("ERROR: "):]
    return None


def names_node(text, node):
    """Whether `text` names node `node`: "node 3", or "not on node(s) 3" / "not on node(s) 1,3"
    as the daemons' timeout names the nodes a tensor is missing on."""
    return bool(text) and (re.search(r"\bnode %d\b" % node, text) is not None or
                           re.search(r"not on node\(s\) (?:\d+,)*%d\b" % node, text) is not None)


def inject(job, kind, victim):
    if kind == "worker":
        job.workers[victim].signal(signal.SIGKILL)
    elif kind in ("daemon", "coordinator"):
        job.daemons[victim].signal(signal.SIGKILL)
    elif kind == "stop":
        job.daemons[victim].signal(signal.SIGSTOP)
    elif kind == "link":
        job.network.set_link(victim, up=False)


def run_trial(args, network, kind, rng, index):
    nodes = args.nodes
    victim = {"worker": rng.randrange(nodes), "daemon": rng.randrange(1, nodes),
              "coordinator": 0, "stop": rng.randrange(nodes), "link": rng.randrange(nodes)}[kind]
    step = rng.randint(args.min_step, args.max_step)
    env = {"SPARSYNC_TIMEOUT_S": str(args.timeout_s), "SPARSYNC_COMPRESSOR": "topk",
           "SPARSYNC_CALIBRATE": "0", "SPARSYNC_LOG_LEVEL": "info",
           "SPARSYNC_MIN_COMPRESS_BYTES": "0"}
    job = cluster.Job(nodes, env, network=network, daemon=args.daemon)
    record = {"trial": index, "kind": kind, "victim": victim, "step": step,
              "timeout_s": args.timeout_s, "failures": []}
    limit = 2 * args.timeout_s
    try:
        job.start()
        # The fault comes once the victim's node (or, for a killed worker, everyone) is at `step`.
        watch = [w for w in range(nodes) if w != victim] if kind == "worker" else [victim]
        deadline = time.monotonic() + 120
        while min(job.steps_done(w) for w in watch) < step:
            if time.monotonic() > deadline or any(w.poll() is not None for w in job.workers):
                raise RuntimeError("the job did not reach step %d before the fault" % step)
            time.sleep(0.01)
        t0 = time.monotonic()
        inject(job, kind, victim)
        # Every worker must end by itself.
        while time.monotonic() - t0 < limit and any(w.poll() is None for w in job.workers):
            time.sleep(0.02)
        late = [w.label for w in job.workers if w.poll() is None]
        if late:
            record["failures"].append("workers still running %.0f s after the fault: %s"
                                      % (limit, late))
        workers_ended = time.monotonic() - t0
        job.stop_daemons()
        job.kill_everything()  # whatever is left now is a failure already recorded
        record["workers_ended_s"] = round(workers_ended, 3)
        record["last_exit_s"] = round(max(p.ended_at for p in job.workers + job.daemons) - t0, 3)
        record["exit_codes"] = {p.label: p.proc.returncode for p in job.workers + job.daemons}
        record["needed_sigkill"] = [p.label for p in job.daemons + job.workers if p.killed]
        errors = {}
        for i, w in enumerate(job.workers):
            if kind == "worker" and i == victim:
                continue
            err = first_error(w.log())
            errors[w.label] = err
            if err is None:
                record["failures"].append("%s printed no error" % w.label)
            elif i == victim and kind in ("stop", "link"):
                # The cut-off node's own worker: from there the others are lost, and naming them
                # ("not on node(s) 1,2,3") is as right as naming itself.
                if not re.search(r"\bnode(?:\(s\))? \d", err):
                    record["failures"].append("%s's error names no node" % w.label)
            elif not names_node(err, victim):
                record["failures"].append("%s's error does not name node %d" % (w.label, victim))
        record["first_errors"] = errors
        daemons_killed = [d.label for d in job.daemons if d.killed]
        if daemons_killed:
            record["failures"].append("SIGTERM not honoured within %.0f s by %s"
                                      % (cluster.STOP_GRACE_S, daemons_killed))
        if record["last_exit_s"] > limit + cluster.STOP_GRACE_S:
            record["failures"].append("the job ended %.1f s after the fault" % record["last_exit_s"])
    except Exception as e:  # noqa: BLE001 - a broken trial is a failed trial, with its reason
        record["failures"].append("harness: %s" % e)
        job.kill_everything()
    finally:
        if kind == "link":
            network.set_link(victim, up=True)
    left = job.leftovers(killed=[victim] if kind in ("daemon", "coordinator") else [])
    record["leftovers"] = left
    if any(left.values()):
        record["failures"].append("left behind: %s" % {k: v for k, v in left.items() if v})
    record["passed"] = not record["failures"]
    if not record["passed"] and args.keep_failed:
        record["logs"] = str(job.dir)
    else:
        job.remove()
    return record


def summarize(records):
    lines = ["| kind | trials | passed | workers ended (median / max s) | last exit (max s) |",
             "|---|---|---|---|---|"]
    for kind in KINDS:
        rs = [r for r in records if r["kind"] == kind]
        if not rs:
            continue
        ended = [r["workers_ended_s"] for r in rs if "workers_ended_s" in r]
        last = [r["last_exit_s"] for r in rs if "last_exit_s" in r]
        lines.append("| %s | %d | %d | %s | %s |" % (
            kind, len(rs), sum(r["passed"] for r in rs),
            "%.2f / %.2f" % (statistics.median(ended), max(ended)) if ended else "-",
            "%.2f" % max(last) if last else "-"))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default=",".join(KINDS), help="comma list of %s" % KINDS)
    p.add_argument("--trials", type=int, default=3, help="trials of each kind")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--timeout-s", type=float, default=10.0, help="SPARSYNC_TIMEOUT_S")
    p.add_argument("--min-step", type=int, default=2)
    p.add_argument("--max-step", type=int, default=12)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--daemon", default=None, help="sparsyncd (default: the build's)")
    p.add_argument("--prefix", default="spft", help="network objects' name prefix")
    p.add_argument("--out", default=None, help="append one JSON line per trial here")
    p.add_argument("--keep-failed", action="store_true", help="keep the logs of failed trials")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            p.error("unknown kind %r" % k)
    if os.geteuid() != 0:
        print("trials.py: needs root for the network namespaces", file=sys.stderr)
        return 77
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print("fault trials: %s x %d on %d nodes, SPARSYNC_TIMEOUT_S=%g, seed %d"
          % (",".join(kinds), args.trials, args.nodes, args.timeout_s, seed), flush=True)
    network = cluster.Network(args.nodes, args.prefix)
    network.setup()
    records = []
    interrupted = []
    signal.signal(signal.SIGTERM, lambda *_: interrupted.append(1))
    try:
        order = [k for _ in range(args.trials) for k in kinds]
        for index, kind in enumerate(order):
            if interrupted:
                break
            r = run_trial(args, network, kind, rng, index)
            records.append(r)
            print("%4d %-11s victim %d step %2d: %s%s" % (
                index, kind, r["victim"], r["step"], "pass" if r["passed"] else "FAIL",
                "" if r["passed"] else " " + "; ".join(r["failures"])), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
    finally:
        network.teardown()
    print(summarize(records))
    return 0 if records and all(r["passed"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
