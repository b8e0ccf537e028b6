"""sparsync.tensorflow's connection and world: init, shutdown, rank, size, ... and the
capability checks Horovod has."""

import atexit
import os
import threading

from sparsync import _client as C
from sparsync import _wire as W
from sparsync._errors import SparsyncError
from sparsync._world import world_accessors
from sparsync.tensorflow import _ops


Average = W.REDUCE_AVERAGE
Sum = W.REDUCE_SUM
Adasum = 2  # accepted by name for compatibility; not supported
_TIMELINE_ANSWER_S = 30.0  # the daemon answers at once; creating the file may take a moment


class _State:
    """The process's connection, from init() to shutdown(); `lock` guards both fields."""

    def __init__(self):
        self.lock = threading.Lock()
        self.world = None
        self.atexit_registered = False


_state = _State()


def init(comm=None, process_sets=None):
    """Connects this process's sparsync ops to its node's sparsyncd (SPARSYNC_SOCKET).
    Idempotent. Every SPARSYNC_* setting of a worker is read here; the op library reads none."""
    if comm is not None or process_sets is not None:
        raise SparsyncError("init: comm and process_sets are not supported by sparsync")
    with _state.lock:
        if _state.world is not None:
            return
        settings = C.WorkerSettings()
        lib = _ops.library()
        world = lib.connect(settings)
        try:
            settings.check_rank(world)
        except SparsyncError:
            lib.shutdown()
            raise
        _state.world = world
        if not _state.atexit_registered:
            atexit.register(shutdown)
            _state.atexit_registered = True


def shutdown():
    """Fails what is still in flight, releases every shared region and says goodbye."""
    with _state.lock:
        if _state.world is None:
            return
        _state.world = None
        _ops.library().shutdown()


def is_initialized():
    return _state.world is not None


_world, rank, size, local_rank, local_size, cross_rank, cross_size = world_accessors(_state)


def start_timeline(file_path, mark_cycles=False):
    """Starts the daemon's timeline, a Chrome trace of where each tensor and merge group spends
    its time (docs/operations.md), into `file_path` on the daemon's machine (made absolute
    here); "{node}" in it stands for the node's rank, and without it only node 0 records. As
    sparsync.torch.start_timeline; `mark_cycles` has no effect."""
    path = os.fsencode(os.path.abspath(os.fspath(file_path)))
    _world("rank")  # ValueError before init()
    _ops.library().timeline(path, _TIMELINE_ANSWER_S)


def stop_timeline():
    """Stops the daemon's timeline and closes its file. Without one, nothing."""
    _world("rank")
    _ops.library().timeline(b"", _TIMELINE_ANSWER_S)


# Capabilities, as Horovod reports them. The daemons exchange with Gloo (NCCL only between GPUs
# inside sparsyncd, not in this shim); this op library has CPU kernels only.
def mpi_threads_supported():
    return False


def mpi_built():
    return False


def mpi_enabled():
    return False


def gloo_built():
    return True


def gloo_enabled():
    return True


def nccl_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return False


def rocm_built():
    return False

