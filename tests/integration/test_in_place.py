"""In-place explicit ops through real daemons: exact results, the caller's other tensors kept,
and the tensor moved into the shared region where it may be (tests/integration/workers/in_place.py)."""

import pytest


@pytest.mark.parametrize("nodes,local_size", [(2, 1), (1, 2), (2, 2)])
def test_in_place_ops_are_exact_and_keep_other_tensors(job_factory, nodes, local_size):
    job = job_factory(nodes, local_size)
    rcs = job.run_workers("in_place.py", timeout_s=120)
    assert rcs == [0] * job.size, "workers failed: %s\n%s" % (rcs, job.logs())
    logs = job.logs()
    # Lone tensors moved into the region: no copy out (and, for a named loop, none in).
    assert logs.count("moved: [('unnamed', True), ('named', True), ('evicted', True)]") == \
        job.size, logs
    job.assert_clean_after_stop(job.stop())
