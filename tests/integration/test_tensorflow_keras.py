"""Training through sparsync.tensorflow: a 4-node Keras fit with compressor none equals one
process training on the concatenated batches; a DistributedGradientTape with the daemon's top-k
trains with identical weights on every rank."""

import subprocess

import numpy as np

from test_tensorflow import TF_PYTHON, TF_START_S, WORKERS, requires_tf, run_tf_workers, tf_env


def arrays(path):
    data = np.load(path)
    return [data["arr_%d" % i] for i in range(len([k for k in data if k.startswith("arr_")]))]


@requires_tf
def test_keras_fit_on_4_nodes_equals_one_process_on_the_whole_batch(job_factory):
    job = job_factory(4, 1)  # SPARSYNC_COMPRESSOR=none: the exact dense path
    rcs = run_tf_workers(job, "tf_keras_fit.py", timeout_s=150)
    assert rcs == [0] * 4, "workers failed: %s\n%s" % (rcs, job.logs())
    single = subprocess.run([str(TF_PYTHON), str(WORKERS / "tf_keras_fit.py"), "single"],
                            env=tf_env(job.worker_env(0)), capture_output=True, text=True,
                            timeout=TF_START_S + 120)
    assert single.returncode == 0, single.stdout + single.stderr
    reference = arrays(job.outdir / "single.npz")
    ref_loss = float(np.load(job.outdir / "single.npz")["loss"])
    for r in range(4):
        weights = arrays(job.outdir / ("rank%d.npz" % r))
        assert len(weights) == len(reference) == 4
        for w, ref in zip(weights, reference):
            np.testing.assert_allclose(w, ref, rtol=0, atol=1e-5,
                                       err_msg="rank %d after 20 steps" % r)
        # MetricAverageCallback: the epoch's loss averaged over the ranks is the global one.
        loss = float(np.load(job.outdir / ("rank%d.npz" % r))["loss"])
        assert abs(loss - ref_loss) < 1e-5, (r, loss, ref_loss)
    # Loaded with hvd.load_model and trained on: still one model on every rank.
    loaded = [arrays(job.outdir / ("loaded%d.npz" % r)) for r in range(4)]
    for r in range(1, 4):
        for a, b in zip(loaded[0], loaded[r]):
            assert a.tobytes() == b.tobytes(), "rank %d differs after load_model and fit" % r
    assert any(not np.allclose(a, b) for a, b in zip(loaded[0], reference)), \
        "the loaded model did not train"
    job.assert_clean_after_stop(job.stop())


@requires_tf
def test_tape_with_topk_trains_identically_on_every_rank(job_factory):
    # Top-k on every group, however small (the default sends groups under 64 KiB dense).
    job = job_factory(3, 1, {"SPARSYNC_MIN_COMPRESS_BYTES": "0"})
    n = job.size
    rcs = run_tf_workers(job, "tf_tape_topk.py", timeout_s=150)
    assert rcs == [0] * n, "workers failed: %s\n%s" % (rcs, job.logs())
    results = [dict(np.load(job.outdir / ("rank%d.npz" % r))) for r in range(n)]
    for key in results[0]:
        if key == "losses":
            continue  # each rank's loss is on its own data
        for r in range(1, n):
            assert results[r][key].tobytes() == results[0][key].tobytes(), \
                "%s differs between rank 0 and rank %d" % (key, r)
    # Sparsified: each node sends 5 % of a merge group (at most all of the model's gradients),
    # so at most n x 5 % of the model's size is non-zero in the first kernel's gradient (a dense
    # one has no zeros: tanh).
    first = results[0]["first_grad"]
    total = sum(v.size for k, v in results[0].items() if k.startswith("w"))
    assert np.count_nonzero(first) <= n * 0.05 * total + n, (np.count_nonzero(first), first.size)
    assert np.count_nonzero(first) > 0
    for r in range(n):
        losses = results[r]["losses"]
        assert losses[-1] < losses[0], (r, losses)
    job.assert_clean_after_stop(job.stop())


@requires_tf
def test_learning_rate_callbacks_set_the_rate_of_each_batch(job_factory):
    job = job_factory(2, 1)
    rcs = run_tf_workers(job, "tf_callbacks.py")
    assert rcs == [0, 0], "workers failed: %s\n%s" % (rcs, job.logs())
    res = dict(np.load(job.outdir / "rank0.npz"))
    steps, lr, n = 4, 0.8, 2
    # Warm-up over 2 epochs from lr / n to lr, a little every batch; then lr.
    expected = [lr / n * ((e + b / steps) * (n - 1) / 2 + 1) for e in range(2) for b in range(steps)]
    expected += [lr] * (2 * steps)
    np.testing.assert_allclose(res["warmup"], expected, rtol=1e-6)
    # Staircase: epoch 0 keeps the optimizer's rate, epochs 1 and 2 take lr * 0.5 ** epoch, and
    # epoch 3 (past end_epoch) keeps the last one set.
    expected = [lr] * steps + [lr / 2] * steps + [lr / 4] * steps + [lr / 4] * steps
    np.testing.assert_allclose(res["stairs"], expected, rtol=1e-6)
    job.assert_clean_after_stop(job.stop())
