"""Horovod's process sets in sparsync.torch through real daemons (workers/process_sets.py asserts
the values; Horovod's own process-set tests are the model).

4 ranks, two layouts: 2 nodes x 2 workers (a set with both members on one node, a node with
members and non-members of a set) and 4 nodes x 1 worker (a set's exchange crosses nodes
without a member, whose daemons take part with zeros). One job each, every check in it: the
sets (ids, sizes, set ranks, duplicates refused by add_process_set and by init), every collective
within each set (allreduce average and sum, allgather with different first dimensions, broadcast
from each member, grouped ops, alltoall, reducescatter, barrier, Min/Max/Product/Adasum, sparse
allreduce, objects), a non-member refused with ValueError before the daemon sees it, one name in
two sets and in the global set at once, the odd set's 50 allreduces ending while the even ranks
sleep and call nothing, DistributedOptimizer within a set of 3, remove and add again."""

import re

import pytest


@pytest.mark.parametrize("nodes,local_size", [(2, 2), (4, 1)])
def test_process_sets(job_factory, nodes, local_size):
    # A collective that waited for a non-member would fail after SPARSYNC_TIMEOUT_S: keep it
    # short next to the workers' limit.
    job = job_factory(nodes, local_size, {"SPARSYNC_TIMEOUT_S": "40"})
    rcs = job.run_workers("process_sets.py", timeout_s=90, extra={"PS_SLEEP_S": "4"})
    assert rcs == [0] * job.size, "workers failed: %s\n%s" % (rcs, job.logs())
    for r in range(job.size):
        assert "PROCESS SETS OK" in job.worker_log(r), job.worker_log(r)
    # Each rank reports how long before the even ranks woke the odd set was done.
    ahead = re.search(r"ended ([0-9.]+) s before", job.worker_log(0))
    assert ahead and float(ahead.group(1)) > 0, job.worker_log(0)
    job.assert_clean_after_stop(job.stop())
