"""Seeing what the daemon does, with real daemons: the timeline (SPARSYNC_TIMELINE and
hvd.start_timeline) as Chrome-trace JSON that stays valid after SIGTERM and after a failed job;
the Prometheus metrics, scraped by a real Prometheus (Debian's, started here) from a 2-node job
and checked with `promtool check metrics`; and the info log of a job (start, one line per plan
change on node 0, end).
"""

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import Job, free_port

WORKER = "observe_worker.py"
SPARSE = {"SPARSYNC_COMPRESSOR": "topk", "SPARSYNC_DENSITY": "0.01", "SPARSYNC_CALIBRATE": "0",
          "SPARSYNC_PLAN_WARMUP_STEPS": "2"}


def load(path):
    with open(path) as f:
        return json.load(f)  # any JSON error fails the test


def names(trace, ph=None):
    return [e["name"] for e in trace if ph is None or e.get("ph") == ph]


def check_trace(trace, node):
    """What every node's timeline of a training job holds."""
    assert {"name": "process_name", "ph": "M", "pid": node,
            "args": {"name": "sparsyncd node %d" % node}} in trace
    rows = {e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert {"tensor gradient.0.weight", "tensor gradient.2.bias", "stage A: prepare",
            "stage B: exchange, deliver"} <= rows, rows
    spans = names(trace, "X")
    for stage in ("negotiate", "queue", "prepare", "exchange", "deliver"):
        assert stage in spans, (stage, sorted(set(spans)))
    sparse = [e for e in trace if e["name"] == "prepare" and e["args"]["sparse"]]
    assert sparse and all(e["args"]["path"] == "host sparse" for e in sparse)
    # A sparse group's sub-steps, each inside its stage's span of the same group.
    stages = {(e["name"], e["args"]["seq"]): e for e in trace
              if e.get("ph") == "X" and e["name"] in ("prepare", "exchange")}
    seqs = {e["args"]["seq"] for e in sparse}
    for step, stage in (("local reduce", "prepare"), ("sparsify", "prepare"), ("pack", "prepare"),
                        ("transfer", "exchange"), ("unpack", "exchange"),
                        ("write-back", "exchange")):
        found = [e for e in trace if e["name"] == step and e["args"]["seq"] in seqs]
        assert found, (step, sorted(set(spans)))
        for e in found:
            outer = stages[(stage, e["args"]["seq"])]
            assert outer["tid"] == e["tid"], (e, outer)
            # Microseconds since the epoch (~1.8e15) parse to doubles 0.25 us apart, and a span's
            # end adds its duration's rounding: half a microsecond is the file's resolution here.
            assert outer["ts"] - 0.5 <= e["ts"], (e, outer)
            assert e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] + 0.5, (e, outer)
    for e in trace:
        if e.get("ph") == "X":
            assert e["pid"] == node and e["dur"] >= 0 and e["ts"] > 1.5e15, e


def test_timeline_of_every_node_is_valid_after_sigterm(daemon, short_tmp):
    template = str(short_tmp / "tl-{node}.json")
    job = Job(daemon, 2, 1, short_tmp, {**SPARSE, "SPARSYNC_TIMELINE": template}).start()
    try:
        rcs = job.run_workers(WORKER, ["--steps", "8"])
        assert rcs == [0, 0], job.logs()
    finally:
        assert job.stop() == [0, 0], job.logs()  # SIGTERM
    for node in range(2):
        trace = load(template.replace("{node}", str(node)))
        check_trace(trace, node)
        # Node 0's planner notes and everyone's plan changes are instant events.
        instants = names(trace, "i")
        assert any(n.startswith("plan v1 (") for n in instants), instants
        if node == 0:
            assert "planner" in instants, instants


def test_start_timeline_and_stop_timeline_from_the_workers(daemon, short_tmp):
    job = Job(daemon, 2, 2, short_tmp, SPARSE).start()
    path = short_tmp / "hvd-{node}.json"
    try:
        rcs = job.run_workers(WORKER, ["--steps", "8", "--timeline", str(path), "--start", "3",
                                       "--stop", "5"])
        assert rcs == [0] * 4, job.logs()
        # Stopped by the workers, while the daemons run on: complete files already.
        for node in range(2):
            trace = load(str(path).replace("{node}", str(node)))
            check_trace(trace, node)
            steps = {e["args"]["step"] for e in trace if e["name"] == "prepare"
                     and e["args"]["op"] == "gradient"}
            # Rounds count from 1 and broadcast_parameters came first: steps 3..5 are rounds
            # 4..6. The node's first worker to call start_timeline starts it for the node, so
            # a group of round 3 is prepared after the start when the other worker is still in
            # it (seen once in CI); a group may finish just after the stop.
            assert steps and min(steps) >= 3 and max(steps) <= 7, steps
    finally:
        job.stop()


def test_timeline_is_valid_after_a_failed_job(daemon, short_tmp):
    template = str(short_tmp / "fail-{node}.json")
    job = Job(daemon, 2, 1, short_tmp, {**SPARSE, "SPARSYNC_TIMELINE": template}).start()
    try:
        job.run_workers(WORKER, ["--steps", "400", "--sleep", "0.05"], timeout_s=0.1)
        deadline = time.monotonic() + 120
        while not all("step 3\n" in job.worker_log(r) for r in range(2)):
            assert time.monotonic() < deadline, job.logs()
            time.sleep(0.2)
        job.workers[1].kill()  # mid-job: the job fails on both nodes
        for w in job.workers:
            try:
                w.wait(timeout=60)
            except Exception:
                raise AssertionError("a worker did not end\n" + job.logs())
        assert job.workers[0].returncode != 0, job.logs()
    finally:
        job.stop()
    for node in range(2):
        trace = load(template.replace("{node}", str(node)))
        assert "job failed" in names(trace, "i"), (node, names(trace, "i"))


# ---- metrics ----

def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def sample(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


@pytest.fixture
def metrics_job(daemon, short_tmp):
    ports = [free_port(), free_port()]
    job = Job(daemon, 2, 1, short_tmp, SPARSE,
              node_env=lambda i: {"SPARSYNC_METRICS_PORT": str(ports[i])}).start()
    try:
        rcs = job.run_workers(WORKER, ["--steps", "12"])
        assert rcs == [0, 0], job.logs()
        yield job, ports
    finally:
        job.stop()


def test_metrics_pass_promtool_and_count_what_the_job_did(metrics_job):
    job, ports = metrics_job
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs prometheus (promtool; deploy/install_deps.sh)")
    for node, port in enumerate(ports):
        text = scrape(port)
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True)
        assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
        assert sample(text, 'sparsync_node_info{node="%d",num_nodes="2"}' % node) == 1
        assert sample(text, "sparsync_steps_total") >= 12
        assert sample(text, 'sparsync_groups_total{op="gradient",encoding="sparse"}') >= 12
        sent = sample(text, 'sparsync_sent_bytes_total{encoding="sparse"}')
        assert sent > 0 and sample(text, "sparsync_compression_saved_bytes_total") > 10 * sent
        assert sample(text, "sparsync_sparsify_seconds_count") >= 12
        assert sample(text, 'sparsync_exchange_seconds_count{encoding="dense"}') >= 1
        assert sample(text, "sparsync_plan_version") >= 1
        assert sample(text, "sparsync_plan_predicted_iteration_seconds") > 0
        assert sample(text, "sparsync_iteration_seconds") > 0
        assert sample(text, "sparsync_residual_norm") > 0
        assert sample(text, "sparsync_failures_total") == 0
        assert sample(text, "sparsync_connected_workers") == 0  # the workers said goodbye


def test_prometheus_scrapes_both_nodes(metrics_job, short_tmp):
    job, ports = metrics_job
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("needs prometheus (deploy/install_deps.sh)")
    web = free_port()
    config = short_tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: sparsync\n    static_configs:\n"
        "      - targets: [%s]\n" % ", ".join("'127.0.0.1:%d'" % p for p in ports))
    log = open(short_tmp / "prometheus.log", "wb")
    proc = subprocess.Popen([binary, "--config.file=%s" % config,
                             "--storage.tsdb.path=%s" % (short_tmp / "tsdb"),
                             "--web.listen-address=127.0.0.1:%d" % web, "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)

    def query(q):
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (web, urllib.parse.urlencode({"query": q}))
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return {res["metric"].get("instance", ""): float(res["value"][1])
                for res in body["data"]["result"]}

    try:
        deadline = time.monotonic() + 60
        steps = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, Path(log.name).read_text()
            try:
                steps = query("sparsync_steps_total")
                if len(steps) == 2:
                    break
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        instances = {"127.0.0.1:%d" % p for p in ports}
        assert set(steps) == instances, (steps, Path(log.name).read_text())
        assert all(v >= 12 for v in steps.values()), steps
        assert set(query("up == 1")) == instances
        nodes = query("sparsync_node_info")
        assert len(nodes) == 2
        saved = query("sum(sparsync_compression_saved_bytes_total)")
        assert saved and saved[""] > 0, saved
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_metrics_are_off_unless_a_port_is_set(daemon, short_tmp):
    job = Job(daemon, 1, 1, short_tmp, SPARSE).start()
    try:
        assert "metrics" not in (short_tmp / "d0.log").read_text()
    finally:
        job.stop()


# ---- quiet logs ----

def test_the_info_log_says_start_plan_changes_once_and_end(daemon, short_tmp):
    job = Job(daemon, 2, 1, short_tmp, SPARSE).start()
    try:
        assert job.run_workers(WORKER, ["--steps", "12"]) == [0, 0], job.logs()
    finally:
        job.stop()
    logs = [(short_tmp / ("d%d.log" % i)).read_text() for i in range(2)]
    for log in logs:
        assert "[info] starting:" in log and "[info] stopped" in log
        assert "[debug]" not in log
        assert "following merge plan" not in log  # each node's copy of the plan is debug
    plan_lines = [line for line in logs[0].splitlines() if "planner: plan v1 " in line]
    assert len(plan_lines) == 1, logs[0]
    assert "planner:" not in logs[1]
    # Per-worker chatter is not at info either.
    for log in logs:
        assert len([line for line in log.splitlines() if "[info]" in line]) < 25, log
