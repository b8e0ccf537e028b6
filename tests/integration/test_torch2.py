"""torch 2.x: torch.compile and AMP's GradScaler through DistributedOptimizer (real daemons).

Runs under the Python that runs pytest: tests/run.sh runs it in .venv-torch2 (PyPI's torch 2.x);
under Debian's torch 1.13 it is skipped."""

import pytest
import torch

TORCH2 = int(torch.__version__.split(".")[0]) >= 2


@pytest.mark.skipif(not TORCH2, reason="torch %s: needs torch 2.x" % torch.__version__)
def test_compile_and_grad_scaler(job_factory):
    job = job_factory(2, 1)
    rcs = job.run_workers("torch2_train.py", timeout_s=300)
    assert rcs == [0] * job.size, "workers failed: %s\n%s" % (rcs, job.logs())
    for r in range(job.size):
        assert "TORCH2 OK" in job.worker_log(r), job.worker_log(r)
    job.assert_clean_after_stop(job.stop())
