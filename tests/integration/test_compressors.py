"""Every compressor on 4 nodes: all workers end with bit-identical parameters and the loss falls."""

import json

import numpy as np
import pytest

COMPRESSORS = ["topk", "randomk", "threshold", "gaussiank", "wangni", "dgc", "gtopk"]


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_sparse_training_is_identical_everywhere_and_learns(job_factory, compressor):
    # Density 0.05 with groups from 4 KiB: the 66 KiB first layer is compressed, biases stay dense.
    job = job_factory(4, 1, {"SPARSYNC_COMPRESSOR": compressor, "SPARSYNC_DENSITY": "0.05",
                             "SPARSYNC_MIN_COMPRESS_BYTES": "4KiB"})
    rcs = job.run_workers("train_sparse.py", timeout_s=150)
    assert rcs == [0] * 4, "workers failed: %s\n%s" % (rcs, job.logs())
    params = [dict(np.load(job.outdir / ("rank%d.npz" % r))) for r in range(4)]
    for key in params[0]:
        for r in range(1, 4):
            assert params[r][key].tobytes() == params[0][key].tobytes(), (compressor, key, r)
    losses = [json.loads((job.outdir / ("rank%d.json" % r)).read_text()) for r in range(4)]
    first = np.mean([l[0] for l in losses])
    last = np.mean([l[-1] for l in losses])
    # The plan follows measured times, so the merge groups, and with them what the threshold
    # compressors keep, vary between runs: gaussiank ended at 0.90-0.96 of the first loss in 15
    # runs (topk 0.83, dgc 0.35-0.40). A compressor whose update never arrives stays at 1.0.
    assert last < 0.98 * first, "%s did not learn: loss %.4f -> %.4f" % (compressor, first, last)
    log = job.logs()
    assert "compressor " + compressor in log, "the daemons did not run " + compressor
    job.assert_clean_after_stop(job.stop())


def test_sparsify_argument_overrides_the_daemons_compressor(job_factory):
    # Daemons run dense; the optimizer asks for top-k: the result differs from dense training,
    # is still identical everywhere, and explicit allreduce stays exact (checked by the worker).
    job = job_factory(2, 1, {"SPARSYNC_MIN_COMPRESS_BYTES": "4KiB"})
    rcs = job.run_workers("train_sparse.py", extra={"SPARSIFY": "topk:0.05"}, timeout_s=150)
    assert rcs == [0, 0], "workers failed: %s\n%s" % (rcs, job.logs())
    sparse = [dict(np.load(job.outdir / ("rank%d.npz" % r))) for r in range(2)]
    rcs = job.run_workers("train_sparse.py", timeout_s=150)
    assert rcs == [0, 0], "workers failed: %s\n%s" % (rcs, job.logs())
    dense = [dict(np.load(job.outdir / ("rank%d.npz" % r))) for r in range(2)]
    key = "0.weight"
    assert sparse[0][key].tobytes() == sparse[1][key].tobytes()
    assert not np.array_equal(sparse[0][key], dense[0][key]), "sparsify= had no effect"


@pytest.mark.parametrize("compressor", ["topk", "dgc"])
def test_a_second_run_on_the_same_daemons_starts_afresh(job_factory, compressor):
    # What error feedback (and DGC's momentum and accumulation) kept for a tensor goes when its
    # workers leave, so the same script run again ends with the same parameters, bit for bit. One
    # gradient tensor, so that no merge group depends on timing.
    job = job_factory(2, 1, {"SPARSYNC_COMPRESSOR": compressor, "SPARSYNC_DENSITY": "0.01",
                             "SPARSYNC_MIN_COMPRESS_BYTES": "4KiB"})
    runs = []
    for _ in range(2):
        rcs = job.run_workers("train_sparse.py", extra={"ONE_TENSOR": "1"}, timeout_s=150)
        assert rcs == [0, 0], "workers failed: %s\n%s" % (rcs, job.logs())
        runs.append(dict(np.load(job.outdir / "rank0.npz")))
    for key in runs[0]:
        assert runs[1][key].tobytes() == runs[0][key].tobytes(), (
            "%s: the second run's %s differs: it inherited state from the first" % (compressor, key))
