"""Horovod's capability checks for sparsync.torch, answered for this build and this machine.

sparsync exchanges with Gloo (always built, always in use). The daemon's NCCL transport and the
CUDA IPC intake are always compiled in and load libnccl / libcudart when they start, so "built"
here means "the library they load is present on this machine"; there is no MPI, DDL, oneCCL or
ROCm code at all.
"""

import ctypes
import os

from sparsync._torch_state import client


def _load(names):
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def nccl_built():
    """NCCL's version number (e.g. 22304, truthy, like Horovod's) when libnccl loads here
    (SPARSYNC_LIBNCCL, else libnccl.so.2, what the daemon's NCCL transport loads), else False."""
    lib = _load([os.environ.get("SPARSYNC_LIBNCCL") or "libnccl.so.2"])
    if lib is None:
        return False
    version = ctypes.c_int(0)
    try:
        if lib.ncclGetVersion(ctypes.byref(version)) != 0:
            return False
    except AttributeError:
        return False
    return version.value or True


def cuda_built():
    """True when the CUDA runtime the shim and daemon load for CUDA tensors (SPARSYNC_CUDART,
    else libcudart.so.13/.12/.so) is present here."""
    explicit = os.environ.get("SPARSYNC_CUDART", "")
    names = [explicit] if explicit else ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    return _load(names) is not None


def gloo_built():
    return True


def gloo_enabled():
    return True


def mpi_built():
    return False


def mpi_enabled():
    return False


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def is_homogeneous():
    """True when every node runs the same number of workers. The daemons share one
    SPARSYNC_LOCAL_SIZE, so it is checked rather than assumed: size == local_size * nodes."""
    w = client().world
    return w["size"] == w["local_size"] * w["num_nodes"]
