"""sparsync.ddp: DDP's buckets through the daemons (4 processes on 4 nodes)."""

import pytest

from conftest import free_port


@pytest.mark.parametrize("mode,env", [("none", {"SPARSYNC_COMPRESSOR": "none"}),
                                      ("topk", {"SPARSYNC_MIN_COMPRESS_BYTES": "1024"})])
def test_ddp_hook(job_factory, mode, env):
    job = job_factory(4, 1, env)
    rcs = job.run_workers("ddp_hook.py", [mode], timeout_s=240,
                          extra={"DDP_PORT": str(free_port())})
    assert rcs == [0] * job.size, "workers failed: %s\n%s" % (rcs, job.logs())
    for r in range(job.size):
        assert "DDP HOOK OK" in job.worker_log(r), job.worker_log(r)
    job.assert_clean_after_stop(job.stop())
