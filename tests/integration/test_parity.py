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


def test_join_with_sparse_gradients_and_whole_nodes_joined(job_factory):
    """Top-k with error feedback, 4 nodes x 1: a joined rank's node takes part in each sparse
    exchange with zeros, every rank still training gets the same gradient, nothing waits."""
    job = job_factory(4, 1, {"SPARSYNC_COMPRESSOR": "topk", "SPARSYNC_DENSITY": "0.25",
                             "SPARSYNC_MIN_COMPRESS_BYTES": "0"})
    rcs = job.run_workers("join_sparse.py", timeout_s=120)
    assert rcs == [0] * job.size, "workers failed: %s\n%s" % (rcs, job.logs())
    for r in range(job.size):
        assert "JOIN SPARSE OK" in job.worker_log(r), job.worker_log(r)
    job.assert_clean_after_stop(job.stop())
