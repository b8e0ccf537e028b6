"""sparsync.tensorflow's errors, as sparsync.torch's: no daemon, a shape mismatch, a killed
worker; and a TensorFlow and a PyTorch worker in one job."""

import json
import subprocess
import sys

import pytest

from conftest import sparsync_env
from test_tensorflow import TF_PYTHON, TF_START_S, WORKERS, requires_tf, run_tf_workers, \
    start_worker, tf_env, wait_all

TIMEOUT_S = 20


def read_results(job, ranks):
    out = {}
    for r in ranks:
        path = job.outdir / ("rank%d.json" % r)
        assert path.exists(), "worker %d wrote no result\n%s" % (r, job.logs())
        out[r] = json.loads(path.read_text())
    return out


@requires_tf
def test_no_daemon_names_the_socket_variable_within_seconds(short_tmp, client_library):
    env = tf_env(sparsync_env({"SPARSYNC_SOCKET": str(short_tmp / "nobody.sock"),
                               "SPARSYNC_CONNECT_TIMEOUT_S": "2"}))
    code = ("import time, sparsync.tensorflow as hvd\nt = time.monotonic()\n"
            "try:\n    hvd.init()\nexcept hvd.SparsyncError as e:\n"
            "    print('ERR %.2f' % (time.monotonic() - t), e)\n")
    out = subprocess.run([str(TF_PYTHON), "-c", code], env=env, capture_output=True, text=True,
                         timeout=TF_START_S + 60)
    line = next((x for x in out.stdout.splitlines() if x.startswith("ERR")), None)
    assert line is not None, out.stdout + out.stderr
    assert float(line.split()[1]) < 5.0, line
    assert "SPARSYNC_SOCKET" in line and "nobody.sock" in line, line


@requires_tf
@pytest.mark.parametrize("mode", ["mismatch", "graph_mismatch"])
def test_shape_mismatch_fails_every_rank_naming_the_tensor(job_factory, mode):
    local = 2 if mode == "mismatch" else 1  # eagerly the last rank differs from its neighbour
    job = job_factory(2, local, {"SPARSYNC_TIMEOUT_S": str(TIMEOUT_S)})
    rcs = run_tf_workers(job, "tf_errors.py", timeout_s=TIMEOUT_S + 60, extra={"MODE": mode})
    assert rcs == [0] * job.size, "workers failed or hung: %s\n%s" % (rcs, job.logs())
    for r, res in read_results(job, range(job.size)).items():
        assert res["error"], "rank %d did not fail on a shape mismatch\n%s" % (r, job.logs())
        assert "mismatched" in res["error"], "rank %d: %s" % (r, res["error"])
        assert res["elapsed_s"] < TIMEOUT_S, res  # known once everybody posted
        if mode == "mismatch":
            assert res["kind"] == "SparsyncError" and res["status"] == 4, res
        else:
            assert res["kind"] == "FailedPreconditionError", res
    job.assert_clean_after_stop(job.stop())


@requires_tf
def test_killed_worker_fails_every_other_naming_it(job_factory):
    job = job_factory(2, 2, {"SPARSYNC_TIMEOUT_S": str(TIMEOUT_S)})
    victim = 1
    rcs = run_tf_workers(job, "tf_errors.py", timeout_s=TIMEOUT_S + 60,
                         extra={"MODE": "kill", "KILL_RANK": str(victim)})
    assert rcs[victim] == -9, rcs
    survivors = [r for r in range(4) if r != victim]
    assert [rcs[r] for r in survivors] == [0] * 3, \
        "survivors hung or crashed: %s\n%s" % (rcs, job.logs())
    pid = (job.outdir / ("pid%d" % victim)).read_text()
    for r, res in read_results(job, survivors).items():
        assert res["error"], "rank %d did not notice the dead worker" % r
        assert res["elapsed_s"] <= TIMEOUT_S + 2, res
        assert "rank %d" % victim in res["error"] or pid in res["error"], \
            "rank %d: error does not name the dead worker: %s" % (r, res["error"])
    job.assert_clean_after_stop(job.stop())


@requires_tf
def test_tensorflow_and_torch_workers_share_a_job(job_factory):
    """The daemon knows no frameworks: the same tensor name and spec from a TensorFlow and a
    PyTorch worker is one tensor; a different dtype under one name is a mismatch on both."""
    job = job_factory(2, 1, {"SPARSYNC_TIMEOUT_S": str(TIMEOUT_S)})
    script = WORKERS / "tf_errors.py"
    job.workers = [
        start_worker(job, 0, [TF_PYTHON, script], {"MODE": "mixed", "FRAMEWORK": "tensorflow"}),
        start_worker(job, 1, [sys.executable, script], {"MODE": "mixed", "FRAMEWORK": "torch"}),
    ]
    rcs = wait_all(job.workers, TF_START_S + TIMEOUT_S + 60)
    assert rcs == [0, 0], "workers failed: %s\n%s" % (rcs, job.logs())
    results = read_results(job, [0, 1])
    for r, res in results.items():
        assert res["shared"] == [1.5, 1.5, 1.5], res
        assert res["error"] and "clash" in res["error"], res
        assert res["elapsed_s"] < TIMEOUT_S, res
    job.assert_clean_after_stop(job.stop())
