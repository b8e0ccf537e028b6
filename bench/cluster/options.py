"""harness.py's command line: the modes, the options, and the checks before a real run."""

import argparse
import datetime
import os
import sys

import model_profile
import netns
import peers
from dilation import parse_factors, parse_rate, parse_time
from procs import warn

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPARSYNC_MODES = ["dense", "layerwise", "single", "fixed", "omgs", "optimal", "optimal_always"]
MODES = ["dense", "ddp", "ddp_powersgd", "hvd_dense", "hvd_fp16", "hvd_topk", "layerwise",
         "single", "fixed", "omgs", "optimal", "optimal_always"]
DEFAULT_MODES = ["dense", "ddp", "layerwise", "single", "fixed", "omgs", "optimal"]
SPARSE_MERGE = {"layerwise": "layerwise", "single": "single", "omgs": "omgs",
                "optimal": "optimal", "optimal_always": "optimal"}


def parse_args(argv, description=""):
    """harness.py's options, checked; `description` is harness.py's --help text."""
    p = argparse.ArgumentParser(prog="harness.py", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet20,vgg16,alexnet,resnet50,inception_v4,lstm_ptb",
                   help="profiles in bench/profiles/ (names or paths), comma-separated")
    p.add_argument("--nodes", default="4,8", help="cluster sizes, comma-separated (default 4,8)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help="subset of: %s (default %s)" % (", ".join(MODES),
                                                        ",".join(DEFAULT_MODES)))
    p.add_argument("--dilation", default="1",
                   help="time dilation factors D >= 1, comma-separated: links at rate/D with "
                        "latency x D, replayed compute x D, measured times / D (default 1)")
    p.add_argument("--iters", type=int, default=20, help="measured iterations (default 20)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every model's modes this many times, the order reversed in every "
                        "second round (A B C, C B A, ...), so that no mode always runs first; "
                        "report.py gives the median over rounds and their range (default 1)")
    p.add_argument("--warmup", type=int, default=None,
                   help="unmeasured iterations first (default 3 * --plan-warmup-steps + 2: the "
                        "first plan, then room for the re-plans the measured costs cause)")
    p.add_argument("--peer-warmup", type=int, default=4,
                   help="unmeasured iterations of the peers, which do not plan (default 4)")
    p.add_argument("--plan-warmup-steps", type=int, default=5,
                   help="SPARSYNC_PLAN_WARMUP_STEPS for the daemons (default 5)")
    p.add_argument("--density", type=float, default=0.001,
                   help="SPARSYNC_DENSITY of topk, and hvd_topk's density")
    p.add_argument("--density-warmup-steps", type=int, default=0,
                   help="SPARSYNC_DENSITY_WARMUP_STEPS of the sparse modes (default 0: none); "
                        "each run's iteration_ms then spans the warm-up's densities, step = "
                        "--warmup + index")
    p.add_argument("--fixed-elements", type=int, default=8192,
                   help="mode fixed: merge threshold in float32 elements (default 8192)")
    p.add_argument("--min-compress-bytes", default="0",
                   help="SPARSYNC_MIN_COMPRESS_BYTES of the sparse modes (default 0)")
    p.add_argument("--dense-merge", default="",
                   help="SPARSYNC_MERGE of mode dense (default: the daemon's default)")
    p.add_argument("--cycle-ms", type=float, default=1.0,
                   help="the daemons' batching window in modelled ms (SPARSYNC_CYCLE_MS = "
                        "this x D; default 1, the daemon's default)")
    p.add_argument("--select-cost", type=float, default=0.0,
                   help="model a GPU's selection: the daemons' top-k of a group of n elements "
                        "lasts at least this x n log2 n modelled seconds "
                        "(SPARSYNC_EMULATE_SELECT_COST = this x D; OMGS-SGD's fit of a GPU "
                        "top-k is 2.19e-10). Default 0: the real CPU top-k under dilation. "
                        "hvd_topk's torch.topk is padded to the same (before 2026-12-07 it "
                        "was not)")
    p.add_argument("--powersgd-rank", type=int, default=4,
                   help="mode ddp_powersgd: PowerSGD's matrix approximation rank (default 4)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiplies the profiles' forward and backward times (default 1)")
    p.add_argument("--no-forward", action="store_true", help="workers skip the forward wait")
    p.add_argument("--rate", default="1gbit",
                   help="modelled tbf rate of every link (default 1gbit; shaped to rate / D)")
    p.add_argument("--burst", default="128kb", help="tbf burst (default 128kb)")
    p.add_argument("--latency", default="10ms",
                   help="modelled tbf latency, i.e. queue (default 10ms; shaped to x D)")
    p.add_argument("--measure-bandwidth", action="store_true",
                   help="measure TCP throughput across the shaped links first")
    p.add_argument("--bandwidth-only", action="store_true",
                   help="with --measure-bandwidth: set up, measure, tear down, nothing else")
    p.add_argument("--bandwidth-seconds", type=float, default=3.0,
                   help="modelled seconds of each probe (default 3)")
    p.add_argument("--out", default="results.json", help="results file (default results.json)")
    p.add_argument("--run-dir", default="",
                   help="logs and sockets (default /tmp/spsc-<date-time>; keep it short)")
    p.add_argument("--daemon", default="", help="sparsyncd (default: build/daemon/sparsyncd)")
    p.add_argument("--python", default=sys.executable,
                   help="Python of the sparsync and DDP workers")
    p.add_argument("--peer-python", default=os.path.join(REPO, "bench", "peers", ".venv", "bin",
                                                             "python"),
                   help="Python with Horovod for the hvd_* modes (bench/peers/setup.sh)")
    p.add_argument("--prefix", default=netns.DEFAULT_PREFIX,
                   help="name prefix of namespaces and links (default spsc)")
    p.add_argument("--log-level", default="info", help="SPARSYNC_LOG_LEVEL (default info)")
    p.add_argument("--timeline", action="store_true",
                   help="each daemon writes its timeline (SPARSYNC_TIMELINE) to "
                        "RUN_DIR/timeline-<node>.json")
    p.add_argument("--sparsync-timeout-s", type=int, default=120,
                   help="modelled time-out of daemons and workers, Gloo's of the peers "
                        "(default 120; x D)")
    p.add_argument("--start-timeout-s", type=float, default=60.0,
                   help="modelled seconds for daemons to start (default 60; x D)")
    p.add_argument("--run-timeout-s", type=float, default=1800.0,
                   help="give up on one run after this long, modelled (default 1800; x D)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--cleanup", action="store_true",
                   help="remove namespaces, links and processes left by a killed run, and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="print commands as they run")
    args = p.parse_args(argv)
    args.node_counts = [int(n) for n in args.nodes.split(",") if n]
    args.mode_list = [m for m in args.modes.split(",") if m]
    args.model_list = [m for m in args.models.split(",") if m]
    try:
        args.dilations = parse_factors(args.dilation)
        parse_rate(args.rate)
        parse_time(args.latency)
    except ValueError as e:
        p.error(str(e))
    bad = [m for m in args.mode_list if m not in MODES]
    if bad:
        p.error("unknown modes %s; known: %s" % (bad, ", ".join(MODES)))
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if any(n < 2 for n in args.node_counts):
        p.error("--nodes: every cluster needs at least 2 nodes")
    if args.warmup is None:
        args.warmup = 3 * args.plan_warmup_steps + 2
    elif args.warmup < args.plan_warmup_steps + 2 and set(args.mode_list) & set(SPARSE_MERGE):
        warn("--warmup %d < --plan-warmup-steps + 2: the planners' plans may not be in force "
             "in the measured iterations" % args.warmup)
    if args.peer_warmup < 2:
        p.error("--peer-warmup must be at least 2 (ddp_powersgd compresses from then on)")
    if not args.daemon:
        args.daemon = os.path.join(REPO, "build", "daemon", "sparsyncd")
    if not args.run_dir:
        args.run_dir = "/tmp/spsc-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return args


def preflight(args):
    """Why a real run cannot start (root, binaries, profiles), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc); --dry-run shows what it would do"
    if set(args.mode_list) & set(SPARSYNC_MODES) and not os.access(args.daemon, os.X_OK):
        return "sparsyncd not found at %s (build it, or --daemon PATH)" % args.daemon
    if any(peers.is_horovod(m) for m in args.mode_list) and not os.access(args.peer_python,
                                                                          os.X_OK):
        return ("no Python with Horovod at %s: run bench/peers/setup.sh, or --peer-python PATH"
                % args.peer_python)
    for m in [] if args.bandwidth_only else args.model_list:
        try:
            model_profile.load(m)  # fail before building anything
        except ValueError as e:
            return str(e)
    return None
