"""allreduce / allgather / broadcast through real daemons: 1, 2, 4 nodes x 1-2 workers."""

import sys

import numpy as np
import pytest

from conftest import WORKERS

sys.path.insert(0, str(WORKERS))
import cases  # noqa: E402

TOLERANCE = {"float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14), "float16": (2e-3, 2e-3),
             "bfloat16": (8e-3, 8e-3)}


def load_results(job):
    return [dict(np.load(job.outdir / ("rank%d.npz" % r))) for r in range(job.size)]


@pytest.mark.parametrize("nodes,local_size", [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2)])
def test_collectives(job_factory, nodes, local_size):
    job = job_factory(nodes, local_size)
    n = job.size
    rcs = job.run_workers("collectives.py", timeout_s=150)
    assert rcs == [0] * n, "workers failed: %s\n%s" % (rcs, job.logs())
    results = load_results(job)

    # Bit-identical on every worker, for every output.
    for key in results[0]:
        for r in range(1, n):
            assert results[r][key].tobytes() == results[0][key].tobytes(), \
                "%s differs between rank 0 and rank %d" % (key, r)

    res = results[0]
    for case, (shape, dtype) in cases.ALLREDUCE_CASES.items():
        inputs = [cases.allreduce_input(case, r).astype(np.float64) for r in range(n)]
        expected = np.sum(inputs, axis=0) / n
        got = res["ar." + case]
        assert got.shape == tuple(shape)
        rtol, atol = TOLERANCE[dtype]
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=rtol, atol=atol,
                                   err_msg="allreduce %s on %d nodes" % (case, nodes))

    x = [cases.allreduce_input("f32_1000", r).astype(np.float64) for r in range(n)]
    np.testing.assert_allclose(res["ar.again"], 2 * np.mean(x, axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res["ar.sum_noname"], np.sum(x, axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(res["ar.int64_sum"], np.arange(5) * sum(range(1, n + 1)))
    np.testing.assert_allclose(res["ar.async"], np.full(3, np.mean(range(n))), rtol=1e-6)
    f16 = np.mean([cases.allreduce_input("f32_7", r) for r in range(n)], axis=0)
    np.testing.assert_allclose(res["ar.fp16_compression"], f16, atol=3e-3)

    np.testing.assert_array_equal(
        res["ag"], np.concatenate([cases.allgather_input(r) for r in range(n)]))
    np.testing.assert_array_equal(res["ag.noname"], np.repeat(np.arange(n), 2))
    np.testing.assert_array_equal(res["bc"], cases.broadcast_input(n - 1))
    assert int(res["bc.obj"]) == n - 1
    np.testing.assert_array_equal(res["ag.obj"], np.arange(n))

    job.assert_clean_after_stop(job.stop())
