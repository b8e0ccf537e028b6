"""DistributedOptimizer with gradients in shared memory (no copy in or out) gives the same bits
as its copying path, for every way scripts drive it (tests/integration/workers/zero_copy.py)."""

import numpy as np
import pytest

SCENARIOS = ["plain", "default", "to_none", "passes", "clip", "assigned", "layouts", "dtype", "late_group"]
# Parameters whose gradient cannot live in shared memory as it is (their layout), or that had no
# gradient of their own yet.
NOT_SHARED = {"layouts": {"conv.weight", "fc.weight"}, "late_group": set()}
IN_PLACE_FROM_STEP_1 = ["plain", "default", "passes", "clip", "layouts"]


@pytest.mark.parametrize("compressor", ["none", "topk"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_shared_gradients_give_the_copying_paths_bits(job_factory, scenario, compressor):
    # fixed:4: every tensor its own merge group from the first step, so both runs group alike
    # (warm-up buckets depend on timing, and top-k on the grouping).
    job = job_factory(2, 1, {"SPARSYNC_COMPRESSOR": compressor, "SPARSYNC_DENSITY": "0.1",
                             "SPARSYNC_MIN_COMPRESS_BYTES": "0", "SPARSYNC_MERGE": "fixed:4"})
    rcs = job.run_workers("zero_copy.py", [scenario], timeout_s=120)
    assert rcs == [0, 0], "workers failed: %s\n%s" % (rcs, job.logs())
    res = [dict(np.load(job.outdir / ("rank%d.npz" % r))) for r in range(2)]
    for r in range(2):
        keys = sorted(k[len("zero_copy."):] for k in res[r] if k.startswith("zero_copy."))
        assert keys, "nothing recorded"
        for key in keys:
            a, b = res[r]["zero_copy." + key], res[r]["copying." + key]
            assert a.dtype == b.dtype and a.shape == b.shape, key
            assert a.tobytes() == b.tobytes(), "rank %d %s: the shared path differs" % (r, key)
            assert a.tobytes() == res[0]["zero_copy." + key].tobytes(), "ranks differ: " + key
        shared = set(res[r]["shared"].tolist())
        # keys: "<step>.p.<parameter>" and "<step>.g.<parameter>"
        everything = {k.split(".", 2)[2] for k in keys if k.split(".", 2)[1] == "p"}
        expected = everything - NOT_SHARED.get(scenario, set())
        assert shared == expected, (scenario, sorted(shared), sorted(expected))
        assert list(res[r]["shared_when_copying"]) == [], "the copying run shared memory"
        # Backward accumulated into shared memory (no copy in) from the second step on, except
        # where the script replaced the gradients.
        if scenario in IN_PLACE_FROM_STEP_1:
            assert set(res[r]["in_place"].tolist()) == expected, (scenario, res[r]["in_place"])
        elif scenario in ("to_none", "assigned"):
            assert list(res[r]["in_place"]) == [], (scenario, res[r]["in_place"])
        for key in ("in_flight_error", "in_flight_error_copied"):
            error = str(res[r][key])
            assert "gradient of 'fc.weight' was modified while its reduction was in flight" \
                in error, (key, error)
    job.assert_clean_after_stop(job.stop())
