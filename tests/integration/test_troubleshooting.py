"""docs/operations.md, "Troubleshooting": each failure it describes, run for real, and the
messages it quotes checked against what sparsync printed, so that the page cannot drift from the
code. Timeouts are shortened (SPARSYNC_STALL_WARN_S, SPARSYNC_TIMEOUT_S) so that each case takes
seconds; an unreachable host is tested over ssh in test_hosts.py (the page quotes its message).

`expect(template, output, **values)` asserts that the message is in what sparsync printed (the
template filled with `values`) and in the page's troubleshooting section, word for word except
for the `{fields}`, which the page fills with examples of its own (an address, a count).
"""

import json
import re
import socket
import string
import subprocess
import sys

import pytest

from conftest import REPO, Job, free_port, sparsync_env

DOC = (REPO / "docs" / "operations.md").read_text()
TROUBLESHOOTING = " ".join(DOC[DOC.index("## 10. Troubleshooting"):].split())
# Long enough for two daemons to calibrate on a loaded machine (the coordinator's liveness check
# of the nodes uses the same limit), short enough for CI.
STALL_S, TIMEOUT_S = 1, 10


def expect(template, output, **values):
    message = template.format(**values)
    assert message in output, "sparsync did not print %r:\n%s" % (message, output[-6000:])
    pattern = "".join(re.escape(text) + (r".+?" if field is not None else "")
                      for text, field, _, _ in string.Formatter().parse(template))
    assert re.search(pattern, TROUBLESHOOTING), \
        "docs/operations.md's troubleshooting does not quote %r" % template


def daemon_logs(job):
    return "\n".join((job.tmp / ("d%d.log" % i)).read_text(errors="replace")
                     for i in range(job.nodes))


@pytest.fixture
def job(daemon, short_tmp):
    jobs = []

    def make(nodes=2, extra=None):
        tmp = short_tmp / str(len(jobs))
        tmp.mkdir(mode=0o700)  # the daemons refuse a socket directory others may enter
        j = Job(daemon, nodes, 1, tmp, {"SPARSYNC_STALL_WARN_S": str(STALL_S),
                                        "SPARSYNC_TIMEOUT_S": str(TIMEOUT_S), **(extra or {})})
        jobs.append(j)
        return j.start()

    yield make
    for j in jobs:
        j.stop()


# ---- hangs: mismatched tensors, uneven steps ----

@pytest.mark.parametrize("trouble,tensor", [("names", "fc2.weight"), ("uneven", "fc1.weight")])
def test_a_hang_is_reported_then_fails_every_worker_with_the_reason(job, trouble, tensor):
    j = job()
    rcs = j.run_workers("troubles.py", timeout_s=TIMEOUT_S + 60, extra={"TROUBLE": trouble})
    assert rcs == [0, 0], "workers crashed or hung: %s\n%s" % (rcs, j.logs())
    logs = daemon_logs(j)
    expect("[warning] stall: tensor '{tensor}' is ready on node(s) 0 but node(s) 1 have not "
           "posted it for {n} s", logs, tensor=tensor, n=STALL_S)
    expect("[error] failing 1 pending collective(s): tensor '", logs)
    for r in range(2):
        res = json.loads((j.outdir / ("rank%d.json" % r)).read_text())
        # The daemon's reason, not the worker's own limit (SPARSYNC_TIMEOUT_S plus 5 s).
        assert res["error"], "rank %d did not fail\n%s" % (r, j.logs())
        # Node 0's coordinator names the first tensor it finds missing: either of the two.
        lacking = "0 but not on node(s) 1" if "'%s'" % tensor in res["error"] else \
            "1 but not on node(s) 0"
        expect("' was posted on node(s) {lacking} within {n} s (SPARSYNC_TIMEOUT_S)",
               res["error"], lacking=lacking, n=TIMEOUT_S)
        assert "plus 5 s" not in res["error"], res
        assert res["elapsed_s"] < TIMEOUT_S + 4, res
    # Node 0's coordinator names the first tensor it finds missing (either of the two).
    assert re.search(r"failing 1 pending collective\(s\): tensor '(%s|fc2.bias|loss)' was posted"
                     % re.escape(tensor), logs), logs


def test_a_worker_that_ends_early_fails_the_others_at_once_naming_it(job):
    j = job()
    rcs = j.run_workers("troubles.py", timeout_s=TIMEOUT_S + 60, extra={"TROUBLE": "early"})
    assert rcs == [0, 0], "workers crashed or hung: %s\n%s" % (rcs, j.logs())
    ended = json.loads((j.outdir / "rank1.json").read_text())
    assert ended["error"] is None, ended
    res = json.loads((j.outdir / "rank0.json").read_text())
    assert res["error"], "rank 0 did not fail\n%s" % j.logs()
    # Whichever of its last two collectives rank 0 had posted when the news came.
    tensor = "loss" if "'loss'" in res["error"] else "fc1.weight"
    expect("tensor '{tensor}' was posted on node(s) 0 but rank 1 on node 1 ({address}) has left "
           "the job without posting it (its worker called shutdown(), ended or crashed): every "
           "rank must make the same collectives", res["error"], tensor=tensor,
           address="127.0.0.1")
    # Once rank 1 has been gone for the grace period (5 s), well before the timeout.
    assert res["elapsed_s"] < TIMEOUT_S - 2, res


def test_a_worker_that_shuts_down_and_inits_again_takes_part_again(job):
    j = job()
    rcs = j.run_workers("troubles.py", timeout_s=90, extra={"TROUBLE": "reinit"})
    assert rcs == [0, 0], "workers crashed or hung: %s\n%s" % (rcs, j.logs())
    for r in range(2):
        res = json.loads((j.outdir / ("rank%d.json" % r)).read_text())
        assert res["error"] is None and res["b"] == [1.0] * 4, (res, j.logs())


# ---- daemons that cannot start ----

def run_daemons(daemon, nodes, ranks, port, tmp, tokens=None, extra=None, timeout_s=60):
    """Starts node `ranks` of a job of `nodes`; returns their (exit status, output)."""
    procs = []
    for i in ranks:
        env = sparsync_env({"SPARSYNC_NODE_RANK": str(i), "SPARSYNC_NUM_NODES": str(nodes),
                            "SPARSYNC_COORDINATOR": "127.0.0.1:%d" % port,
                            "SPARSYNC_LISTEN": "127.0.0.1", "SPARSYNC_LOCAL_SIZE": "1",
                            "SPARSYNC_SOCKET": str(tmp / ("n%d.sock" % i)),
                            "SPARSYNC_JOB_TOKEN": (tokens or {}).get(i, "token"),
                            "SPARSYNC_TIMEOUT_S": "3", "SPARSYNC_COMPRESSOR": "none",
                            **(extra or {})})
        procs.append(subprocess.Popen([daemon], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
        out.append((p.returncode, text))
    return out


def test_a_wrong_token_between_daemons(daemon, short_tmp):
    port = free_port()
    (rc0, out0), (rc1, out1) = run_daemons(daemon, 2, [0, 1], port, short_tmp,
                                           tokens={0: "one", 1: "another"})
    assert rc0 != 0 and rc1 != 0
    expect("[error] cannot start: joining the coordinator at {address}: node 1 presented a wrong "
           "SPARSYNC_JOB_TOKEN", out1, address="127.0.0.1:%d" % port)
    expect("[error] cannot start: node(s) 1 did not join within {n} s", out0, n=3)


def test_a_wrong_token_from_a_worker(job):
    j = job(nodes=1)
    code = ("import sparsync.torch as hvd\n"
            "try:\n    hvd.init()\nexcept hvd.SparsyncError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code],
                         env=j.worker_env(0, {"SPARSYNC_JOB_TOKEN": "not-the-token"}),
                         capture_output=True, text=True, timeout=120)
    expect("sparsyncd at '{path}' refused this worker: wrong SPARSYNC_JOB_TOKEN: the worker's "
           "token differs from the daemon's", out.stdout, path=j.socket(0))
    expect("[warning] refused a connection before its handshake: wrong SPARSYNC_JOB_TOKEN: the "
           "worker's token differs from the daemon's", daemon_logs(j))


def test_node_0_that_never_answers(daemon, short_tmp):
    port = free_port()
    [(rc, out)] = run_daemons(daemon, 2, [1], port, short_tmp)
    assert rc != 0
    address = "127.0.0.1:%d" % port
    expect("[info] waiting for the coordinator at {address}", out, address=address)
    expect("[error] cannot start: could not join the coordinator at {address} "
           "(SPARSYNC_COORDINATOR) within {n} s; is node 0 running?", out, address=address, n=3)


def listening(port):
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_a_port_in_use(daemon, short_tmp):
    port = free_port()
    with listening(port):
        [(rc, out)] = run_daemons(daemon, 2, [0], port, short_tmp)
    assert rc != 0
    expect("[error] cannot start: cannot serve the coordinator on {address} "
           "(SPARSYNC_COORDINATOR): the port is in use or the address is not local", out,
           address="127.0.0.1:%d" % port)
    metrics = free_port()
    with listening(metrics):
        [(rc, out)] = run_daemons(daemon, 1, [0], free_port(), short_tmp,
                                  extra={"SPARSYNC_METRICS_PORT": str(metrics)})
    assert rc != 0
    expect("[error] cannot start: cannot serve the metrics on {address} (SPARSYNC_METRICS_PORT, "
           "SPARSYNC_METRICS_ADDRESS): Address already in use", out,
           address="127.0.0.1:%d" % metrics)
