"""The emulated 1 Gb/s cluster benchmark: OMGS and its baselines on P namespaces (issue 4).

For each P in --nodes it builds P network namespaces on a bridge, each link shaped to 1 Gb/s in
both directions (netns.py), and for each model profile and mode starts one sparsyncd and one
replay worker per namespace (or one torch.distributed DDP worker, mode `ddp`), runs --warmup then
--iters iterations, and records per-iteration wall times and the plan's predicted iteration time
that node 0's daemon logs. Everything is torn down afterwards, also on failure, Ctrl-C, SIGTERM
or SIGHUP; `--cleanup` removes what a killed run left behind. Needs root, except --dry-run,
which prints every command (network, daemons, workers with their environment, teardown) and
runs nothing.

Modes (SPARSYNC_* given to the daemons):
  dense      SPARSYNC_COMPRESSOR=none: sparsync's Gloo ring allreduce with the daemon's default
             merge (MG-WFBP for compressor none) or --dense-merge (e.g. fixed:64MiB, Horovod's)
  ddp        torch.distributed DistributedDataParallel, gloo backend (ddp_worker.py)
  layerwise  topk, SPARSYNC_MERGE=layerwise (LAGS-SGD: each tensor alone)
  single     topk, SPARSYNC_MERGE=single (TopK-SGD: one group after backward)
  fixed      topk, SPARSYNC_MERGE=fixed:<4 * --fixed-elements> bytes (the authors' 8192
             float32 elements; the daemon merges consecutive tensors up to that many bytes)
  omgs       topk, SPARSYNC_MERGE=omgs (the paper's greedy merge)
  optimal    topk, SPARSYNC_MERGE=optimal (exact over contiguous groupings)
Sparse modes also get SPARSYNC_DENSITY (--density), SPARSYNC_MIN_COMPRESS_BYTES
(--min-compress-bytes, default 0: every group is sparsified, as in the paper) and every
sparsync mode SPARSYNC_PLAN_WARMUP_STEPS (--plan-warmup-steps).

    .venv/bin/python bench/cluster/harness.py --dry-run --nodes 4
    .venv/bin/python bench/cluster/harness.py --measure-bandwidth --bandwidth-only --nodes 4
    .venv/bin/python bench/cluster/harness.py --models resnet20 --nodes 4 \\
        --modes dense,single,fixed --iters 3 --out results.json
    .venv/bin/python bench/cluster/harness.py --cleanup
    .venv/bin/python bench/cluster/report.py results.json --md table.md --png chart.png
"""

import argparse
import datetime
import json
import os
import re
import secrets
import shlex
import signal
import socket
import statistics
import sys
import time
from pathlib import Path

import model_profile
import netns
from procs import Runner, env_argv, warn

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODES = ["dense", "ddp", "layerwise", "single", "fixed", "omgs", "optimal"]
SPARSE_MERGE = {"layerwise": "layerwise", "single": "single", "omgs": "omgs",
                "optimal": "optimal"}
COORDINATOR_PORT, DDP_PORT, BANDWIDTH_PORT = 29400, 29500, 5201
PREDICTED_RE = r"predicted ([0-9.]+) ?ms"


class Interrupted(Exception):
    pass


def mode_env(mode, args):
    """The SPARSYNC_* settings of a sparsync mode (an empty dict for ddp)."""
    if mode == "ddp":
        return {}
    env = {"SPARSYNC_PLAN_WARMUP_STEPS": str(args.plan_warmup_steps)}
    if mode == "dense":
        env["SPARSYNC_COMPRESSOR"] = "none"
        if args.dense_merge:
            env["SPARSYNC_MERGE"] = args.dense_merge
        return env
    env.update({"SPARSYNC_COMPRESSOR": "topk", "SPARSYNC_DENSITY": str(args.density),
                "SPARSYNC_MIN_COMPRESS_BYTES": str(args.min_compress_bytes)})
    if mode == "fixed":
        env["SPARSYNC_MERGE"] = "fixed:%d" % (4 * args.fixed_elements)  # float32 bytes
    else:
        env["SPARSYNC_MERGE"] = SPARSE_MERGE[mode]
    return env


def parse_plans(log_text):
    """[(line, predicted ms or None)] for each line of a daemon log that announces a plan."""
    plans = []
    for line in log_text.splitlines():
        m = re.search(PREDICTED_RE, line)
        if re.search(r"plan v\d+", line) or m:
            plans.append({"line": line.strip(), "predicted_ms": float(m.group(1)) if m else None})
    return plans


def summarize(worker_results):
    """Per measured iteration the slowest rank's time; statistics over iterations, in ms."""
    per_iter = [max(vals) for vals in zip(*[w["iter_s"] for w in worker_results])]
    bwd = [max(vals) for vals in zip(*[w["backward_comm_s"] for w in worker_results])]
    ms = [1e3 * x for x in per_iter]
    return {
        "iteration_ms": [round(x, 3) for x in ms],
        "mean_ms": round(statistics.mean(ms), 3),
        "median_ms": round(statistics.median(ms), 3),
        "stdev_ms": round(statistics.stdev(ms), 3) if len(ms) > 1 else 0.0,
        "min_ms": round(min(ms), 3),
        "backward_comm_median_ms": round(1e3 * statistics.median(bwd), 3),
        "post_lag_max_ms": round(1e3 * max(max(w["post_lag_s"]) for w in worker_results), 3),
        "replayed_forward_ms": round(1e3 * worker_results[0]["replayed_forward_s"], 3),
        "replayed_backward_ms": round(1e3 * worker_results[0]["replayed_backward_s"], 3),
    }


class Harness:
    def __init__(self, args, runner):
        self.args, self.runner = args, runner
        self.daemon = args.daemon
        self.python = args.python
        self.results = {"meta": self._meta(), "runs": []}
        self.run_index = 0
        self.net = None

    def _meta(self):
        a = self.args
        return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "host": socket.gethostname(), "cpus": os.cpu_count(),
                "command": shlex.join(sys.argv), "daemon": self.daemon,
                "network": {"rate": a.rate, "burst": a.burst, "latency": a.latency},
                "density": a.density, "time_scale": a.time_scale, "forward": not a.no_forward,
                "warmup": a.warmup, "iters": a.iters, "plan_warmup_steps": a.plan_warmup_steps,
                "fixed_elements": a.fixed_elements, "bandwidth": {}}

    def save(self):
        if self.args.dry_run:
            return
        tmp = Path(self.args.out + ".tmp")
        tmp.write_text(json.dumps(self.results, indent=1) + "\n")
        tmp.replace(self.args.out)

    # --- network ------------------------------------------------------------------------------

    def setup_network(self, nodes):
        self.net = netns.Network(nodes, self.args.prefix, self.args.rate, self.args.burst,
                                 self.args.latency)
        self.runner.note("network: %d namespaces on bridge %s, tbf %s on both ends of each link"
                         % (nodes, self.net.bridge, self.args.rate))
        for cmd in self.net.setup_commands():
            self.runner.run(cmd)

    def teardown_network(self):
        if self.net is None:
            return
        self.runner.note("teardown: processes, qdiscs, veths, namespaces, bridge")
        self.runner.stop_all()
        if not self.runner.dry_run:
            netns.kill_namespace_processes([self.net.namespace(i) for i in range(self.net.nodes)])
        for cmd in self.net.teardown_commands():
            try:
                self.runner.run(cmd, check=False, timeout_s=20)
            except Exception as e:  # keep tearing down whatever else exists
                warn("teardown step %s: %s" % (shlex.join(cmd), e))
        self.net = None

    def measure_bandwidth(self, nodes, run_dir):
        """TCP throughput 0->1, 1->0, then all nodes at once around the ring; Gb/s."""
        flows = [[(0, 1)], [(1, 0)], [(i, (i + 1) % nodes) for i in range(nodes)]]
        out = []
        for k, pairs in enumerate(flows):
            self.runner.note("bandwidth: %s" % ", ".join("%d->%d" % p for p in pairs))
            recvs = []
            for src, dst in pairs:
                argv = self.net.in_ns(dst, [self.python, str(HERE / "bandwidth.py"), "recv",
                                            "--bind", self.net.address(dst),
                                            "--port", str(BANDWIDTH_PORT + k)])
                recvs.append(self.runner.start("recv%d" % dst, argv,
                                               run_dir / ("bw%d-%d-%d.json" % (k, src, dst))))
            senders = [self.runner.start("send%d" % src, self.net.in_ns(src, [
                self.python, str(HERE / "bandwidth.py"), "send", "--to",
                "%s:%d" % (self.net.address(dst), BANDWIDTH_PORT + k), "--seconds",
                str(self.args.bandwidth_seconds)]), run_dir / ("bw%d-%d-send.log" % (k, src)))
                for src, dst in pairs]
            if self.runner.dry_run:
                continue
            wait_all(senders + recvs, self.args.bandwidth_seconds + 30)
            self.runner.stop(senders + recvs)
            for r in recvs:
                try:
                    out.append(json.loads(Path(r.log_path).read_text().strip().splitlines()[-1]))
                except (ValueError, IndexError):
                    warn("bandwidth probe gave no result: %s" % r.log_tail())
            for rec in out[-len(pairs):]:
                print("bandwidth %s -> %s (%d flow(s)): %.3f Gb/s"
                      % (rec["from"], rec["to"], len(pairs), rec["gbps"]), flush=True)
        self.results["meta"]["bandwidth"][str(nodes)] = out

    # --- one run ------------------------------------------------------------------------------

    def _worker_argv(self, script, model, out_path):
        a = self.args
        argv = [self.python, str(HERE / script), "--profile", model, "--iters", str(a.iters),
                "--warmup", str(a.warmup), "--time-scale", str(a.time_scale),
                "--out", str(out_path)]
        return argv + (["--no-forward"] if a.no_forward else [])

    def run_one(self, model, mode, nodes, run_dir):
        if not self.runner.dry_run:
            run_dir.mkdir(parents=True, exist_ok=True)
        self.run_index += 1
        port_offset = self.run_index % 500  # no waiting for a port still in TIME_WAIT
        net, base = self.net, {"PYTHONPATH": str(REPO / "shims" / "python"),
                               "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.runner.note("run: model %s, P=%d, mode %s (logs in %s)" % (model, nodes, mode,
                                                                      run_dir))
        daemons, workers = [], []
        record = {"model": model, "nodes": nodes, "mode": mode, "run_dir": str(run_dir),
                  "env": mode_env(mode, self.args), "status": "failed"}
        started = time.monotonic()
        try:
            if mode == "ddp":
                for i in range(nodes):
                    env = dict(base, MASTER_ADDR=net.address(0),
                               MASTER_PORT=str(DDP_PORT + port_offset), RANK=str(i),
                               WORLD_SIZE=str(nodes), GLOO_SOCKET_IFNAME=net.node_if(i))
                    argv = net.in_ns(i, env_argv(env) + self._worker_argv(
                        "ddp_worker.py", model, run_dir / ("w%d.json" % i)) + [
                        "--timeout-s", str(self.args.sparsync_timeout_s)])
                    workers.append(self.runner.start("worker %d" % i, argv,
                                                     run_dir / ("w%d.log" % i)))
            else:
                token = secrets.token_hex(16)
                coordinator = "%s:%d" % (net.address(0), COORDINATOR_PORT + port_offset)
                sockets = [run_dir / ("n%d.sock" % i) for i in range(nodes)]
                common = dict(base, SPARSYNC_NUM_NODES=str(nodes), SPARSYNC_LOCAL_SIZE="1",
                              SPARSYNC_COORDINATOR=coordinator, SPARSYNC_JOB_TOKEN=token,
                              SPARSYNC_TIMEOUT_S=str(self.args.sparsync_timeout_s),
                              SPARSYNC_LOG_LEVEL=self.args.log_level)
                common.update(record["env"])
                for i in range(nodes):
                    env = dict(common, SPARSYNC_NODE_RANK=str(i), SPARSYNC_LISTEN=net.address(i),
                               SPARSYNC_SOCKET=str(sockets[i]))
                    daemons.append(self.runner.start(
                        "daemon %d" % i, net.in_ns(i, env_argv(env) + [self.daemon]),
                        run_dir / ("d%d.log" % i)))
                self.runner.note("wait until every daemon has created its socket")
                wait_for_sockets(sockets, daemons, self.args.start_timeout_s, self.runner.dry_run)
                for i in range(nodes):
                    env = dict(base, SPARSYNC_SOCKET=str(sockets[i]), SPARSYNC_JOB_TOKEN=token,
                               SPARSYNC_LOCAL_RANK="0", SPARSYNC_RANK=str(i),
                               SPARSYNC_SIZE=str(nodes),
                               SPARSYNC_TIMEOUT_S=str(self.args.sparsync_timeout_s))
                    argv = net.in_ns(i, env_argv(env) + self._worker_argv(
                        "replay_worker.py", model, run_dir / ("w%d.json" % i)))
                    workers.append(self.runner.start("worker %d" % i, argv,
                                                     run_dir / ("w%d.log" % i)))
            self.runner.note("wait for the workers, then SIGTERM the daemons")
            if self.runner.dry_run:
                self.runner.stop(workers + daemons)
                return
            wait_all(workers, self.args.run_timeout_s, watch=daemons)
            ws = [json.loads((run_dir / ("w%d.json" % i)).read_text()) for i in range(nodes)]
            record.update(summarize(ws))
            record["status"] = "ok"
        except Interrupted:
            record["status"] = "interrupted"
            raise
        except Exception as e:
            record["error"] = str(e)
            record["logs"] = {p.label: p.log_tail(1500) for p in daemons + workers}
            warn("run %s P=%d %s failed: %s" % (model, nodes, mode, e))
        finally:
            self.runner.stop(workers + daemons)
            if daemons and not self.runner.dry_run:
                d0 = (run_dir / "d0.log").read_text(errors="replace")
                plans = parse_plans(d0)
                record["plans"] = [p["line"] for p in plans][-20:]
                predicted = [p["predicted_ms"] for p in plans if p["predicted_ms"] is not None]
                record["predicted_ms"] = predicted[-1] if predicted else None
            record["wall_s"] = round(time.monotonic() - started, 1)
            if not self.runner.dry_run:
                self.results["runs"].append(record)
                self.save()
                if record["status"] == "ok":
                    print("%-13s P=%d %-9s mean %9.1f ms  median %9.1f ms  predicted %s  "
                          "(%.0f s)" % (model, nodes, mode, record["mean_ms"],
                                        record["median_ms"], record.get("predicted_ms"),
                                        record["wall_s"]), flush=True)


def wait_for_sockets(sockets, daemons, timeout_s, dry_run):
    if dry_run:
        return
    deadline = time.monotonic() + timeout_s
    while not all(s.exists() for s in sockets):
        for d in daemons:
            if d.poll() is not None:
                raise RuntimeError("%s exited (%s) during start-up:\n%s"
                                   % (d.label, d.poll(), d.log_tail()))
        if time.monotonic() > deadline:
            raise RuntimeError("daemons did not create their sockets within %.0f s" % timeout_s)
        time.sleep(0.05)


def wait_all(procs, timeout_s, watch=()):
    """Waits for every process in `procs` to exit 0; a failure, a watched process exiting, or
    the timeout raises RuntimeError with the log tail of the culprit."""
    deadline = time.monotonic() + timeout_s
    while True:
        pending = False
        for p in procs:
            rc = p.poll()
            if rc is None:
                pending = True
            elif rc != 0:
                raise RuntimeError("%s exited with %s:\n%s" % (p.label, rc, p.log_tail()))
        if not pending:
            return
        for w in watch:
            if w.poll() is not None:
                raise RuntimeError("%s exited (%s) while workers ran:\n%s"
                                   % (w.label, w.poll(), w.log_tail()))
        if time.monotonic() > deadline:
            raise RuntimeError("workers still running after %.0f s (--run-timeout-s)"
                               % timeout_s)
        time.sleep(0.2)


# --- command line ----------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(prog="harness.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet20,vgg16,alexnet,resnet50,inception_v4,lstm_ptb",
                   help="profiles in bench/profiles/ (names or paths), comma-separated")
    p.add_argument("--nodes", default="4,8", help="cluster sizes, comma-separated (default 4,8)")
    p.add_argument("--modes", default=",".join(MODES), help="subset of: " + ", ".join(MODES))
    p.add_argument("--iters", type=int, default=20, help="measured iterations (default 20)")
    p.add_argument("--warmup", type=int, default=None,
                   help="unmeasured iterations first (default 3 * --plan-warmup-steps + 2: the "
                        "first plan, then room for the re-plans the measured costs cause)")
    p.add_argument("--plan-warmup-steps", type=int, default=5,
                   help="SPARSYNC_PLAN_WARMUP_STEPS for the daemons (default 5)")
    p.add_argument("--density", type=float, default=0.001, help="SPARSYNC_DENSITY of topk")
    p.add_argument("--fixed-elements", type=int, default=8192,
                   help="mode fixed: merge threshold in float32 elements (default 8192)")
    p.add_argument("--min-compress-bytes", default="0",
                   help="SPARSYNC_MIN_COMPRESS_BYTES of the sparse modes (default 0)")
    p.add_argument("--dense-merge", default="",
                   help="SPARSYNC_MERGE of mode dense (default: the daemon's default)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiplies the profiles' forward and backward times (default 1)")
    p.add_argument("--no-forward", action="store_true", help="workers skip the forward wait")
    p.add_argument("--rate", default="1gbit", help="tbf rate of every link (default 1gbit)")
    p.add_argument("--burst", default="128kb", help="tbf burst (default 128kb)")
    p.add_argument("--latency", default="10ms", help="tbf latency, i.e. queue (default 10ms)")
    p.add_argument("--measure-bandwidth", action="store_true",
                   help="measure TCP throughput across the shaped links first")
    p.add_argument("--bandwidth-only", action="store_true",
                   help="with --measure-bandwidth: set up, measure, tear down, nothing else")
    p.add_argument("--bandwidth-seconds", type=float, default=3.0)
    p.add_argument("--out", default="results.json", help="results file (default results.json)")
    p.add_argument("--run-dir", default="",
                   help="logs and sockets (default /tmp/spsc-<date-time>; keep it short)")
    p.add_argument("--daemon", default="", help="sparsyncd (default: build/daemon/sparsyncd)")
    p.add_argument("--python", default=sys.executable, help="Python of the workers")
    p.add_argument("--prefix", default=netns.DEFAULT_PREFIX,
                   help="name prefix of namespaces and links (default spsc)")
    p.add_argument("--log-level", default="info", help="SPARSYNC_LOG_LEVEL (default info)")
    p.add_argument("--sparsync-timeout-s", type=int, default=120,
                   help="SPARSYNC_TIMEOUT_S of daemons and workers (default 120)")
    p.add_argument("--start-timeout-s", type=float, default=60.0)
    p.add_argument("--run-timeout-s", type=float, default=1800.0,
                   help="give up on one run after this long (default 1800)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--cleanup", action="store_true",
                   help="remove namespaces, links and processes left by a killed run, and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="print commands as they run")
    args = p.parse_args(argv)
    args.node_counts = [int(n) for n in args.nodes.split(",") if n]
    args.mode_list = [m for m in args.modes.split(",") if m]
    args.model_list = [m for m in args.models.split(",") if m]
    bad = [m for m in args.mode_list if m not in MODES]
    if bad:
        p.error("unknown modes %s; known: %s" % (bad, ", ".join(MODES)))
    if any(n < 2 for n in args.node_counts):
        p.error("--nodes: every cluster needs at least 2 nodes")
    if args.warmup is None:
        args.warmup = 3 * args.plan_warmup_steps + 2
    elif args.warmup < args.plan_warmup_steps + 2 and set(args.mode_list) - {"dense", "ddp"}:
        warn("--warmup %d < --plan-warmup-steps + 2: the planners' plans may not be in force "
             "in the measured iterations" % args.warmup)
    if not args.daemon:
        args.daemon = str(REPO / "build" / "daemon" / "sparsyncd")
    if not args.run_dir:
        args.run_dir = "/tmp/spsc-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSYNC_")}
    if args.cleanup:
        if os.geteuid() != 0 and not args.dry_run:
            warn("--cleanup needs root")
            return 2
        spaces, links = netns.cleanup(args.prefix, Runner(args.dry_run, True, None, base_env))
        print("removed %d namespace(s), %d link(s)" % (len(spaces), len(links)))
        return 0
    if not args.dry_run:
        if os.geteuid() != 0:
            warn("needs root (network namespaces, tc); --dry-run shows what it would do")
            return 2
        if not os.access(args.daemon, os.X_OK):
            warn("sparsyncd not found at %s (build it, or --daemon PATH)" % args.daemon)
            return 2
        for m in [] if args.bandwidth_only else args.model_list:
            try:
                model_profile.load(m)  # fail before building anything
            except ValueError as e:
                warn(str(e))
                return 2
    run_root = Path(args.run_dir)
    if not args.dry_run:
        run_root.mkdir(parents=True, exist_ok=True)
    runner = Runner(args.dry_run, args.verbose,
                    None if args.dry_run else run_root / "commands.log", base_env)
    harness = Harness(args, runner)

    def on_signal(signum, frame):
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C must not cut the teardown short
        raise Interrupted(signal.Signals(signum).name)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    if not args.dry_run:
        spaces, links = netns.leftovers(args.prefix)
        if spaces or links:
            warn("removing leftovers of an earlier run: %s" % ", ".join(spaces + links))
            netns.cleanup(args.prefix, runner)
    rc = 0
    try:
        for nodes in args.node_counts:
            harness.setup_network(nodes)
            try:
                if args.measure_bandwidth:
                    bw_dir = run_root / ("bandwidth-P%d" % nodes)
                    if not args.dry_run:
                        bw_dir.mkdir(parents=True, exist_ok=True)
                    harness.measure_bandwidth(nodes, bw_dir)
                    harness.save()
                if args.bandwidth_only:
                    continue
                for model in args.model_list:
                    for mode in args.mode_list:
                        name = "%s-P%d-%s" % (Path(model).stem, nodes, mode)
                        harness.run_one(model, mode, nodes, run_root / name)
            finally:
                harness.teardown_network()
    except Interrupted as e:
        warn("received %s: stopped and tore everything down" % e)
        rc = 130
    finally:
        runner.stop_all()
        if harness.net is not None:
            harness.teardown_network()
        if not args.dry_run:
            spaces, links = netns.leftovers(args.prefix)
            if spaces or links:
                warn("teardown left %s; removing" % ", ".join(spaces + links))
                netns.cleanup(args.prefix, runner)
            harness.save()
            failed = [r for r in harness.results["runs"] if r["status"] != "ok"]
            if failed:
                warn("%d run(s) failed: %s" % (len(failed), ", ".join(
                    "%s P=%d %s" % (r["model"], r["nodes"], r["mode"]) for r in failed)))
                rc = rc or 1
            print("results: %s   logs: %s" % (args.out, run_root), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
