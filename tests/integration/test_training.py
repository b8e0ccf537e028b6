"""DistributedOptimizer on 4 nodes equals single-process training on the concatenated batch."""

import sys

import numpy as np
import torch

from conftest import WORKERS

sys.path.insert(0, str(WORKERS))
import train_model  # noqa: E402


def reference_parameters(size):
    model = train_model.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=train_model.LR, momentum=0.9)
    for step in range(train_model.STEPS):
        xs, ys = zip(*(train_model.batch(step, r) for r in range(size)))
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def test_distributed_optimizer_matches_single_process(job_factory):
    job = job_factory(4, 1)
    rcs = job.run_workers("train.py", timeout_s=150)
    assert rcs == [0] * 4, "workers failed: %s\n%s" % (rcs, job.logs())
    results = [dict(np.load(job.outdir / ("rank%d.npz" % r))) for r in range(4)]
    ref = reference_parameters(4)
    for key, want in ref.items():
        for r in range(4):
            np.testing.assert_allclose(results[r][key], want, rtol=0, atol=1e-5,
                                       err_msg="%s on rank %d after %d steps"
                                       % (key, r, train_model.STEPS))
            assert results[r][key].tobytes() == results[0][key].tobytes()

    # The branch only rank 0 used: everybody holds rank 0's gradient / 4; trunk: the full one.
    ones = np.ones((2, 4), dtype=np.float32)
    branch_grad = np.tile(ones.sum(0), (4, 1)) / 4
    for r in range(4):
        np.testing.assert_allclose(results[r]["branch_grad"], branch_grad, rtol=1e-6)
        np.testing.assert_allclose(results[r]["trunk_grad"], np.tile(ones.sum(0), (4, 1)),
                                   rtol=1e-6)
    job.assert_clean_after_stop(job.stop())
    # A job that ended well says so: each daemon's stop is no failure on node 0, and a poll cut
    # short by the daemon's own stop is no warning.
    for i in range(4):
        log = (job.tmp / ("d%d.log" % i)).read_text(errors="replace")
        bad = [line for line in log.splitlines()
               if "[error]" in line or "coordinator poll failed" in line]
        assert not bad, "node %d's daemon, at the end of a job that went well:\n%s" % (
            i, "\n".join(bad))
