"""The emulated cluster benchmark: sparsync's planners and their peers on P namespaces.

For each dilation D in --dilation and each P in --nodes it builds P network namespaces on a
bridge, each link shaped in both directions to the modelled --rate (1 Gb/s) divided by D with
the queue latency times D (netns.py, dilation.py), and for each model profile and mode starts
one sparsyncd and one replay worker per namespace (or one peer worker per namespace: DDP,
DDP+PowerSGD, Horovod; peers.py), the replayed compute times D, runs --warmup then --iters
iterations, and records per-iteration times and the plan's predicted iteration time that node
0's daemon logs, all divided by D (modelled time), with D in every record. With --rounds R each
model's modes run R times, in reverse order every second round (A B C, C B A, A B C, ...):
the machine's state drifts over an invocation (load, caches), and a mode that always ran in the
same place would carry that drift into every comparison. The nodes' own CPU
work (copies, packing, top-k, gRPC) is not dilated: it weighs 1/D of what it weighs on this
machine, as on a node with cores of its own. Everything is torn down afterwards, also on
failure, Ctrl-C, SIGTERM or SIGHUP; `--cleanup` removes what a killed run left behind. Needs
root, except --dry-run, which prints every command (network, daemons, workers with their
environment, teardown) and runs nothing.

Modes (SPARSYNC_* given to the daemons):
  dense      SPARSYNC_COMPRESSOR=none: sparsync's Gloo ring allreduce with the daemon's default
             merge (optimal, the dense lines' costs) or --dense-merge (e.g. fixed:64MiB, Horovod's)
  layerwise  topk, SPARSYNC_MERGE=layerwise (LAGS-SGD: each tensor alone)
  single     topk, SPARSYNC_MERGE=single (TopK-SGD: one group after backward)
  fixed      topk, SPARSYNC_MERGE=fixed:<4 * --fixed-elements> bytes (the authors' 8192
             float32 elements; the daemon merges consecutive tensors up to that many bytes)
  omgs       topk, SPARSYNC_MERGE=omgs (the paper's greedy merge)
  optimal    topk, SPARSYNC_MERGE=optimal (exact over contiguous groupings)
  optimal_always
             optimal with SPARSYNC_COMPRESS=always: every group sparse, where the other sparse
             modes run under the daemon's default `auto` (a group goes dense where that is
             predicted faster); what `auto` is measured against
  ddp, ddp_powersgd, hvd_dense, hvd_fp16, hvd_topk: the peers (peers.py; the Horovod ones need
             bench/peers/setup.sh)
Sparse modes also get SPARSYNC_DENSITY (--density), SPARSYNC_DENSITY_WARMUP_STEPS
(--density-warmup-steps, when given), SPARSYNC_MIN_COMPRESS_BYTES
(--min-compress-bytes, default 0: every group is sparsified, as in the paper) and every
sparsync mode SPARSYNC_PLAN_WARMUP_STEPS (--plan-warmup-steps), and the dilated timers
SPARSYNC_CYCLE_MS (--cycle-ms x D), SPARSYNC_TIMEOUT_S and SPARSYNC_STALL_WARN_S (x D).
Sparsification is the real CPU top-k (the daemon's, torch.topk for hvd_topk) under dilation;
with --select-cost C the daemons' selection of n elements is padded to C x n log2 n modelled
seconds (SPARSYNC_EMULATE_SELECT_COST = C x D), a fitted GPU cost, and hvd_topk's alike.
With --timeline each daemon also writes its timeline into the run's directory;
timeline_steps.py lines up the groups of the last steps from those files.

    .venv/bin/python bench/cluster/harness.py --dry-run --nodes 4 --dilation 10
    .venv/bin/python bench/cluster/harness.py --measure-bandwidth --bandwidth-only --nodes 4
    .venv/bin/python bench/cluster/harness.py --models resnet50_pipedream --nodes 8 \\
        --dilation 10 --modes dense,single,omgs,hvd_dense --iters 5 --out results.json
    .venv/bin/python bench/cluster/harness.py --models alexnet_pipedream --nodes 8 \\
        --dilation 20 --modes optimal --iters 5 --timeline --run-dir RUN --out results.json
    .venv/bin/python bench/cluster/timeline_steps.py RUN/alexnet_pipedream-P8-optimal --dilation 20
    .venv/bin/python bench/cluster/harness.py --cleanup
    .venv/bin/python bench/cluster/report.py results.json --md table.md --png chart.png
"""

import datetime
import json
import os
import secrets
import shlex
import signal
import socket
import sys
import time
from pathlib import Path

import netns
import peers
from dilation import Dilation
from options import MODES, SPARSE_MERGE, SPARSYNC_MODES, parse_args, preflight  # noqa: F401
from procs import Runner, env_argv, wait_all, wait_for_files, warn
from records import parse_plans, summarize  # noqa: F401 (parse_plans: tests use it from here)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
COORDINATOR_PORT, DDP_PORT, HVD_PORT, BANDWIDTH_PORT = 29400, 29500, 30100, 5201
STALL_WARN_S = 60  # the daemon's default SPARSYNC_STALL_WARN_S, modelled
SPARSIFICATION = ("real CPU top-k under dilation (sparsync: the daemon's topk; hvd_topk: "
                  "torch.topk); no GPU cost injected")


def sparsification(args):
    """How the run models sparsification, for the results' meta block."""
    if not getattr(args, "select_cost", 0):
        return SPARSIFICATION
    return ("fitted GPU cost injected: the daemons' top-k of n elements padded to %g x n log2 n "
            "modelled s (SPARSYNC_EMULATE_SELECT_COST, x D); hvd_topk: torch.topk padded to the "
            "same" % args.select_cost)


class Interrupted(Exception):
    pass


def mode_env(mode, args, dilation=Dilation(1)):
    """The SPARSYNC_* settings of a sparsync mode (an empty dict for the peers), with the
    daemon's timers dilated."""
    if mode not in SPARSYNC_MODES:
        return {}
    env = {"SPARSYNC_PLAN_WARMUP_STEPS": str(args.plan_warmup_steps),
           "SPARSYNC_CYCLE_MS": "%g" % min(1000.0, dilation.wall(args.cycle_ms)),
           "SPARSYNC_TIMEOUT_S": str(int(dilation.wall(args.sparsync_timeout_s))),
           "SPARSYNC_STALL_WARN_S": str(int(dilation.wall(STALL_WARN_S)))}
    if mode == "dense":
        env["SPARSYNC_COMPRESSOR"] = "none"
        if args.dense_merge:
            env["SPARSYNC_MERGE"] = args.dense_merge
        return env
    env.update({"SPARSYNC_COMPRESSOR": "topk", "SPARSYNC_DENSITY": str(args.density),
                "SPARSYNC_MIN_COMPRESS_BYTES": str(args.min_compress_bytes)})
    if getattr(args, "select_cost", 0):
        env["SPARSYNC_EMULATE_SELECT_COST"] = "%g" % dilation.wall(args.select_cost)
    if getattr(args, "density_warmup_steps", 0):
        env["SPARSYNC_DENSITY_WARMUP_STEPS"] = str(args.density_warmup_steps)
    if mode == "fixed":
        env["SPARSYNC_MERGE"] = "fixed:%d" % (4 * args.fixed_elements)  # float32 bytes
    else:
        env["SPARSYNC_MERGE"] = SPARSE_MERGE[mode]
    if mode == "optimal_always":
        env["SPARSYNC_COMPRESS"] = "always"
    return env


class Harness:
    def __init__(self, args, runner):
        self.args, self.runner = args, runner
        self.daemon = args.daemon
        self.python = args.python
        self.results = {"meta": self._meta(), "runs": []}
        self.run_index = 0
        self.net = None
        self.dilation = Dilation(1)

    def _meta(self):
        a = self.args
        return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "host": socket.gethostname(), "cpus": os.cpu_count(),
                "command": shlex.join(sys.argv), "daemon": self.daemon,
                "network": {"rate": a.rate, "burst": a.burst, "latency": a.latency,
                            "modelled": True},
                "dilation": a.dilations, "sparsification": sparsification(a),
                "density": a.density, "time_scale": a.time_scale, "forward": not a.no_forward,
                "warmup": a.warmup, "peer_warmup": a.peer_warmup, "iters": a.iters,
                "rounds": a.rounds,
                "plan_warmup_steps": a.plan_warmup_steps,
                "fixed_elements": a.fixed_elements, "cycle_ms": a.cycle_ms,
                "powersgd_rank": a.powersgd_rank, "load_average_start": _load(),
                "bandwidth": {}}

    def save(self):
        if self.args.dry_run:
            return
        tmp = Path(self.args.out + ".tmp")
        tmp.write_text(json.dumps(self.results, indent=1) + "\n")
        tmp.replace(self.args.out)

    # --- network ------------------------------------------------------------------------------

    def setup_network(self, nodes, dilation):
        self.dilation = dilation
        rate, latency = dilation.link(self.args.rate, self.args.latency)
        self.net = netns.Network(nodes, self.args.prefix, rate, self.args.burst, latency)
        self.runner.note("network: %d namespaces on bridge %s, tbf %s latency %s on both ends "
                         "of each link (modelled %s, latency %s, dilation %g)"
                         % (nodes, self.net.bridge, rate, latency, self.args.rate,
                            self.args.latency, dilation.factor))
        for cmd in self.net.setup_commands():
            self.runner.run(cmd)
        for path, text in self.net.hosts_files():
            self.runner.write_file(path, text)

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
        """TCP throughput 0->1, 1->0, then all nodes at once around the ring; Gb/s measured and
        modelled (measured x dilation)."""
        flows = [[(0, 1)], [(1, 0)], [(i, (i + 1) % nodes) for i in range(nodes)]]
        out, seconds = [], self.dilation.wall(self.args.bandwidth_seconds)
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
                "%g" % seconds]), run_dir / ("bw%d-%d-send.log" % (k, src)))
                for src, dst in pairs]
            if self.runner.dry_run:
                continue
            wait_all(senders + recvs, seconds + 30)
            self.runner.stop(senders + recvs)
            for r in recvs:
                try:
                    rec = json.loads(Path(r.log_path).read_text().strip().splitlines()[-1])
                except (ValueError, IndexError):
                    warn("bandwidth probe gave no result: %s" % r.log_tail())
                    continue
                rec["modelled_gbps"] = round(rec["gbps"] * self.dilation.factor, 4)
                out.append(rec)
            for rec in out[-len(pairs):]:
                print("bandwidth %s -> %s (%d flow(s)): %.4f Gb/s, modelled %.3f Gb/s"
                      % (rec["from"], rec["to"], len(pairs), rec["gbps"], rec["modelled_gbps"]),
                      flush=True)
        key = "%d" % nodes if len(self.args.dilations) == 1 else \
            "%d@D%g" % (nodes, self.dilation.factor)
        self.results["meta"]["bandwidth"][key] = out

    # --- one run ------------------------------------------------------------------------------

    def _worker_args(self, model, out_path, warmup):
        a = self.args
        argv = ["--profile", model, "--iters", str(a.iters), "--warmup", str(warmup),
                "--time-scale", "%g" % self.dilation.wall(a.time_scale), "--out", str(out_path)]
        return argv + (["--no-forward"] if a.no_forward else [])

    def _start_sparsync(self, model, mode, nodes, run_dir, env_base, port_offset, daemons,
                        workers):
        net, a = self.net, self.args
        token = secrets.token_hex(16)
        coordinator = "%s:%d" % (net.address(0), COORDINATOR_PORT + port_offset)
        sockets = [run_dir / ("n%d.sock" % i) for i in range(nodes)]
        common = dict(env_base, SPARSYNC_NUM_NODES=str(nodes), SPARSYNC_LOCAL_SIZE="1",
                      SPARSYNC_COORDINATOR=coordinator, SPARSYNC_JOB_TOKEN=token,
                      SPARSYNC_LOG_LEVEL=a.log_level)
        common.update(mode_env(mode, a, self.dilation))
        if a.timeline:
            common["SPARSYNC_TIMELINE"] = str(run_dir / "timeline-{node}.json")
        for i in range(nodes):
            env = dict(common, SPARSYNC_NODE_RANK=str(i), SPARSYNC_LISTEN=net.address(i),
                       SPARSYNC_SOCKET=str(sockets[i]))
            daemons.append(self.runner.start(
                "daemon %d" % i, net.in_ns(i, env_argv(env) + [self.daemon]),
                run_dir / ("d%d.log" % i)))
        self.runner.note("wait until every daemon has created its socket")
        wait_for_files(sockets, daemons, self.dilation.wall(a.start_timeout_s),
                       self.runner.dry_run, "the daemons' sockets")
        for i in range(nodes):
            env = dict(env_base, SPARSYNC_SOCKET=str(sockets[i]), SPARSYNC_JOB_TOKEN=token,
                       SPARSYNC_LOCAL_RANK="0", SPARSYNC_RANK=str(i), SPARSYNC_SIZE=str(nodes),
                       SPARSYNC_TIMEOUT_S=common["SPARSYNC_TIMEOUT_S"])
            argv = net.in_ns(i, env_argv(env) + [self.python, str(HERE / "replay_worker.py")]
                             + self._worker_args(model, run_dir / ("w%d.json" % i), a.warmup))
            workers.append(self.runner.start("worker %d" % i, argv, run_dir / ("w%d.log" % i)))

    def _start_peer(self, model, mode, nodes, run_dir, env_base, port_offset, helpers,
                    workers):
        net, a = self.net, self.args
        if peers.is_horovod(mode):
            port, ready = HVD_PORT + port_offset, run_dir / "rendezvous.ready"
            helpers.append(self.runner.start("rendezvous", net.in_ns(0, env_argv(env_base) + (
                peers.rendezvous_argv(a.peer_python, nodes, port, ready))),
                run_dir / "rendezvous.log"))
            self.runner.note("wait until Horovod's rendezvous server listens")
            wait_for_files([ready], helpers, self.dilation.wall(a.start_timeout_s),
                           self.runner.dry_run, "the rendezvous server")
        for i in range(nodes):
            if peers.is_horovod(mode):
                env = dict(env_base, **peers.horovod_env(net, i, nodes, port, self.dilation,
                                                         a.sparsync_timeout_s))
                cmd = peers.horovod_worker_argv(a.peer_python, mode, a.density,
                                                self.dilation.wall(getattr(a, "select_cost", 0.0)))
            else:
                env = dict(env_base, **peers.ddp_env(net, i, nodes, DDP_PORT + port_offset))
                cmd = peers.ddp_worker_argv(self.python, mode, a.powersgd_rank,
                                            self.dilation.wall(a.sparsync_timeout_s))
            argv = net.in_ns(i, env_argv(env) + cmd + self._worker_args(
                model, run_dir / ("w%d.json" % i), a.peer_warmup))
            workers.append(self.runner.start("worker %d" % i, argv, run_dir / ("w%d.log" % i)))

    def run_one(self, model, mode, nodes, run_dir, rnd=0):
        if not self.runner.dry_run:
            run_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(run_dir, 0o700)  # it holds the sockets: the daemons refuse a shared directory
        self.run_index += 1
        port_offset = self.run_index % 500  # no waiting for a port still in TIME_WAIT
        env_base = {"PYTHONPATH": str(REPO / "shims" / "python"), "PYTHONUNBUFFERED": "1",
                    "OMP_NUM_THREADS": "1"}
        d = self.dilation.factor
        self.runner.note("run: model %s, P=%d, mode %s, dilation %g%s (logs in %s)"
                         % (model, nodes, mode, d,
                            ", round %d" % rnd if self.args.rounds > 1 else "", run_dir))
        helpers, workers = [], []  # daemons or the rendezvous server; the training processes
        record = {"model": model, "nodes": nodes, "mode": mode, "dilation": d, "round": rnd,
                  "link": {"rate": self.net.rate, "latency": self.net.latency},
                  "run_dir": str(run_dir), "env": mode_env(mode, self.args, self.dilation),
                  "status": "failed", "load_average_start": _load()}
        started = time.monotonic()
        try:
            if mode in SPARSYNC_MODES:
                self._start_sparsync(model, mode, nodes, run_dir, env_base, port_offset,
                                     helpers, workers)
            else:
                self._start_peer(model, mode, nodes, run_dir, env_base, port_offset, helpers,
                                 workers)
            self.runner.note("wait for the workers, then SIGTERM the daemons or helpers")
            if self.runner.dry_run:
                self.runner.stop(workers + helpers)
                return
            wait_all(workers, self.dilation.wall(self.args.run_timeout_s), watch=helpers)
            ws = [json.loads((run_dir / ("w%d.json" % i)).read_text()) for i in range(nodes)]
            record.update(summarize(ws, d))
            if peers.is_horovod(mode):
                record["horovod_env"] = ws[0].get("horovod_env", {})
            record["status"] = "ok"
        except Interrupted:
            record["status"] = "interrupted"
            raise
        except Exception as e:
            record["error"] = str(e)
            record["logs"] = {p.label: p.log_tail(1500) for p in helpers + workers}
            warn("run %s P=%d %s D=%g failed: %s" % (model, nodes, mode, d, e))
        finally:
            self.runner.stop(workers + helpers)
            self._finish(record, mode, run_dir, started)

    def _finish(self, record, mode, run_dir, started):
        if self.runner.dry_run:
            return
        if mode in SPARSYNC_MODES and (run_dir / "d0.log").exists():
            plans = parse_plans((run_dir / "d0.log").read_text(errors="replace"))
            record["plans"] = [p["line"] for p in plans][-20:]
            predicted = [p["predicted_ms"] for p in plans if p["predicted_ms"] is not None]
            record["predicted_wall_ms"] = predicted[-1] if predicted else None
            record["predicted_ms"] = (round(self.dilation.modelled(predicted[-1]), 3)
                                      if predicted else None)
        record["wall_s"] = round(time.monotonic() - started, 1)
        record["load_average_end"] = _load()
        self.results["runs"].append(record)
        self.save()
        if record["status"] == "ok":
            print("%-22s P=%d D=%-3g %-14s mean %9.1f ms  median %9.1f ms  predicted %s  "
                  "(%.0f s)%s" % (record["model"], record["nodes"], record["dilation"], mode,
                                  record["mean_ms"], record["median_ms"],
                                  record.get("predicted_ms"), record["wall_s"],
                                  "  round %d" % record["round"] if self.args.rounds > 1
                                  else ""), flush=True)


def _load():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv, __doc__)
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("SPARSYNC_", "HOROVOD_"))}
    if args.cleanup:
        if os.geteuid() != 0 and not args.dry_run:
            warn("--cleanup needs root")
            return 2
        spaces, links = netns.cleanup(args.prefix, Runner(args.dry_run, True, None, base_env))
        print("removed %d namespace(s), %d link(s)" % (len(spaces), len(links)))
        return 0
    if not args.dry_run:
        problem = preflight(args)
        if problem:
            warn(problem)
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
        for factor in args.dilations:
            for nodes in args.node_counts:
                run_all(harness, args, run_root, nodes, Dilation(factor))
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
            harness.results["meta"]["load_average_end"] = _load()
            harness.save()
            failed = [r for r in harness.results["runs"] if r["status"] != "ok"]
            if failed:
                warn("%d run(s) failed: %s" % (len(failed), ", ".join(
                    "%s P=%d %s D=%g" % (r["model"], r["nodes"], r["mode"], r["dilation"])
                    for r in failed)))
                rc = rc or 1
            print("results: %s   logs: %s" % (args.out, run_root), flush=True)
    return rc


def run_all(harness, args, run_root, nodes, dilation):
    """Every model and mode on one network of `nodes` namespaces at one dilation."""
    harness.setup_network(nodes, dilation)
    suffix = "" if len(args.dilations) == 1 else "-D%g" % dilation.factor
    try:
        if args.measure_bandwidth:
            bw_dir = run_root / ("bandwidth-P%d%s" % (nodes, suffix))
            if not args.dry_run:
                bw_dir.mkdir(parents=True, exist_ok=True)
            harness.measure_bandwidth(nodes, bw_dir)
            harness.save()
        if args.bandwidth_only:
            return
        for model in args.model_list:
            for rnd in range(args.rounds):
                order = args.mode_list if rnd % 2 == 0 else args.mode_list[::-1]
                for mode in order:
                    name = "%s-P%d-%s%s" % (Path(model).stem, nodes, mode, suffix)
                    if args.rounds > 1:
                        name += "-r%d" % rnd
                    harness.run_one(model, mode, nodes, run_root / name, rnd)
    finally:
        harness.teardown_network()


if __name__ == "__main__":
    sys.exit(main())
