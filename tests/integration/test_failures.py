"""Errors reach every worker: shape mismatch, a killed worker, a daemon that is not there."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import REPO, free_port, sparsync_env

TIMEOUT_S = 20


def read_results(job, ranks):
    out = {}
    for r in ranks:
        path = job.outdir / ("rank%d.json" % r)
        assert path.exists(), "worker %d wrote no result\n%s" % (r, job.logs())
        out[r] = json.loads(path.read_text())
    return out


@pytest.mark.parametrize("where", ["cross-node", "local"])
def test_shape_mismatch_fails_every_worker_naming_the_tensor(job_factory, where):
    job = job_factory(2, 2, {"SPARSYNC_TIMEOUT_S": str(TIMEOUT_S)})
    rcs = job.run_workers("mismatch.py", timeout_s=TIMEOUT_S + 30, extra={"MISMATCH": where})
    assert rcs == [0] * 4, "workers failed or hung: %s\n%s" % (rcs, job.logs())
    for r, res in read_results(job, range(4)).items():
        assert res["error"], "rank %d did not fail on a shape mismatch\n%s" % (r, job.logs())
        assert "mismatched" in res["error"], "rank %d: %s" % (r, res["error"])
        # The mismatch is known as soon as everybody has posted: no waiting for a timeout.
        assert res["elapsed_s"] < TIMEOUT_S, res
        assert res["status"] == 4, res  # SPARSYNC_ERR_MISMATCH
    job.assert_clean_after_stop(job.stop())


def test_killed_worker_fails_all_others(job_factory):
    job = job_factory(2, 2, {"SPARSYNC_TIMEOUT_S": str(TIMEOUT_S)})
    victim = 1
    rcs = job.run_workers("kill.py", timeout_s=TIMEOUT_S + 30, extra={"KILL_RANK": str(victim)})
    assert rcs[victim] == -9, rcs
    survivors = [r for r in range(4) if r != victim]
    assert [rcs[r] for r in survivors] == [0] * 3, \
        "survivors hung or crashed: %s\n%s" % (rcs, job.logs())
    pid = (job.outdir / ("pid%d" % victim)).read_text()
    for r, res in read_results(job, survivors).items():
        assert res["error"], "rank %d did not notice the dead worker" % r
        assert res["elapsed_s"] <= TIMEOUT_S + 2, res
        # The message should let a user find the culprit.
        assert "rank %d" % victim in res["error"] or pid in res["error"], \
            "rank %d: error does not name the dead worker: %s" % (r, res["error"])
    # The daemons stay failed: a worker started now hears why, and what to do.
    code = ("import sparsync.torch as hvd\n"
            "try:\n    hvd.init()\nexcept hvd.SparsyncError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=job.worker_env(0), capture_output=True,
                         text=True, timeout=30)
    assert "ERR" in out.stdout and "restart the daemons" in out.stdout, out.stdout + out.stderr
    job.assert_clean_after_stop(job.stop())


def test_wrong_job_token_is_refused(job_factory):
    job = job_factory(1, 1)
    code = ("import sparsync.torch as hvd\n"
            "try:\n    hvd.init()\nexcept hvd.SparsyncError as e:\n    print('ERR', e)\n")
    env = job.worker_env(0, {"SPARSYNC_JOB_TOKEN": "not-the-token"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=30)
    assert "ERR" in out.stdout, out.stdout + out.stderr
    job.assert_clean_after_stop(job.stop())


def test_unreachable_daemon_names_the_variable(short_tmp, client_library):
    env = sparsync_env({"SPARSYNC_SOCKET": str(short_tmp / "nobody.sock"),
                        "SPARSYNC_CONNECT_TIMEOUT_S": "2"})
    code = ("import time, sparsync.torch as hvd\nt = time.monotonic()\n"
            "try:\n    hvd.init()\nexcept hvd.SparsyncError as e:\n"
            "    print('ERR %.2f' % (time.monotonic() - t), e)\n")
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.stdout.startswith("ERR"), out.stdout + out.stderr
    elapsed = float(out.stdout.split()[1])
    assert 1.5 <= elapsed < 5, out.stdout
    assert "SPARSYNC_SOCKET" in out.stdout and "nobody.sock" in out.stdout
    assert "sparsyncd" in out.stdout and "sparsyncrun" in out.stdout
    assert time.monotonic() - start < 30


def test_nccl_transport_without_a_gpu_stops_with_a_clear_error(daemon, short_tmp):
    # No GPU here (or a build without NCCL): the daemon must refuse at start, not hang.
    env = dict(os.environ, SPARSYNC_TRANSPORT="nccl", SPARSYNC_SOCKET=str(short_tmp / "d.sock"),
               SPARSYNC_COORDINATOR="127.0.0.1:%d" % free_port(), SPARSYNC_TIMEOUT_S="20")
    proc = subprocess.run([daemon], env=env, capture_output=True, text=True, timeout=60)
    if proc.returncode == 0:
        pytest.skip("a usable GPU is present: the NCCL transport started")
    text = proc.stdout + proc.stderr
    assert "NCCL" in text or "nccl" in text, text
