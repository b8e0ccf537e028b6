"""Errors reach every worker: shape mismatch, a killed worker, a daemon that is not there."""

import json
import os
import signal
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


FAULT_WORKER = REPO / "tests" / "faults" / "worker.py"


def start_step_workers(job):
    procs = []
    for r in range(job.size):
        log = open(job.tmp / ("w%d.log" % r), "wb")
        procs.append(subprocess.Popen([sys.executable, str(FAULT_WORKER)], env=job.worker_env(r),
                                      stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        log.close()
    job.workers = procs
    return procs


def wait_for_step(job, step, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(job.worker_log(r).count("step ") >= step for r in range(job.size)):
            return
        time.sleep(0.02)
    raise AssertionError("the workers did not reach step %d\n%s" % (step, job.logs()))


def first_error(job, r):
    for line in job.worker_log(r).splitlines():
        if line.startswith("ERROR: "):
            return line
    return None


def wait_all(procs, timeout_s):
    deadline = time.monotonic() + timeout_s
    return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs]


# Issue 16, item 5: a daemon stopped with SIGTERM mid-step fails the collectives of every node
# with its reason, every worker hears it at once, and the other daemons stop cleanly afterwards.
def test_sigterm_of_one_daemon_tells_every_worker_why(job_factory):
    job = job_factory(3, 1, {"SPARSYNC_TIMEOUT_S": str(TIMEOUT_S), "SPARSYNC_COMPRESSOR": "topk",
                             "SPARSYNC_CALIBRATE": "0", "SPARSYNC_MIN_COMPRESS_BYTES": "0"})
    procs = start_step_workers(job)
    wait_for_step(job, 3)
    start = time.monotonic()
    job.daemons[1].send_signal(signal.SIGTERM)
    rcs = wait_all(procs, TIMEOUT_S)
    elapsed = time.monotonic() - start
    assert rcs == [1, 1, 1], "%s\n%s" % (rcs, job.logs())
    assert elapsed < TIMEOUT_S / 2, "the workers heard it only at the timeout\n" + job.logs()
    assert job.daemons[1].wait(timeout=10) == 0, job.logs()
    for r in range(3):
        err = first_error(job, r)
        assert err and "node 1 is shutting down" in err, "rank %d: %s\n%s" % (r, err, job.logs())
    job.assert_clean_after_stop(job.stop())


# Issue 16, D4: after a non-zero daemon dies, every worker of the other nodes gets the daemons'
# reason naming the lost node, long before its own wait would time out. The second case stops
# the daemon half a second before the kill, with no pause between steps, so that the others
# mostly wait inside an exchange with it: their Gloo errors then name no node (every node listens
# on 127.0.0.1) and must wait for the coordinator's verdict, which does (the daemon before
# e333435 failed this case 2 times in 3, and CI once without the stop).
@pytest.mark.parametrize("pause_s,stop_first", [("0.02", False), ("0", True)])
def test_a_killed_daemon_is_named_to_every_worker(job_factory, pause_s, stop_first):
    job = job_factory(3, 1, {"SPARSYNC_TIMEOUT_S": str(TIMEOUT_S), "SPARSYNC_COMPRESSOR": "topk",
                             "SPARSYNC_CALIBRATE": "0", "SPARSYNC_MIN_COMPRESS_BYTES": "0",
                             "FAULT_STEP_PAUSE_S": pause_s})
    procs = start_step_workers(job)
    wait_for_step(job, 3)
    start = time.monotonic()
    if stop_first:
        os.kill(job.daemons[2].pid, signal.SIGSTOP)
        time.sleep(0.5)
    os.kill(job.daemons[2].pid, signal.SIGKILL)
    rcs = wait_all(procs, 2 * TIMEOUT_S)
    assert rcs == [1, 1, 1], "%s\n%s" % (rcs, job.logs())
    assert time.monotonic() - start < TIMEOUT_S, job.logs()
    for r in range(3):
        err = first_error(job, r)
        assert err and "node 2" in err, "rank %d: %s\n%s" % (r, err, job.logs())
        assert "timed out" not in err, err
    job.daemons[2].wait()
    job.assert_clean_after_stop(job.stop(), killed=[2])


# Issue 16, D9: once node 0's daemon is gone, the other daemons still honour SIGTERM at once
# (no RPC or collective waits out its deadline on the way down).
def test_daemons_stop_quickly_after_the_coordinator_died(job_factory):
    job = job_factory(3, 1, {"SPARSYNC_TIMEOUT_S": "60", "SPARSYNC_COMPRESSOR": "topk",
                             "SPARSYNC_CALIBRATE": "0", "SPARSYNC_MIN_COMPRESS_BYTES": "0"})
    procs = start_step_workers(job)
    wait_for_step(job, 3)
    os.kill(job.daemons[0].pid, signal.SIGKILL)
    time.sleep(0.3)
    start = time.monotonic()
    for d in job.daemons[1:]:
        d.send_signal(signal.SIGTERM)
    for d in job.daemons[1:]:
        assert d.wait(timeout=10) == 0, job.logs()
    assert time.monotonic() - start < 3.0, "SIGTERM took %.1f s\n%s" % (
        time.monotonic() - start, job.logs())
    wait_all(procs, 30)
    job.daemons[0].wait()
    job.assert_clean_after_stop(job.stop(), killed=[0])
