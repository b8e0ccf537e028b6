"""The CUDA IPC intake through real daemons, with the fake CUDA runtime in the daemons and the
workers (SPARSYNC_CUDART) and the fake NCCL in the daemons (SPARSYNC_LIBNCCL): "device"
gradients are averaged exactly and bit-identically, summed across a node's GPUs with NCCL when
each worker has a GPU of its own, and a missing runtime is a clear error, not a hang."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import WORKERS

sys.path.insert(0, str(WORKERS))
import cuda_ipc  # noqa: E402


def fake_library(daemon, name, env, what):
    """tests/unit/<name> of the build the daemon comes from, or $<env>; skips if not built."""
    path = os.environ.get(env) or str(Path(daemon).resolve().parents[1] / "tests" / "unit" / name)
    if not Path(path).is_file():
        pytest.skip("%s is not built: %s" % (what, path))
    return path


@pytest.fixture
def fake_cudart(daemon):
    return fake_library(daemon, "libsparsync_fake_cudart.so", "SPARSYNC_FAKE_CUDART",
                        "the fake CUDA runtime")


@pytest.fixture
def fake_nccl(daemon):
    return fake_library(daemon, "libsparsync_fake_nccl.so", "SPARSYNC_FAKE_NCCL", "the fake NCCL")


# (nodes, workers per node, each worker's device, how the node sums):
#   one GPU shared by two workers, summed on the host; two GPUs summed with NCCL; two nodes.
@pytest.mark.parametrize("nodes,local_size,device,local_reduce", [
    (1, 2, "1", "auto"), (1, 2, "local_rank", "auto"), (1, 2, "local_rank", "host"),
    (2, 1, "1", "auto")])
def test_cuda_tensors_are_averaged_exactly(job_factory, fake_cudart, fake_nccl, nodes,
                                           local_size, device, local_reduce):
    job = job_factory(nodes, local_size, {"SPARSYNC_CUDART": fake_cudart,
                                          "SPARSYNC_LIBNCCL": fake_nccl,
                                          "SPARSYNC_LOCAL_REDUCE": local_reduce,
                                          "SPARSYNC_COMPRESSOR": "none"})
    rcs = job.run_workers("cuda_ipc.py", ["reduce"], timeout_s=90,
                          extra={"SPARSYNC_TEST_FAKE_CUDART": fake_cudart,
                                 "SPARSYNC_TEST_CUDA_DEVICE": device})
    assert rcs == [0] * job.size, "workers failed: %s\n%s" % (rcs, job.logs())
    with_nccl = any("summing the node's CUDA tensors on devices 0,1 with NCCL" in
                    f.read_text(errors="replace") for f in job.tmp.glob("*.log"))
    assert with_nccl == (local_size == 2 and device == "local_rank" and local_reduce == "auto"), \
        job.logs()
    res = [dict(np.load(job.outdir / ("rank%d.npz" % r))) for r in range(job.size)]
    for key in res[0]:
        for r in range(1, job.size):
            assert res[r][key].tobytes() == res[0][key].tobytes(), \
                "%s differs between rank 0 and rank %d" % (key, r)
    for name, (op, wire, npdt, shape, offset, alloc) in cuda_ipc.TENSORS.items():
        for rnd in range(1, cuda_ipc.ROUNDS + 1):
            inputs = [cuda_ipc.value(r, rnd, shape, npdt).astype(np.float64)
                      for r in range(job.size)]
            expected = (np.sum(inputs, axis=0) / job.size).astype(npdt)
            np.testing.assert_array_equal(res[0]["%s.%d" % (name, rnd)], expected,
                                          err_msg="%s round %d" % (name, rnd))
            guard = res[0]["%s.%d.guard" % (name, rnd)]
            assert (guard == cuda_ipc.GUARD).all(), "bytes around %s were written" % name
    writes = len(cuda_ipc.TENSORS) * cuda_ipc.ROUNDS
    for r in range(job.size):
        # Each round the worker's stream waited on the daemon's done event, which was recorded.
        assert int(res[r]["waits"]) == writes
        # ... and recorded its ready event before each READY.
        assert int(res[r]["records"]) == writes
        assert str(res[r]["misuse"]) == "", "rank %d misused CUDA: %s" % (r, res[r]["misuse"])
    job.assert_clean_after_stop(job.stop())


def test_daemon_without_a_cuda_runtime_refuses_clearly(job_factory, fake_cudart):
    job = job_factory(1, 1, {"SPARSYNC_CUDART": "/nonexistent/libcudart.so.13"})
    rcs = job.run_workers("cuda_ipc.py", ["register"], timeout_s=60,
                          extra={"SPARSYNC_TEST_FAKE_CUDART": fake_cudart,
                                 "SPARSYNC_CUDART": fake_cudart})
    assert rcs == [0], job.logs()
    error = (job.outdir / "rank0.txt").read_text()
    assert "tensor 'gradient.w' is on CUDA device 0 but the daemon cannot take CUDA tensors" \
        in error, error
    assert "/nonexistent/libcudart.so.13" in error
    job.assert_clean_after_stop(job.stop())


def test_worker_without_a_cuda_runtime_fails_clearly(job_factory, fake_cudart):
    job = job_factory(1, 1, {"SPARSYNC_CUDART": fake_cudart})
    rcs = job.run_workers("cuda_ipc.py", ["register"], timeout_s=60,
                          extra={"SPARSYNC_TEST_FAKE_CUDART": fake_cudart,
                                 "SPARSYNC_CUDART": "/nonexistent/libcudart.so"})
    assert rcs == [0], job.logs()
    error = (job.outdir / "rank0.txt").read_text()
    assert "tensor 'gradient.w' is on CUDA device 0 but the sparsync client cannot use CUDA" \
        in error, error
    assert "SPARSYNC_CUDART names a file that cannot be loaded" in error
    job.assert_clean_after_stop(job.stop())


@pytest.fixture
def fake_sparsify(daemon):
    return fake_library(daemon, "libsparsync_fake_sparsify.so", "SPARSYNC_FAKE_SPARSIFY",
                        "the fake CUDA sparsification library")


def run_reduce(job_factory, fake_cudart, nodes, local_size, device, env):
    job = job_factory(nodes, local_size, env)
    rcs = job.run_workers("cuda_ipc.py", ["reduce"], timeout_s=90,
                          extra={"SPARSYNC_TEST_FAKE_CUDART": fake_cudart,
                                 "SPARSYNC_TEST_CUDA_DEVICE": device})
    assert rcs == [0] * job.size, "workers failed: %s\n%s" % (rcs, job.logs())
    res = [dict(np.load(job.outdir / ("rank%d.npz" % r))) for r in range(job.size)]
    logs = "".join(f.read_text(errors="replace") for f in job.tmp.glob("*.log"))
    for r in range(job.size):
        assert str(res[r]["misuse"]) == "", "rank %d misused CUDA: %s" % (r, res[r]["misuse"])
    job.assert_clean_after_stop(job.stop())
    return res, logs


# Top-k on the "GPU" (the fake sparsification library, on the fake CUDA runtime) against the same
# job sparsified on the host: one worker per node, two GPUs of a node summed with NCCL, and two
# workers sharing a GPU (summed on the host, so sparsified there too); values sent as float32 or
# as float16 (whose rounding goes back into the residual on the device).
@pytest.mark.parametrize("nodes,local_size,device,on_device,values", [
    (2, 1, "1", True, "float32"), (1, 2, "local_rank", True, "float32"),
    (1, 2, "1", False, "float32"), (1, 1, "0", True, "float32"), (2, 1, "1", True, "float16")])
def test_cuda_gradients_sparsified_on_the_device_match_the_host(
        job_factory, fake_cudart, fake_nccl, fake_sparsify, nodes, local_size, device, on_device,
        values):
    base = {"SPARSYNC_CUDART": fake_cudart, "SPARSYNC_LIBNCCL": fake_nccl,
            "SPARSYNC_SPARSIFY_LIBRARY": fake_sparsify, "SPARSYNC_COMPRESSOR": "topk",
            "SPARSYNC_DENSITY": "0.05", "SPARSYNC_MIN_COMPRESS_BYTES": "0",
            "SPARSYNC_VALUE_DTYPE": values}
    on_gpu, gpu_logs = run_reduce(job_factory, fake_cudart, nodes, local_size, device,
                                  {**base, "SPARSYNC_DEVICE_SPARSIFY": "auto"})
    on_host, host_logs = run_reduce(job_factory, fake_cudart, nodes, local_size, device,
                                    {**base, "SPARSYNC_DEVICE_SPARSIFY": "host"})
    assert ("top-k on CUDA device" in gpu_logs) == on_device, gpu_logs
    assert "top-k on CUDA device" not in host_logs
    size = nodes * local_size
    for key in on_host[0]:
        if key in ("waits", "records", "misuse"):
            continue
        for r in range(size):
            assert on_gpu[r][key].tobytes() == on_host[0][key].tobytes(), \
                "%s of rank %d differs between the device and the host path" % (key, r)
    # Sparsified for real: three rounds of a 1000-element gradient at density 0.05 with error
    # feedback are not the plain average.
    name = "gradient.fc1.weight"
    _, _, npdt, shape, _, _ = cuda_ipc.TENSORS[name]
    dense = np.mean([cuda_ipc.value(r, 1, shape, npdt).astype(np.float64) for r in range(size)],
                    axis=0)
    result = on_gpu[0]["%s.1" % name]
    assert np.count_nonzero(result) <= 0.05 * 1000 * nodes
    assert not np.allclose(result, dense)


def test_a_sparsification_library_that_finds_no_gpu_leaves_the_work_to_the_host(
        job_factory, daemon, fake_cudart):
    # The real library beside the daemon (built where nvcc is), here with no GPU to use: its
    # workspace cannot be made, so the gradients kept on the "device" go to the host after all.
    library = Path(daemon).resolve().parent / "libsparsync_sparsify_cuda.so"
    if not library.is_file():
        pytest.skip("the CUDA sparsification library is not built: %s" % library)
    base = {"SPARSYNC_CUDART": fake_cudart, "SPARSYNC_COMPRESSOR": "topk",
            "SPARSYNC_DENSITY": "0.05", "SPARSYNC_MIN_COMPRESS_BYTES": "0"}
    tried, tried_logs = run_reduce(job_factory, fake_cudart, 2, 1, "1", base)
    on_host, _ = run_reduce(job_factory, fake_cudart, 2, 1, "1",
                            {**base, "SPARSYNC_DEVICE_SPARSIFY": "host"})
    assert "device sparsification: using %s" % library in tried_logs, tried_logs
    assert "sparsified on the host from now on" in tried_logs, tried_logs
    assert "top-k on CUDA device" not in tried_logs
    for key in on_host[0]:
        if key not in ("waits", "records", "misuse"):
            assert tried[0][key].tobytes() == on_host[0][key].tobytes(), key
