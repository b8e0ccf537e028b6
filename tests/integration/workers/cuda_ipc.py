"""Worker of test_cuda_ipc.py: CUDA tensors through the CUDA IPC intake, with "device" memory
from the fake CUDA runtime (tests/support/fake_cudart) that SPARSYNC_TEST_FAKE_CUDART names.

mode "reduce": 3 rounds of a gradient and an explicit allreduce that sit inside larger
allocations; saves every round's result and the guard bytes around each tensor.
mode "register": one registration, whose error (if any) is saved as text.
SPARSYNC_TEST_CUDA_DEVICE: the "GPU" of the worker's tensors, a number or "local_rank"
(default 1).
"""

import ctypes
import os
import sys

import numpy as np

from sparsync import _client as C
from sparsync._errors import SparsyncError

H2D, D2H = 1, 2
GUARD = 0xAB
ROUNDS = 3
# name -> (op, dtype, numpy dtype, shape, offset in its allocation, allocation bytes)
TENSORS = {
    "gradient.fc1.weight": (C.OP_GRADIENT, C.FLOAT32, np.float32, (40, 25), 512, 8192),
    "allreduce.stats": (C.OP_ALLREDUCE, C.FLOAT64, np.float64, (3, 5), 64, 256),
}


def value(rank, rnd, shape, dtype):
    n = int(np.prod(shape))
    x = np.sin(np.arange(n, dtype=np.float64) * (rank + 1.3) + rnd) * (10.0 ** rank)
    return x.astype(dtype).reshape(shape)


class FakeDevice:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        for f in ("cudaMalloc", "cudaMemcpy", "cudaStreamCreateWithFlags", "cudaFree"):
            getattr(self.lib, f).restype = ctypes.c_int
        self.lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_int]
        self.lib.sparsync_fake_cuda_journal.restype = ctypes.c_size_t
        self.lib.sparsync_fake_cuda_journal.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self.lib.sparsync_fake_cuda_misuse.restype = ctypes.c_size_t
        self.lib.sparsync_fake_cuda_misuse.argtypes = [ctypes.c_char_p, ctypes.c_size_t]

    def malloc(self, nbytes):
        p = ctypes.c_void_p()
        assert self.lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes)) == 0
        return p.value

    def write(self, dst, array):
        b = np.ascontiguousarray(array)
        assert self.lib.cudaMemcpy(dst, b.ctypes.data, b.nbytes, H2D) == 0

    def read(self, src, nbytes):
        out = np.empty(nbytes, dtype=np.uint8)
        assert self.lib.cudaMemcpy(out.ctypes.data, src, nbytes, D2H) == 0
        return out

    def stream(self):
        s = ctypes.c_void_p()
        assert self.lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
        return s.value

    def text(self, fn):
        buf = ctypes.create_string_buffer(1 << 16)
        fn(buf, len(buf))
        return buf.value.decode()


def main():
    mode = sys.argv[1]
    rank = int(os.environ["SPARSYNC_RANK"])
    out = os.path.join(os.environ["OUT_DIR"], "rank%d" % rank)
    dev = FakeDevice(os.environ["SPARSYNC_TEST_FAKE_CUDART"])
    client = C.Client(os.environ["SPARSYNC_SOCKET"], os.environ.get("SPARSYNC_JOB_TOKEN") or None,
                      int(os.environ["SPARSYNC_LOCAL_RANK"]), 30.0,
                      os.environ.get("SPARSYNC_CUDART", ""))  # as sparsync.torch.init passes it
    if mode == "register":
        base = dev.malloc(4096)
        try:
            client.register_cuda("gradient.w", C.OP_GRADIENT, C.FLOAT32, (16,), 0, base + 128)
            error = ""
        except SparsyncError as e:
            error = str(e)
        with open(out + ".txt", "w") as f:
            f.write(error)
        client.close()
        return

    device = os.environ.get("SPARSYNC_TEST_CUDA_DEVICE", "1")
    device = int(os.environ["SPARSYNC_LOCAL_RANK"]) if device == "local_rank" else int(device)
    assert dev.lib.cudaSetDevice(device) == 0
    stream = dev.stream()
    regs, allocations = {}, {}
    for name, (op, wire, npdt, shape, offset, alloc) in TENSORS.items():
        base = dev.malloc(alloc)
        dev.write(base, np.full(alloc, GUARD, dtype=np.uint8))
        allocations[name] = base
        regs[name] = client.register_cuda(name, op, wire, shape, device, base + offset)
    results = {}
    for rnd in range(1, ROUNDS + 1):
        for name, (op, wire, npdt, shape, offset, alloc) in TENSORS.items():
            dev.write(allocations[name] + offset, value(rank, rnd, shape, npdt))
            client.post(regs[name], stream if rnd % 2 else None)
        for name, (op, wire, npdt, shape, offset, alloc) in TENSORS.items():
            client.wait(regs[name], 60.0, stream=stream)
            raw = dev.read(allocations[name], alloc)
            n = int(np.prod(shape)) * np.dtype(npdt).itemsize
            results["%s.%d" % (name, rnd)] = raw[offset:offset + n].view(npdt).reshape(shape)
            results["%s.%d.guard" % (name, rnd)] = np.concatenate([raw[:offset], raw[offset + n:]])
    journal = dev.text(dev.lib.sparsync_fake_cuda_journal)
    results["waits"] = np.array(sum(line.startswith("wait ") for line in journal.splitlines()))
    results["records"] = np.array(sum(line.startswith("record ") for line in journal.splitlines()))
    for reg in regs.values():
        client.unregister(reg)
    client.close()
    results["misuse"] = np.array(dev.text(dev.lib.sparsync_fake_cuda_misuse))
    np.savez(out + ".npz", **results)


if __name__ == "__main__":
    main()
