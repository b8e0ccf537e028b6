"""ctypes binding of the C ABI in shims/client/include/sparsync/client.h.

Framework-neutral: tensors are raw shared regions, exposed as numpy arrays. The PyTorch shim
(sparsync.torch) and the tests build on this. Calls into the library release the GIL.
"""

import ctypes
import math
import mmap
import os
import threading
import time

import numpy as np

from sparsync._errors import SparsyncError
from sparsync._paths import find_client_library

# The wire values this binding's callers use (the tests, bench/cluster), from sparsync._wire.
from sparsync._wire import (  # noqa: F401
    BFLOAT16,
    COMPRESSORS,
    ERR_TIMEOUT,
    FLOAT16,
    FLOAT32,
    FLOAT64,
    INT32,
    INT64,
    ITEMSIZE,
    MAX_DIMS,
    MEMORY_CUDA,
    MEMORY_HOST,
    OK,
    OP_ALLGATHER,
    OP_ALLREDUCE,
    OP_BROADCAST,
    OP_GRADIENT,
    REDUCE_AVERAGE,
    REDUCE_SUM,
    STATUS_NAMES,
    UINT8,
)

NUMPY_DTYPES = {np.dtype(np.float32): FLOAT32, np.dtype(np.float64): FLOAT64,
                np.dtype(np.float16): FLOAT16, np.dtype(np.int32): INT32,
                np.dtype(np.int64): INT64, np.dtype(np.uint8): UINT8}


class _World(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("local_rank", ctypes.c_uint32), ("local_size", ctypes.c_uint32),
                ("node_rank", ctypes.c_uint32), ("num_nodes", ctypes.c_uint32)]


class _ConnectOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("local_rank", ctypes.c_uint32),
                ("socket_path", ctypes.c_char_p), ("job_token", ctypes.c_char_p),
                ("timeout_s", ctypes.c_double), ("cuda_runtime", ctypes.c_char_p),
                ("job_token_file", ctypes.c_char_p)]


class _TensorSpec(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("op", ctypes.c_int), ("dtype", ctypes.c_int),
                ("reduce_op", ctypes.c_int), ("root_rank", ctypes.c_int32),
                ("ndim", ctypes.c_uint32), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("compressor", ctypes.c_int), ("density", ctypes.c_float),
                ("num_members", ctypes.c_uint32), ("members", ctypes.POINTER(ctypes.c_int32)),
                ("group", ctypes.c_uint64), ("group_size", ctypes.c_uint32)]


_lib = None
_lib_lock = threading.Lock()


def _library():
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = find_client_library()
        if path is None:
            raise SparsyncError(
                "libsparsync_client.so not found: set SPARSYNC_CLIENT_LIB, or build the project "
                "(cmake -S . -B build -G Ninja && cmake --build build)")
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise SparsyncError("cannot load the sparsync client library %s: %s" % (path, e))
        c = ctypes
        sig = {
            "sparsync_connect_with_options": [c.POINTER(_ConnectOptions),
                                              c.POINTER(c.c_void_p), c.c_char_p, c.c_size_t],
            "sparsync_close": [c.c_void_p],
            "sparsync_get_world": [c.c_void_p, c.POINTER(_World)],
            "sparsync_register_tensor": [c.c_void_p, c.POINTER(_TensorSpec),
                                         c.POINTER(c.c_uint32), c.POINTER(c.c_void_p),
                                         c.POINTER(c.c_uint64)],
            "sparsync_register_tensor_fd": [c.c_void_p, c.POINTER(_TensorSpec),
                                            c.POINTER(c.c_uint32), c.POINTER(c.c_int),
                                            c.POINTER(c.c_uint64)],
            "sparsync_post_ready": [c.c_void_p, c.c_uint32],
            "sparsync_wait_done": [c.c_void_p, c.c_uint32, c.c_double],
            "sparsync_allgather_result": [c.c_void_p, c.c_uint32, c.POINTER(c.c_void_p),
                                          c.POINTER(c.c_uint64), c.POINTER(c.c_int64)],
            "sparsync_unregister_tensor": [c.c_void_p, c.c_uint32],
            "sparsync_register_cuda_tensor": [c.c_void_p, c.POINTER(_TensorSpec), c.c_int32,
                                              c.c_void_p, c.POINTER(c.c_uint32)],
            "sparsync_post_ready_cuda": [c.c_void_p, c.c_uint32, c.c_void_p],
            "sparsync_wait_done_cuda": [c.c_void_p, c.c_uint32, c.c_double, c.c_void_p],
            "sparsync_timeline": [c.c_void_p, c.c_char_p, c.c_double],
            "sparsync_join": [c.c_void_p, c.c_double, c.POINTER(c.c_int32)],
            "sparsync_last_error": [c.c_void_p],
        }
        for name, args in sig.items():
            f = getattr(lib, name)
            f.argtypes = args
            f.restype = c.c_int
        lib.sparsync_close.restype = None
        lib.sparsync_last_error.restype = c.c_char_p
        _lib = lib
        return lib


class Registered:
    """A registered tensor: its id and its shared region.

    A host tensor's region is this process's own mapping of the daemon's memfd (`region`, an
    mmap): arrays and tensors made over it stay valid as long as they exist, also after the
    tensor is unregistered or the connection closed (they just no longer reach a daemon). For a
    CUDA tensor `device` is its CUDA device and `address` its device pointer (never to be read
    from the host); for a host tensor `device` is None."""

    __slots__ = ("id", "name", "op", "dtype", "shape", "numel", "address", "nbytes", "spec",
                 "device", "buffer", "region", "owner", "_raw")

    def __init__(self, tid, name, op, dtype, shape, address, nbytes, device=None, region=None):
        self.id, self.name, self.op, self.dtype = tid, name, op, dtype
        self.shape, self.address, self.nbytes = tuple(shape), address, nbytes
        self.numel = math.prod(self.shape)  # the shape never changes: a new spec registers anew
        self._raw = None  # raw()'s array, made once (the region is mapped once, in register)
        self.device = device
        self.region = region
        self.spec = None  # free for the caller (the torch shim keeps its cache key here)
        self.buffer = None  # free for the caller (the torch shim keeps a CUDA tensor's buffer)
        self.owner = None  # free for the caller (the torch shim: a weakref to the tensor living
                           # in the region)

    def raw(self):
        """The data bytes of the region as a writable uint8 array (numel * itemsize bytes)."""
        if self._raw is None:
            nbytes = self.numel * ITEMSIZE[self.dtype]
            if self.region is None or nbytes == 0:
                return np.zeros(0, dtype=np.uint8)
            self._raw = np.frombuffer(self.region, dtype=np.uint8, count=nbytes)
        return self._raw

    def array(self, np_dtype):
        """The region as a numpy array of `np_dtype` (same item size as the wire dtype)."""
        return self.raw().view(np_dtype).reshape(self.shape)


def _bytes_or_null(text):
    return None if text is None else text.encode()


def _raw_array(address, nbytes):
    if nbytes == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))


class Client:
    """One connection to the node's sparsyncd.

    `job_token`: the job's token (SPARSYNC_JOB_TOKEN, which the caller reads); None reads it from
    `job_token_file` (SPARSYNC_JOB_TOKEN_FILE) or, when that is None too, from the file the
    daemon leaves beside its socket. `cuda_runtime`: the CUDA runtime library to load for CUDA
    tensors (SPARSYNC_CUDART, which the caller reads); "" searches libcudart.so.13, .so.12 and
    .so."""

    def __init__(self, socket_path, job_token=None, local_rank=0, connect_timeout_s=10.0,
                 cuda_runtime="", job_token_file=None):
        lib = _library()
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(1024)
        options = _ConnectOptions(ctypes.sizeof(_ConnectOptions), int(local_rank),
                                  socket_path.encode(), _bytes_or_null(job_token),
                                  float(connect_timeout_s), (cuda_runtime or "").encode(),
                                  _bytes_or_null(job_token_file))
        s = lib.sparsync_connect_with_options(ctypes.byref(options), ctypes.byref(handle), err,
                                              len(err))
        if s != OK:
            raise SparsyncError(err.value.decode(errors="replace"), s)
        self._lib = lib
        self._h = handle
        self.socket_path = socket_path
        w = _World()
        self._check(lib.sparsync_get_world(self._h, ctypes.byref(w)))
        self.world = {f: getattr(w, f) for f, _ in _World._fields_}

    def _check(self, status, context=None):
        if status == OK:
            return
        msg = self._lib.sparsync_last_error(self._h) if self._h else b""
        msg = (msg or b"").decode(errors="replace") or STATUS_NAMES.get(status, str(status))
        if context:
            msg = "%s: %s" % (context, msg)
        raise SparsyncError(msg, status)

    def _require_open(self):
        if not self._h:
            raise SparsyncError("sparsync client is closed (call init() first)")

    @staticmethod
    def _spec(name, op, dtype, shape, reduce_op, root_rank, compressor, density, members, group):
        shape = tuple(int(d) for d in shape)
        if len(shape) > MAX_DIMS:
            raise SparsyncError("tensor '%s' has %d dimensions; at most %d are supported"
                                % (name, len(shape), MAX_DIMS))
        dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        members = () if members is None else tuple(int(r) for r in members)
        ranks = (ctypes.c_int32 * max(len(members), 1))(*members)
        key, count = (0, 0) if group is None else (int(group[0]), int(group[1]))
        spec = _TensorSpec(name.encode(), op, dtype, reduce_op, root_rank, len(shape), dims,
                           compressor, density, len(members), ranks, key, count)
        return spec, (dims, ranks), shape

    def register_cuda(self, name, op, dtype, shape, device, address, reduce_op=REDUCE_AVERAGE,
                      root_rank=0, compressor=0, density=0.0, members=None, group=None):
        """Registers a tensor that lives at device pointer `address` on CUDA `device`; the
        memory must stay allocated until the tensor is unregistered. `members`, `group`: see
        register."""
        self._require_open()
        spec, _arrays, shape = self._spec(name, op, dtype, shape, reduce_op, root_rank,
                                          compressor, density, members, group)
        tid = ctypes.c_uint32()
        self._check(self._lib.sparsync_register_cuda_tensor(
            self._h, ctypes.byref(spec), int(device), ctypes.c_void_p(address),
            ctypes.byref(tid)))
        numel = int(np.prod(shape, dtype=np.int64))
        return Registered(tid.value, name, op, dtype, shape, address, numel * ITEMSIZE[dtype],
                          device=int(device))

    def register(self, name, op, dtype, shape, reduce_op=REDUCE_AVERAGE, root_rank=0,
                 compressor=0, density=0.0, members=None, group=None):
        """Registers a host tensor; its region is mapped here (Registered.region). `members`:
        None for every rank, else the process set (ascending global ranks, this rank's among
        them): only they register and post the tensor, and its collective waits for them alone
        (AVERAGE divides by their number; an allgather concatenates theirs in rank order).
        `group`: None, or (key, size) for one of `size` tensors of a grouped collective with that
        key (not 0, the same on every rank), which the daemon schedules as one."""
        self._require_open()
        spec, _arrays, shape = self._spec(name, op, dtype, shape, reduce_op, root_rank,
                                          compressor, density, members, group)
        tid, fd, nbytes = ctypes.c_uint32(), ctypes.c_int(-1), ctypes.c_uint64()
        self._check(self._lib.sparsync_register_tensor_fd(
            self._h, ctypes.byref(spec), ctypes.byref(tid), ctypes.byref(fd),
            ctypes.byref(nbytes)))
        reg = Registered(tid.value, name, op, dtype, shape, None, nbytes.value)
        needed = reg.numel * ITEMSIZE[dtype]
        try:
            if nbytes.value < needed:
                problem = ("sparsyncd created %d bytes for tensor '%s', which needs %d"
                           % (nbytes.value, name, needed))
            else:
                problem = None
                if nbytes.value:
                    reg.region = mmap.mmap(fd.value, nbytes.value)
        except OSError as e:
            problem = "cannot map the shared buffer of tensor '%s': %s" % (name, e)
        finally:
            os.close(fd.value)
        if problem:
            self.unregister(reg)
            raise SparsyncError(problem)
        return reg

    def post(self, reg, stream=None):
        """Starts the collective. CUDA tensors: the daemon reads the buffer after the work queued
        so far on `stream` (a cudaStream_t as an int; None or 0: the legacy default stream)."""
        self._require_open()
        if reg.device is None:
            self._check(self._lib.sparsync_post_ready(self._h, reg.id))
        else:
            self._check(self._lib.sparsync_post_ready_cuda(self._h, reg.id,
                                                           ctypes.c_void_p(stream or 0)))

    def _wait_done(self, reg, timeout_s, stream):
        if reg.device is None:
            return self._lib.sparsync_wait_done(self._h, reg.id, timeout_s)
        return self._lib.sparsync_wait_done_cuda(self._h, reg.id, timeout_s,
                                                 ctypes.c_void_p(stream or 0))

    def try_wait(self, reg, stream=None):
        """True when the posted round is done (raises on its error), False while in flight."""
        self._require_open()
        s = self._wait_done(reg, 0.0, stream)
        if s == ERR_TIMEOUT:
            return False
        self._check(s)
        return True

    def wait(self, reg, timeout_s, limit_hint="SPARSYNC_TIMEOUT_S", stream=None):
        """Waits for the posted round; in slices so that Ctrl-C is seen within a second.
        CUDA tensors: work queued on `stream` afterwards sees the result."""
        self._require_open()
        deadline = None if timeout_s is None or timeout_s < 0 else time.monotonic() + timeout_s
        while True:
            left = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
            s = self._wait_done(reg, left, stream)
            if s != ERR_TIMEOUT:
                self._check(s)
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise SparsyncError(
                    "timed out after %.0f s (%s) waiting for the result of tensor '%s' from "
                    "sparsyncd of node %d at '%s'" % (timeout_s, limit_hint, reg.name,
                                                      self.world["node_rank"], self.socket_path),
                    ERR_TIMEOUT)

    def allgather_result(self, reg):
        """(uint8 array copy of the gathered bytes, first dimension) after a successful wait."""
        data, nbytes, dim0 = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_int64()
        self._check(self._lib.sparsync_allgather_result(
            self._h, reg.id, ctypes.byref(data), ctypes.byref(nbytes), ctypes.byref(dim0)))
        return _raw_array(data.value, nbytes.value).copy(), dim0.value

    def unregister(self, reg):
        if self._h:
            self._check(self._lib.sparsync_unregister_tensor(self._h, reg.id))

    def timeline(self, path, timeout_s):
        """Starts the daemon's timeline into `path` (bytes), or stops it (b"")."""
        self._require_open()
        self._check(self._lib.sparsync_timeline(self._h, path, timeout_s))

    def join(self, timeout_s=None):
        """hvd.join(): this worker is out of data; returns the rank that joined last once every
        worker of the job has joined (the daemon takes this worker's part in every collective
        meanwhile as nothing). Waits in slices so that Ctrl-C is seen within a second; without
        `timeout_s`, as long as the others train."""
        self._require_open()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last = ctypes.c_int32(-1)
        while True:
            left = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
            s = self._lib.sparsync_join(self._h, left, ctypes.byref(last))
            if s != ERR_TIMEOUT:
                self._check(s)
                return last.value
            if deadline is not None and time.monotonic() >= deadline:
                raise SparsyncError("timed out after %.0f s waiting for every worker to join"
                                    % timeout_s, ERR_TIMEOUT)

    def close(self):
        if self._h:
            self._lib.sparsync_close(self._h)
            self._h = None


# ---------------------------------------------------------------------------------------------
# A worker's settings from its environment (used by sparsync.tensorflow; sparsync.torch reads the
# same variables in its init). The client library reads none of them.

# The daemon fails a stalled collective after SPARSYNC_TIMEOUT_S and says why; a shim gives up on
# its own only this much later, so that the daemon's message is the one users see.
DAEMON_GRACE_S = 5.0


class WorkerSettings:
    """SPARSYNC_SOCKET, _JOB_TOKEN, _LOCAL_RANK, _CONNECT_TIMEOUT_S, _TIMEOUT_S, _CUDART and
    _RANK of this process, checked: a malformed value raises SparsyncError naming it."""

    def __init__(self, environ=None):
        from sparsync._paths import default_socket_path

        env = os.environ if environ is None else environ
        self.socket_path = env.get("SPARSYNC_SOCKET") or default_socket_path()
        self.job_token = env.get("SPARSYNC_JOB_TOKEN", "")
        self.local_rank = _env_number(env, "SPARSYNC_LOCAL_RANK", 0, int, "an integer")
        self.connect_timeout_s = _env_number(env, "SPARSYNC_CONNECT_TIMEOUT_S", 10.0, float,
                                             "a number of seconds")
        daemon_timeout_s = _env_number(env, "SPARSYNC_TIMEOUT_S", 300.0, float,
                                       "a number of seconds")
        self.wait_timeout_s = daemon_timeout_s + DAEMON_GRACE_S
        self.timeout_hint = "SPARSYNC_TIMEOUT_S=%g plus %g s" % (daemon_timeout_s,
                                                                  DAEMON_GRACE_S)
        self.cuda_runtime = env.get("SPARSYNC_CUDART", "")
        rank = env.get("SPARSYNC_RANK", "")
        self.expected_rank = None if rank == "" else _env_number(env, "SPARSYNC_RANK", 0, int,
                                                                 "an integer")

    def check_rank(self, world):
        """SparsyncError when the daemon's rank for this worker is not SPARSYNC_RANK."""
        if self.expected_rank is not None and self.expected_rank != world["rank"]:
            raise SparsyncError("sparsyncd at '%s' gave this worker rank %d, but SPARSYNC_RANK=%d"
                                % (self.socket_path, world["rank"], self.expected_rank))


def _env_number(env, name, default, kind, what):
    value = env.get(name, "")
    if value == "":
        return default
    try:
        return kind(value)
    except ValueError:
        raise SparsyncError("%s=%r is not %s" % (name, value, what)) from None
