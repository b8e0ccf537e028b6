"""Horovod names of sparsync.torch through real daemons (workers/parity*.py assert the values).

2 nodes x 2 workers: local and cross-node exchanges, a power-of-two size for Adasum."""

import pytest


@pytest.mark.parametrize("script,marker", [("parity.py", "PARITY OK"),
                                           ("parity_train.py", "PARITY TRAIN OK")])
def test_horovod_names(job_factory, script, marker):
    job = job_factory(2, 2)
    rcs = job.run_workers(script, timeout_s=240)
    assert rcs == [0] * job.size, "workers failed: %s\n%s" % (rcs, job.logs())
    for r in range(job.size):
        assert marker in job.worker_log(r), job.worker_log(r)
    job.assert_clean_after_stop(job.stop())
