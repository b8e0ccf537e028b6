"""The emulated-cluster benchmark (bench/cluster/, bench/profiles/).

The real run needs root and hours (it is a benchmark); here: the harness's --dry-run commands
for P = 4 and 8 (addresses, shaping on both ends of every link, every mode, teardown) and with
dilation (links at rate/D, latency x D, compute x D, dilated timers, the peers' commands), the
committed model profiles (CPU-measured, PipeDream-folded, FLOP-scaled), the dilation
arithmetic, the replay worker against real daemons on loopback, the DDP and DDP+PowerSGD
workers on loopback, report.py's tables on synthetic results, and, as root, one tiny dilated
run of the harness itself (P = 2, a few seconds).
"""

import importlib.util
import ipaddress
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "bench" / "cluster"
sys.path.insert(0, str(CLUSTER))

import dilation  # noqa: E402
import harness  # noqa: E402
import records  # noqa: E402
import report  # noqa: E402

MODES = ["dense", "ddp", "layerwise", "single", "fixed", "omgs", "optimal"]  # the default
TINY = {"model": "tiny", "forward_s": 0.002, "tensors": [
    {"name": "fc2.bias", "shape": [10], "numel": 10, "backward_s": 0.002},
    {"name": "fc2.weight", "shape": [10, 3000], "numel": 30000, "backward_s": 0.003},
    {"name": "fc1.bias", "shape": [3000], "numel": 3000, "backward_s": 0.0},
    {"name": "fc1.weight", "shape": [3000, 60], "numel": 180000, "backward_s": 0.004}]}
TINY_BACKWARD_S = 0.009


def dry_run(*args):
    r = subprocess.run([sys.executable, str(CLUSTER / "harness.py"), "--dry-run"] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("nodes", [4, 8])
def test_dry_run_prints_a_shaped_cluster_every_mode_and_the_teardown(nodes):
    lines = dry_run("--nodes", str(nodes), "--models", "resnet20,vgg16")
    commands = [shlex.split(line.split(" > ")[0]) for line in lines if not line.startswith("#")]
    text = "\n".join(line for line in lines if not line.startswith("# write "))

    # Every address a command uses is in the benchmarking range 198.18.0.0/15 (the files the
    # harness writes, each namespace's /etc/hosts, also name localhost).
    addresses = re.findall(r"\b\d+\.\d+\.\d+\.\d+\b", text)
    assert addresses
    bench = ipaddress.ip_network("198.18.0.0/15")
    assert all(ipaddress.ip_address(a) in bench for a in addresses), sorted(set(addresses))

    def has(cmd):
        return cmd in commands

    assert has(["ip", "link", "add", "spsc-br", "type", "bridge"])
    for i in range(nodes):
        ns, v, h = "spsc-n%d" % i, "spsc-v%d" % i, "spsc-h%d" % i
        assert has(["ip", "netns", "add", ns])
        assert has(["ip", "link", "add", h, "type", "veth", "peer", "name", v, "netns", ns])
        assert has(["ip", "link", "set", h, "master", "spsc-br"])
        assert has(["ip", "-n", ns, "addr", "add", "198.18.0.%d/24" % (i + 1), "dev", v])
        # tbf 1 Gb/s at the egress of both ends of the link: what node i sends and receives.
        tbf = ["root", "tbf", "rate", "1gbit"]
        assert any(c[:5] == ["tc", "qdisc", "add", "dev", h] and c[5:9] == tbf
                   for c in commands), "no tbf on the bridge side of node %d" % i
        assert any(c[:9] == ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", v]
                   and c[9:13] == tbf for c in commands), "no tbf in namespace %s" % ns
        # Teardown of both qdiscs, the veth pair and the namespace.
        assert has(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", v, "root"])
        assert has(["tc", "qdisc", "del", "dev", h, "root"])
        assert has(["ip", "link", "del", h])
        assert has(["ip", "netns", "del", ns])
    assert commands[-1] == ["ip", "link", "del", "spsc-br"]
    # Inside each namespace this machine's name resolves to the node's address (Horovod binds
    # its process-set contexts to it), and teardown removes the file again.
    for i in range(nodes):
        write = [line for line in lines if line.startswith("# write /etc/netns/spsc-n%d/hosts" % i)]
        assert len(write) == 1 and "198.18.0.%d %s" % (i + 1, socket.gethostname()) in write[0]
        assert has(["rm", "-rf", "/etc/netns/spsc-n%d" % i])
    last_run = max(k for k, line in enumerate(lines) if "replay_worker.py" in line
                   or "ddp_worker.py" in line)
    teardown = lines.index("# teardown: processes, qdiscs, veths, namespaces, bridge")
    assert teardown > last_run

    runs = [line for line in lines if line.startswith("# run: ")]
    for model in ("resnet20", "vgg16"):
        for mode in MODES:
            assert "# run: model %s, P=%d, mode %s" % (model, nodes, mode) in " ".join(runs), \
                (model, mode)
    assert len(runs) == 2 * len(MODES)

    daemons = [c for c in commands if c and c[-1].endswith("sparsyncd")]
    assert len(daemons) == 2 * (len(MODES) - 1) * nodes  # every sparsync mode, every node
    for c in daemons:
        env = dict(kv.split("=", 1) for kv in c[c.index("env") + 1:-1])
        i = int(env["SPARSYNC_NODE_RANK"])
        assert c[:4] == ["ip", "netns", "exec", "spsc-n%d" % i]
        assert env["SPARSYNC_LISTEN"] == "198.18.0.%d" % (i + 1)
        assert env["SPARSYNC_COORDINATOR"].startswith("198.18.0.1:")
        assert env["SPARSYNC_NUM_NODES"] == str(nodes)
        assert env["SPARSYNC_SOCKET"].endswith("n%d.sock" % i)
    merges = {dict(kv.split("=", 1) for kv in c[c.index("env") + 1:-1]).get("SPARSYNC_MERGE")
              for c in daemons}
    assert {"layerwise", "single", "fixed:32768", "omgs", "optimal"} <= merges
    assert "SPARSYNC_COMPRESSOR=none" in text and "SPARSYNC_DENSITY=0.001" in text
    ddp = [line for line in lines if "ddp_worker.py" in line]
    assert len(ddp) == 2 * nodes and all("GLOO_SOCKET_IFNAME=spsc-v" in line for line in ddp)
    workers = [line for line in lines if "replay_worker.py" in line]
    assert len(workers) == 2 * (len(MODES) - 1) * nodes
    assert all("--warmup 17" in line for line in workers)  # 3 * plan warm-up 5 + 2


def _env_of(command):
    """The K=V settings of an `ip netns exec NS env K=V ... program` command line."""
    argv = shlex.split(command.split(" > ")[0])
    start = argv.index("env") + 1
    out = {}
    for kv in argv[start:]:
        if "=" not in kv:
            break
        k, v = kv.split("=", 1)
        out[k] = v
    return out


def test_dry_run_with_dilation_stretches_links_compute_and_timers_and_runs_the_peers():
    modes = "dense,omgs,ddp,ddp_powersgd,hvd_dense,hvd_fp16,hvd_topk"
    lines = dry_run("--nodes", "2", "--models", "resnet20_flops", "--modes", modes,
                    "--dilation", "20", "--rate", "1gbit", "--latency", "10ms",
                    "--plan-warmup-steps", "3", "--iters", "4")
    commands = [shlex.split(line.split(" > ")[0]) for line in lines if not line.startswith("#")]
    tbf = [c for c in commands if "tbf" in c]
    assert len(tbf) == 4  # both ends of both links
    for c in tbf:  # 1 Gb/s / 20 with its 10 ms queue x 20: the same bytes in flight
        i = c.index("tbf")
        assert c[i + 1:i + 7] == ["rate", "50000kbit", "burst", "128kb", "latency", "200000us"]
    workers = [line for line in lines if "_worker.py" in line]
    assert len(workers) == 2 * 7 and all("--time-scale 20" in w for w in workers)
    sparsync = [w for w in workers if "replay_worker.py" in w]
    peers = [w for w in workers if "replay_worker.py" not in w]
    assert all("--warmup 11" in w for w in sparsync) and all("--warmup 4" in w for w in peers)
    daemons = [line for line in lines if line.split(" > ")[0].endswith("sparsyncd")]
    assert len(daemons) == 4
    for d in daemons:  # the daemon's timers keep their modelled values
        env = _env_of(d)
        assert env["SPARSYNC_CYCLE_MS"] == "20" and env["SPARSYNC_TIMEOUT_S"] == "2400"
        assert env["SPARSYNC_STALL_WARN_S"] == "1200"
    powersgd = [w for w in workers if "ddp_worker.py" in w and "--powersgd-rank 4" in w]
    assert len(powersgd) == 2
    for mode, flag in (("hvd_dense", "--mode dense"), ("hvd_fp16", "--mode fp16"),
                       ("hvd_topk", "--mode topk")):
        run = lines.index(next(line for line in lines if line.startswith(
            "# run: model resnet20_flops, P=2, mode %s," % mode)))
        block = lines[run:run + 6]
        assert "hvd_rendezvous.py --hosts n0:1,n1:1" in block[1] and "spsc-n0" in block[1]
        hvd = [line for line in block if "horovod_worker.py" in line]
        assert len(hvd) == 2 and all(flag in line for line in hvd)
        for i, line in enumerate(hvd):
            env = _env_of(line)
            assert env["HOROVOD_RANK"] == str(i) and env["HOROVOD_SIZE"] == "2"
            assert env["HOROVOD_GLOO_IFACE"] == "spsc-v%d" % i
            assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "198.18.0.1"
            assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
            assert env["HOROVOD_CYCLE_TIME"] == "20"  # Horovod's 1 ms default, dilated
            assert "HOROVOD_FUSION_THRESHOLD" not in env  # its fusion default


def test_density_warmup_reaches_the_sparse_daemons_and_prices_each_density(tmp_path):
    lines = dry_run("--nodes", "2", "--models", "resnet20_flops", "--modes", "dense,optimal",
                    "--density-warmup-steps", "8", "--warmup", "2", "--iters", "10")
    daemons = [_env_of(line) for line in lines if line.split(" > ")[0].endswith("sparsyncd")]
    assert len(daemons) == 4
    assert [d.get("SPARSYNC_DENSITY_WARMUP_STEPS") for d in daemons] == [None, None, "8", "8"]

    sys.path.insert(0, str(REPO / "bench" / "fidelity"))
    import time_to_accuracy
    # Steps 2..11 measured: 2 3 | 4 5 | 6 7 | 8 9 10 11 in stages 1, 2, 3 and after (stage 0:
    # steps 0 and 1, unmeasured here, so the run cannot price it).
    results = {"meta": {"warmup": 2}, "runs": [{
        "model": "m.json", "nodes": 2, "mode": "optimal", "status": "ok",
        "env": {"SPARSYNC_DENSITY_WARMUP_STEPS": "8"},
        "iteration_ms": [9, 9, 5, 7, 3, 3, 1, 1, 2, 1]}]}
    path = tmp_path / "times.json"
    path.write_text(json.dumps(results))
    with pytest.raises(SystemExit):
        time_to_accuracy.load_warmup_stages(str(path), "m", 2)
    results["meta"]["warmup"] = 0
    results["runs"][0]["iteration_ms"] = [40, 40, 20, 20, 10, 10, 5, 5, 1, 1, 1, 3]
    path.write_text(json.dumps(results))
    stages = time_to_accuracy.load_warmup_stages(str(path), "m", 2)
    assert stages["optimal"][0] == [40, 20, 10, 5, 1]
    # 100 steps of a 40-step warm-up: 10 steps at each density, 60 after.
    assert time_to_accuracy.warmup_seconds(100, 40, [40, 20, 10, 5, 1]) == pytest.approx(
        (10 * (40 + 20 + 10 + 5) + 60 * 1) / 1000.0)
    assert time_to_accuracy.warmup_seconds(15, 40, [40, 20, 10, 5, 1]) == pytest.approx(
        (10 * 40 + 5 * 20) / 1000.0)


def test_select_cost_pads_the_sparse_daemons_selection_in_wall_time():
    lines = dry_run("--nodes", "2", "--models", "resnet20_flops", "--modes", "dense,optimal",
                    "--dilation", "20", "--select-cost", "2.19e-10")
    daemons = [_env_of(line) for line in lines if line.split(" > ")[0].endswith("sparsyncd")]
    assert len(daemons) == 4
    assert [d.get("SPARSYNC_EMULATE_SELECT_COST") for d in daemons] == [
        None, None, "4.38e-09", "4.38e-09"]  # x D; the dense daemons select nothing
    plain = dry_run("--nodes", "2", "--models", "resnet20_flops", "--modes", "optimal,hvd_topk")
    assert not any("SPARSYNC_EMULATE_SELECT_COST" in line for line in plain)
    assert not any("--select-cost" in line for line in plain if "horovod_worker.py" in line)


def test_select_cost_pads_the_horovod_topk_baseline_alike():
    # TopK-SGD over Horovod is sparsync's `single` by other means: both pay the same selection.
    lines = dry_run("--nodes", "2", "--models", "resnet20_flops",
                    "--modes", "hvd_dense,hvd_topk", "--dilation", "20",
                    "--select-cost", "2.19e-10")
    hvd = [line for line in lines if "horovod_worker.py" in line]
    assert len(hvd) == 4
    assert ["--select-cost 4.38e-09" in line for line in hvd] == [False, False, True, True]


def test_horovod_topk_selection_lasts_the_padded_time():
    sys.path.insert(0, str(REPO / "bench" / "cluster"))
    import horovod_worker
    import torch

    class OneRank:
        def allgather(self, tensor, name):
            return tensor

        def size(self):
            return 1

    param = torch.nn.Parameter(torch.zeros(4096))
    for cost, at_least in ((0.0, 0.0), (1e-6, 1e-6 * 4096 * 12)):  # log2 4096 = 12
        topk = horovod_worker.TopK(OneRank(), [param], 0.01, cost)
        topk.flat.copy_(torch.arange(4096, dtype=torch.float32))
        topk.reduce()
        assert topk.select_s >= at_least
        # The 40 largest were sent (and averaged over the one rank), the rest kept back.
        assert torch.equal(param.grad[-40:], torch.arange(4056, 4096, dtype=torch.float32))
        assert float(param.grad[:-40].abs().sum()) == 0.0
        assert float(topk.residual[-40:].abs().sum()) == 0.0


def test_optimal_always_is_optimal_with_every_group_sparse(tmp_path):
    lines = dry_run("--nodes", "2", "--models", "resnet20_flops",
                    "--modes", "dense,optimal,optimal_always")
    daemons = [_env_of(line) for line in lines if line.split(" > ")[0].endswith("sparsyncd")]
    assert len(daemons) == 6
    assert [d.get("SPARSYNC_MERGE") for d in daemons[2:]] == ["optimal"] * 4
    assert [d.get("SPARSYNC_COMPRESS") for d in daemons] == [None] * 4 + ["always"] * 2

    doc = _synthetic_results()
    doc["runs"] = [r for r in doc["runs"] if r["mode"] in ("dense", "omgs")]
    for mode, med in (("optimal", 310.0), ("optimal_always", 300.0)):
        doc["runs"].append(dict(doc["runs"][-1], mode=mode, median_ms=med))
    text = report.render(doc)
    assert "| vgg16 | 8 | 10 | 310.0 | 300.0 | 1.03 | 2000.0 | 0.15 |" in text, text
    doc["runs"] = doc["runs"][:-1]  # without optimal_always, no such table
    assert "Compress only where it pays" not in report.render(doc)


def test_dry_run_sweeps_dilations_one_network_each():
    lines = dry_run("--nodes", "2", "--models", "resnet20_flops", "--modes", "single",
                    "--dilation", "1,3,10")
    nets = [line for line in lines if line.startswith("# network: ")]
    assert len(nets) == 3
    assert "tbf 1gbit latency 10ms" in nets[0] and "dilation 1)" in nets[0]
    assert "tbf 333333333bit latency 30000us" in nets[1]
    assert "tbf 100000kbit latency 100000us" in nets[2]
    runs = [line for line in lines if line.startswith("# run: ")]
    assert [r.split("dilation ")[1].split(" ")[0] for r in runs] == ["1", "3", "10"]
    assert all("-D" in r for r in runs)  # each dilation's logs apart


def test_rounds_alternate_the_order_and_the_report_merges_them():
    lines = dry_run("--nodes", "2", "--models", "resnet20_flops", "--modes",
                    "dense,single,optimal", "--rounds", "3")
    runs = [re.search(r"mode (\w+), dilation 1, round (\d)", line).groups()
            for line in lines if line.startswith("# run: ")]
    assert runs == [("dense", "0"), ("single", "0"), ("optimal", "0"),
                    ("optimal", "1"), ("single", "1"), ("dense", "1"),
                    ("dense", "2"), ("single", "2"), ("optimal", "2")]
    logs = [line.split("(logs in ")[1] for line in lines if line.startswith("# run: ")]
    assert len(set(logs)) == 9 and logs[3].endswith("-optimal-r1)")
    r = subprocess.run([sys.executable, str(CLUSTER / "harness.py"), "--dry-run",
                        "--rounds", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--rounds must be at least 1" in r.stderr

    doc = _synthetic_results()
    base = {r["mode"]: r for r in doc["runs"]}
    doc["runs"] = []
    # omgs: 330 when run first in a round, 310 when second; the dense median over 3 rounds.
    for rnd, (dense, omgs) in enumerate(((2000.0, 330.0), (2100.0, 310.0), (1900.0, 330.0))):
        for mode, med in (("dense", dense), ("omgs", omgs)):
            doc["runs"].append(dict(base[mode], mode=mode, median_ms=med, round=rnd,
                                    backward_comm_median_ms=med * 0.8))
    doc["runs"].append(dict(base["optimal"], round=0))               # failed, then ok
    doc["runs"].append(dict(base["omgs"], mode="optimal", median_ms=300.0, round=1))
    text = report.render(doc)
    rows = {r[3]: r for r in ([c.strip() for c in line.split("|")[1:-1]]
                              for line in text.splitlines() if line.startswith("| vgg16 "))
            if len(r) == 11}
    assert rows["dense"][5] == "2000.0 (1900.0-2100.0, 3 rounds)"
    assert rows["omgs"][5] == "330.0 (310.0-330.0, 3 rounds)"
    assert rows["omgs"][9] == "6.06x"                 # dense 2000 / omgs 330, medians of rounds
    assert rows["optimal"][5] == "300.0 (1 failed)"
    assert "| vgg16 | 8 | 10 | omgs | 330.0 | 310.0 | 1.06 |" in text, text
    # counted per run: dense 1680 / 1900, omgs 264 / 300 (twice), optimal 256 / 300
    assert "within 15 % of predicted: 4 of 7 sparsync runs" in text


def test_dilation_arithmetic_and_rejected_input():
    d = dilation.Dilation(20)
    assert d.link("1gbit", "10ms") == ("50000kbit", "200000us")
    assert d.link("25gbit", "2ms") == ("1250000kbit", "40000us")
    assert d.wall(1.5) == 30.0 and d.modelled(30.0) == 1.5
    assert dilation.parse_rate("100mbit") == 1e8 and dilation.parse_time("500us") == 5e-4
    assert dilation.parse_factors("1, 3,10") == [1.0, 3.0, 10.0]
    for bad in ("0.5", "x", ""):
        with pytest.raises(ValueError):
            dilation.parse_factors(bad)
    with pytest.raises(ValueError):
        dilation.parse_rate("100mbps")  # tc's bytes per second: refused, not misread
    r = subprocess.run([sys.executable, str(CLUSTER / "harness.py"), "--dry-run",
                        "--dilation", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    assert r.returncode == 2 and "dilation must be >= 1" in r.stderr


def test_summaries_are_in_modelled_time():
    w = {"iter_s": [2.0, 3.0, 2.5], "backward_comm_s": [1.0, 1.5, 1.2],
         "post_lag_s": [0.01, 0.02, 0.0], "replayed_forward_s": 0.5, "replayed_backward_s": 1.0}
    s = records.summarize([w, dict(w, iter_s=[2.2, 2.8, 2.4])], dilation=10)
    assert s["iteration_ms"] == [220.0, 300.0, 250.0]  # slowest rank, / 10
    assert s["median_ms"] == 250.0 and s["wall_median_ms"] == 2500.0
    assert s["backward_comm_median_ms"] == 120.0 and s["replayed_backward_ms"] == 100.0


def test_dry_run_measures_the_bandwidth_between_namespaces():
    lines = dry_run("--nodes", "4", "--measure-bandwidth", "--bandwidth-only")
    assert any("bandwidth.py recv --bind 198.18.0.2" in line and "spsc-n1" in line
               for line in lines)
    assert any("bandwidth.py send --to 198.18.0.2:" in line and "spsc-n0" in line
               for line in lines)
    assert not any("sparsyncd" in line for line in lines)


def _tiny_profile(tmp):
    path = Path(tmp) / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


@pytest.mark.parametrize("compressor", ["none", "topk"])
def test_replay_worker_runs_against_real_daemons(job_factory, short_tmp, compressor):
    job = job_factory(2, 1, {"SPARSYNC_COMPRESSOR": compressor, "SPARSYNC_DENSITY": "0.01",
                             "SPARSYNC_MIN_COMPRESS_BYTES": "0"})
    profile = _tiny_profile(short_tmp)
    out = job.outdir / "w{rank}.json"
    rcs = job.run_workers(str(CLUSTER / "replay_worker.py"),
                          ["--profile", str(profile), "--warmup", "2", "--iters", "4",
                           "--out", str(out)], timeout_s=90)
    assert rcs == [0, 0], job.logs()
    results = [json.loads((job.outdir / ("w%d.json" % r)).read_text()) for r in range(2)]
    for r, res in enumerate(results):
        assert res["rank"] == r and res["size"] == 2 and res["num_tensors"] == 4
        assert len(res["iter_s"]) == 4 and len(res["warmup_iter_s"]) == 2
        # An iteration cannot be shorter than the replayed forward and backward.
        assert min(res["iter_s"]) >= TINY_BACKWARD_S + 0.002
        assert min(res["backward_comm_s"]) >= TINY_BACKWARD_S
        assert all(t < 5.0 for t in res["iter_s"]), res["iter_s"]
    summary = harness.summarize(results)
    assert summary["median_ms"] >= 11.0 and len(summary["iteration_ms"]) == 4
    job.assert_clean_after_stop(job.stop())


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("powersgd_rank", [0, 4])
def test_ddp_worker_runs_on_loopback(short_tmp, powersgd_rank):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    profile = _tiny_profile(short_tmp)
    port = _free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE="2", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, str(CLUSTER / "ddp_worker.py"), "--profile", str(profile),
             "--warmup", "2", "--iters", "3", "--timeout-s", "60",
             "--powersgd-rank", str(powersgd_rank), "--out", str(short_tmp / "ddp{rank}.json")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 300  # a loaded machine takes long to import torch
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("ddp_worker did not finish within 300 s")
    assert [p.returncode for p in procs] == [0, 0], b"\n".join(outs).decode(errors="replace")
    for r in range(2):
        res = json.loads((short_tmp / ("ddp%d.json" % r)).read_text())
        assert res["worker"] == ("ddp_powersgd" if powersgd_rank else "ddp")
        assert res["rank"] == r and len(res["iter_s"]) == 3
        assert res["powersgd_rank"] == powersgd_rank
        assert min(res["backward_comm_s"]) >= TINY_BACKWARD_S


def test_daemon_plan_lines_are_parsed_leniently():
    log = ("[info] starting\n"
           "[node 0] [info] plan v1 (step 5): groups [0-3] [4-9] [10-52], predicted 41.25 ms\n"
           "[node 0] [info] plan v2 takes effect at step 40; predicted 39.5ms\n")
    plans = harness.parse_plans(log)
    assert [p["predicted_ms"] for p in plans] == [41.25, 39.5]


def _synthetic_results():
    def run(model, nodes, mode, median, predicted=None, status="ok", d=10.0):
        r = {"model": model, "nodes": nodes, "mode": mode, "status": status, "dilation": d,
             "link": {"rate": "100000kbit", "latency": "100000us"}}
        if status == "ok":
            r.update({"mean_ms": median * 1.02, "median_ms": median, "predicted_ms": predicted,
                      "backward_comm_median_ms": median * 0.8, "iteration_ms": [median] * 3})
        return r
    return {"meta": {"date": "2026-01-01T00:00:00+00:00", "command": "harness.py --nodes 8",
                     "network": {"rate": "1gbit", "burst": "128kb", "latency": "10ms"},
                     "dilation": [10.0], "sparsification": "real CPU top-k under dilation",
                     "density": 0.001, "time_scale": 1.0, "warmup": 7, "peer_warmup": 4,
                     "iters": 20, "load_average_start": [1.5, 1.2, 1.0],
                     "load_average_end": [2.5, 1.4, 1.1],
                     "bandwidth": {"8": [{"from": "198.18.0.1", "to": "198.18.0.2",
                                          "gbps": 0.095, "modelled_gbps": 0.95}]}},
            "runs": [run("vgg16", 8, "dense", 2000.0, 1900.0), run("vgg16", 8, "ddp", 1500.0),
                     run("vgg16", 8, "ddp_powersgd", 480.0),
                     run("vgg16", 8, "hvd_dense", 1950.0), run("vgg16", 8, "hvd_topk", 600.0),
                     run("vgg16", 8, "layerwise", 400.0, 380.0),
                     run("vgg16", 8, "single", 500.0, 520.0),
                     run("vgg16", 8, "omgs", 320.0, 300.0),
                     run("vgg16", 8, "optimal", 0, status="failed")]}


def test_report_bounds_merging_by_the_cost_models_own_optimum():
    line = ("[2026-12-07 01:48:20.020] [node 0] [info] planner: plan v2 (optimal) from step 9: "
            "5 groups: [0..3] [4..12], predicted {opt} ms (t_s = 0 ms + 75.4 ns/element, "
            "t_c = 18.8 ms + 8.17 ns/element; backward 84.34 ms; predicted: optimal {opt} ms "
            "omgs 1250.00 ms layerwise {lw} ms single 1500.00 ms); measured costs moved ...")
    doc = _synthetic_results()
    for r in doc["runs"]:
        r["replayed_forward_ms"] = 20.0
    by = {r["mode"]: r for r in doc["runs"]}
    # D = 10: forward 20 + layerwise 1400/10 against 20 + optimal 1000/10; the last plan counts.
    by["omgs"]["plans"] = [line.format(opt="900.00", lw="1800.00"),
                           line.format(opt="1000.00", lw="1400.00")]
    by["layerwise"]["plans"] = [line.format(opt="1000.00", lw="1200.00")]
    by["dense"]["plans"] = [line.format(opt="1.00", lw="9.00")]  # not a sparse mode
    assert report.plan_predictions(by["omgs"]["plans"][0])["layerwise"] == 1800.0
    assert report.plan_predictions("planner: plan v1 (single) from step 4: 1 group") == {}
    assert report.merge_ceiling(by["omgs"]) == pytest.approx(160.0 / 120.0)
    assert report.merge_ceiling(by["single"]) is None
    text = report.render(doc)
    assert "| vgg16 | 8 | 10 | 2 | 1.17-1.33x | 1.25x | - |" in text, text


def test_report_writes_the_tables_and_the_chart(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_synthetic_results()))
    md, png = tmp_path / "table.md", tmp_path / "chart.png"
    args = [str(path), "--md", str(md)]
    if importlib.util.find_spec("matplotlib") is not None:
        args += ["--png", str(png)]
    else:
        png = None
    assert report.main(args) == 0
    text = md.read_text()
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
            if line.startswith("| vgg16 ")]
    runs = {r[3]: r for r in rows if len(r) == 11}
    assert list(runs) == ["dense", "ddp", "ddp_powersgd", "hvd_dense", "hvd_topk", "layerwise",
                          "single", "omgs", "optimal"]
    assert runs["omgs"][2] == "10"         # D
    assert runs["omgs"][5] == "320.0" and runs["omgs"][7] == "300.0"
    assert runs["omgs"][8] == "0.85"       # backward+comm 256 / predicted 300
    assert runs["omgs"][9] == "6.25x"      # dense 2000 / 320
    assert runs["omgs"][10] == "1.25x"     # best(layerwise 400, single 500) / 320
    assert runs["ddp"][10] == "-"
    assert runs["optimal"][4] == "failed"
    cmp_rows = [r for r in rows if len(r) == 10]
    assert len(cmp_rows) == 1
    c = cmp_rows[0]
    assert c[3] == "1.25x" and c[4] == "-"   # omgs, optimal (failed) vs best baseline
    assert c[5] == "4.00x"                   # dense 2000 / slowest sparse 500
    assert c[6] == "1.03"                    # sparsync dense / hvd_dense = 2000 / 1950
    assert c[7] == "0.83"                    # single / hvd_topk = 500 / 600
    assert c[8] == "1.50x"                   # ddp_powersgd 480 / omgs 320
    assert "198.18.0.1->198.18.0.2 0.950" in text    # modelled throughput
    assert "[1.5, 1.2, 1.0] at the start" in text and "[2.5, 1.4, 1.1] at the end" in text
    assert "dilation D = 10" in text and "real CPU top-k under dilation" in text
    assert "D=10: rate 100000kbit, latency 100000us" in text
    # backward+comm / predicted: dense 0.842, layerwise 0.842, single 0.769, omgs 0.853
    assert "within 15 % of predicted: 1 of 4 sparsync runs" in text
    if png is not None:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_several_invocations_names_each_and_compares_across_them(tmp_path):
    whole = _synthetic_results()
    dense_modes = {"dense", "ddp", "hvd_dense"}
    paths = []
    for name, dense in (("sparse", False), ("dense", True)):
        doc = json.loads(json.dumps(whole))
        doc["runs"] = [r for r in doc["runs"] if (r["mode"] in dense_modes) == dense]
        doc["meta"]["command"] = "harness.py --%s" % name
        paths.append(tmp_path / ("%s.json" % name))
        paths[-1].write_text(json.dumps(doc))
    md = tmp_path / "table.md"
    assert report.main([str(p) for p in paths] + ["--md", str(md)]) == 0
    text = md.read_text()
    assert "**Invocation 1 of 2** (modes ddp_powersgd, hvd_topk, layerwise, single, omgs, " \
        "optimal)" in text
    assert "**Invocation 2 of 2** (modes dense, ddp, hvd_dense)" in text
    assert "`harness.py --sparse`" in text and "`harness.py --dense`" in text
    # The comparisons span the files: omgs's speed-up over dense, sparsync dense / Horovod dense.
    cmp_rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
                if line.startswith("| vgg16 ")]
    c = [r for r in cmp_rows if len(r) == 10][0]
    assert c[5] == "4.00x" and c[6] == "1.03"
    assert report.render(report.load([paths[0]])).count("Invocation") == 0


def test_report_tabulates_a_dilation_sweep(tmp_path):
    doc = _synthetic_results()
    doc["runs"] = []
    for d, omgs, dense in ((1, 900.0, 2600.0), (3, 600.0, 2200.0), (10, 500.0, 2050.0),
                           (20, 480.0, 2000.0)):
        for mode, med in (("dense", dense), ("omgs", omgs)):
            doc["runs"].append({"model": "resnet50_pipedream", "nodes": 8, "mode": mode,
                                "dilation": float(d), "status": "ok", "median_ms": med,
                                "mean_ms": med, "backward_comm_median_ms": med})
    text = report.render(doc)
    sweep = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
             if line.startswith("| resnet50_pipedream | 8 | omgs | ")]
    assert sweep == [["resnet50_pipedream", "8", "omgs", "900.0", "600.0", "500.0", "480.0",
                      "1.500", "1.200", "1.042"]]
    if importlib.util.find_spec("matplotlib") is not None:
        report.sweep_chart(doc, tmp_path / "sweep.png")
        assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def _can_make_namespaces():
    if os.geteuid() != 0:
        return False
    r = subprocess.run(["ip", "netns", "list"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return r.returncode == 0


@pytest.mark.skipif(not _can_make_namespaces(), reason="needs root and ip netns")
def test_tiny_dilated_run_of_the_harness(daemon, short_tmp):
    """P = 2 namespaces at dilation 5, the tiny profile, sparsync dense and single and DDP (and
    Horovod when bench/peers/setup.sh has run): every run succeeds, its times are modelled
    (wall / 5), no iteration is shorter than the replayed compute, nothing is left behind."""
    prefix = "spci"  # not the benchmark's own prefix: a benchmark may be running
    modes = ["dense", "single", "ddp"]
    peer_python = REPO / "bench" / "peers" / ".venv" / "bin" / "python"
    if os.access(peer_python, os.X_OK):
        modes.append("hvd_dense")
    out = short_tmp / "r.json"
    argv = [sys.executable, str(CLUSTER / "harness.py"), "--nodes", "2", "--dilation", "5",
            "--models", str(_tiny_profile(short_tmp)), "--modes", ",".join(modes),
            "--plan-warmup-steps", "1", "--iters", "3", "--peer-warmup", "2",
            "--prefix", prefix, "--daemon", daemon, "--out", str(out),
            "--run-dir", str(short_tmp / "run"), "--run-timeout-s", "60", "--timeline"]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout
    doc = json.loads(out.read_text())
    assert doc["meta"]["dilation"] == [5.0] and doc["meta"]["load_average_end"]
    assert [run["mode"] for run in doc["runs"]] == modes
    for run in doc["runs"]:
        assert run["status"] == "ok", run
        assert run["dilation"] == 5.0 and run["link"] == {"rate": "200000kbit",
                                                           "latency": "50000us"}
        assert run["wall_median_ms"] == pytest.approx(5 * run["median_ms"], rel=1e-3)
        assert run["min_ms"] >= 1e3 * (TINY_BACKWARD_S + 0.002)  # forward + backward, modelled
        assert run["min_ms"] < 1e3  # and nothing like the 5x of the wall clock
    assert doc["runs"][1]["predicted_ms"] is not None
    # --timeline: every daemon wrote its file, and timeline_steps.py lines the groups up
    single = Path(doc["runs"][1]["run_dir"])
    assert sorted(p.name for p in single.glob("timeline-*.json")) == [
        "timeline-0.json", "timeline-1.json"]
    steps = subprocess.run([sys.executable, str(CLUSTER / "timeline_steps.py"), str(single),
                            "--dilation", "5", "--steps", "1"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
    assert steps.returncode == 0, steps.stdout
    assert "2 node(s)" in steps.stdout and re.search(r"^step \d+$", steps.stdout, re.M)
    assert re.search(r"^\s+\d+\s+\d+\s+(sparse|dense) \|", steps.stdout, re.M), steps.stdout
    spaces, links = harness.netns.leftovers(prefix)
    assert not spaces and not links
    assert not [n for n in os.listdir("/etc/netns") if n.startswith(prefix)] \
        if os.path.isdir("/etc/netns") else True


def test_topk_sgd_baseline_selects_the_whole_models_top_k_with_error_feedback():
    torch = pytest.importorskip("torch")
    import horovod_worker

    class OneRank:  # Horovod's allgather and size for a job of one
        def allgather(self, t, name):
            return t.clone()

        def size(self):
            return 1

    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3000, 10, 4000)]
    topk = horovod_worker.TopK(OneRank(), params, density=0.01)
    topk.CHUNK = 1000  # several chunks
    grads = torch.randn(7010, generator=gen)
    topk.flat.copy_(grads)  # what backward leaves in the gradients (views of topk.flat)
    topk.reduce()
    want = torch.topk(grads.abs(), 70).indices
    sent = torch.zeros(7010)
    sent[want] = grads[want]
    assert torch.equal(torch.cat([p.grad for p in params]), sent)  # averaged over one rank
    assert torch.equal(topk.residual, grads - sent)  # the rest is kept for the next step
