"""The emulated-cluster benchmark (bench/cluster/, bench/profiles/) without root.

The real run needs root and an hour (it is a benchmark); here: the harness's --dry-run commands
for P = 4 and 8 (addresses, shaping on both ends of every link, every mode, teardown), the
committed model profiles, the replay worker against real daemons on loopback, the DDP baseline
worker on loopback, and report.py's table on synthetic results.
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

import harness  # noqa: E402
import model_profile  # noqa: E402
import report  # noqa: E402

MODES = ["dense", "ddp", "layerwise", "single", "fixed", "omgs", "optimal"]
MODELS = {  # parameter counts of the model definitions (bench/profiles/models.py)
    "resnet20": 269722, "vgg16": 14728266, "alexnet": 61100840, "resnet50": 25557032,
    "inception_v4": 42679816, "lstm_ptb": 66034000,
}
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
    text = "\n".join(lines)

    # Every address is in the benchmarking range 198.18.0.0/15.
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


def test_dry_run_measures_the_bandwidth_between_namespaces():
    lines = dry_run("--nodes", "4", "--measure-bandwidth", "--bandwidth-only")
    assert any("bandwidth.py recv --bind 198.18.0.2" in line and "spsc-n1" in line
               for line in lines)
    assert any("bandwidth.py send --to 198.18.0.2:" in line and "spsc-n0" in line
               for line in lines)
    assert not any("sparsyncd" in line for line in lines)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_profiles_load_with_the_models_sizes_and_measured_times(model):
    doc = model_profile.load(model)
    tensors = doc["tensors"]
    assert doc["total_numel"] == sum(t["numel"] for t in tensors) == MODELS[model]
    assert doc["num_tensors"] == len(tensors)
    for t in tensors:
        n = 1
        for d in t["shape"]:
            n *= d
        assert n == t["numel"], t
    assert all(t["backward_s"] >= 0 for t in tensors)
    total = sum(t["backward_s"] for t in tensors)
    assert 0 < total <= doc["backward_s"] * 1.5 + 1e-3
    assert doc["forward_s"] > 0
    m = doc["measurement"]
    assert m["batch_size"] >= 1 and m["threads"] >= 1 and m["measured_iters"] >= 1
    assert m["machine"]["cpu"] and "make_profiles.py" in m["command"]
    # Backward order: the classifier's gradients come first, the first layer's last.
    first = {"resnet20": "fc.", "vgg16": "2.", "alexnet": "classifier.", "resnet50": "fc.",
             "inception_v4": "fc.", "lstm_ptb": "decoder."}[model]
    assert tensors[0]["name"].startswith(first), tensors[0]["name"]
    schedule = model_profile.Schedule(doc, time_scale=0.5)
    assert schedule.ready_s == sorted(schedule.ready_s)
    assert schedule.backward_s == pytest.approx(0.5 * total)


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


def test_ddp_worker_runs_on_loopback(short_tmp):
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
             "--out", str(short_tmp / "ddp{rank}.json")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 120
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("ddp_worker did not finish within 120 s")
    assert [p.returncode for p in procs] == [0, 0], b"\n".join(outs).decode(errors="replace")
    for r in range(2):
        res = json.loads((short_tmp / ("ddp%d.json" % r)).read_text())
        assert res["worker"] == "ddp" and res["rank"] == r and len(res["iter_s"]) == 3
        assert min(res["backward_comm_s"]) >= TINY_BACKWARD_S


def test_daemon_plan_lines_are_parsed_leniently():
    log = ("[info] starting\n"
           "[node 0] [info] plan v1 (step 5): groups [0-3] [4-9] [10-52], predicted 41.25 ms\n"
           "[node 0] [info] plan v2 takes effect at step 40; predicted 39.5ms\n")
    plans = harness.parse_plans(log)
    assert [p["predicted_ms"] for p in plans] == [41.25, 39.5]


def _synthetic_results():
    def run(model, nodes, mode, median, predicted=None, status="ok"):
        r = {"model": model, "nodes": nodes, "mode": mode, "status": status}
        if status == "ok":
            r.update({"mean_ms": median * 1.02, "median_ms": median, "predicted_ms": predicted,
                      "backward_comm_median_ms": median * 0.8, "iteration_ms": [median] * 3})
        return r
    return {"meta": {"date": "2026-01-01T00:00:00+00:00", "command": "harness.py --nodes 8",
                     "network": {"rate": "1gbit", "burst": "128kb", "latency": "10ms"},
                     "density": 0.001, "time_scale": 1.0, "warmup": 7, "iters": 20,
                     "bandwidth": {"8": [{"from": "198.18.0.1", "to": "198.18.0.2",
                                          "gbps": 0.95}]}},
            "runs": [run("vgg16", 8, "dense", 2000.0), run("vgg16", 8, "ddp", 1500.0),
                     run("vgg16", 8, "layerwise", 400.0, 380.0),
                     run("vgg16", 8, "single", 500.0, 520.0),
                     run("vgg16", 8, "omgs", 320.0, 300.0),
                     run("vgg16", 8, "optimal", 0, status="failed")]}


def test_report_writes_the_table_and_the_chart(tmp_path):
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
    rows = {line.split("|")[3].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in text.splitlines() if line.startswith("| vgg16 ")}
    assert list(rows) == ["dense", "ddp", "layerwise", "single", "omgs", "optimal"]
    assert rows["omgs"][4] == "320.0" and rows["omgs"][6] == "300.0"
    assert rows["omgs"][7] == "0.85"       # backward+comm 256 / predicted 300
    assert rows["omgs"][8] == "6.25x"      # dense 2000 / 320
    assert rows["omgs"][9] == "1.25x"      # best(layerwise 400, single 500) / 320
    assert rows["ddp"][9] == "-"
    assert rows["optimal"][3] == "failed"
    assert "198.18.0.1->198.18.0.2 0.950" in text
    if png is not None:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
