"""The op library (libsparsync_tensorflow.so, shims/tensorflow) as Python sees it: loading it,
the raw ops, their gradients, and the conversion of their errors.

The library is loaded twice from one file, which the dynamic loader maps once: by TensorFlow for
its ops, and by ctypes for the two C functions that connect and disconnect the ops' process-wide
connection to the daemon.
"""

import ctypes
import os
import re
import threading
from pathlib import Path

import tensorflow as tf

from sparsync import _wire as W
from sparsync._client import _World
from sparsync._errors import SparsyncError

_NAME = "libsparsync_tensorflow.so"
_PACKAGE_DIR = Path(__file__).resolve().parents[1]
_REPO_ROOT = _PACKAGE_DIR.parents[2]  # shims/python/sparsync -> the checkout

# The op library's TensorFlow error codes for each sparsync_status (tf_ops.cc, ToTfStatus).
_STATUS_OF_ERROR = {
    tf.errors.InvalidArgumentError: W.ERR_INVALID,
    tf.errors.UnavailableError: W.ERR_UNAVAILABLE,
    tf.errors.DeadlineExceededError: W.ERR_TIMEOUT,
    tf.errors.FailedPreconditionError: W.ERR_MISMATCH,
    tf.errors.AbortedError: W.ERR_ABORTED,
    tf.errors.InternalError: W.ERR_INTERNAL,
    tf.errors.PermissionDeniedError: W.ERR_PERMISSION,
}
_MESSAGE = re.compile(r"sparsync: (.*?)(?: \[Op:Sparsync\w+\].*)?$", re.DOTALL)


def find_library():
    """$SPARSYNC_TF_LIB, else the package's lib/, else this checkout's build/."""
    env = os.environ.get("SPARSYNC_TF_LIB")
    if env:
        return env
    for c in (_PACKAGE_DIR / "lib" / _NAME, _REPO_ROOT / "build" / "shims" / "tensorflow" / _NAME):
        if c.is_file():
            return str(c)
    return None


class _Library:
    """The loaded op library: `ops` (TensorFlow's module of its ops) and `c` (ctypes)."""

    def __init__(self, path):
        try:
            self.ops = tf.load_op_library(path)
        except tf.errors.NotFoundError as e:
            raise SparsyncError("cannot load the sparsync TensorFlow op library %s: %s (was it "
                                "built against this TensorFlow, %s?)"
                                % (path, e.message, tf.__version__)) from None
        self.c = ctypes.CDLL(path)
        self.c.sparsync_tf_init.restype = ctypes.c_int
        self.c.sparsync_tf_init.argtypes = [
            ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_double, ctypes.c_double,
            ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_World), ctypes.c_char_p,
            ctypes.c_size_t]
        self.c.sparsync_tf_timeline.restype = ctypes.c_int
        self.c.sparsync_tf_timeline.argtypes = [ctypes.c_char_p, ctypes.c_double,
                                                ctypes.c_char_p, ctypes.c_size_t]
        self.c.sparsync_tf_shutdown.restype = None
        self.c.sparsync_tf_shutdown.argtypes = []

    def connect(self, settings):
        """The world dict of a new connection with `settings` (sparsync._client.WorkerSettings)."""
        world = _World()
        err = ctypes.create_string_buffer(1024)
        s = self.c.sparsync_tf_init(
            settings.socket_path.encode(), settings.job_token.encode(), settings.local_rank,
            settings.connect_timeout_s, settings.wait_timeout_s, settings.timeout_hint.encode(),
            settings.cuda_runtime.encode(), ctypes.byref(world), err, len(err))
        if s != W.OK:
            raise SparsyncError(err.value.decode(errors="replace"), s)
        return {f: getattr(world, f) for f, _ in _World._fields_}

    def timeline(self, path, timeout_s):
        """Starts the daemon's timeline into `path` (bytes), or stops it (b"")."""
        err = ctypes.create_string_buffer(1024)
        s = self.c.sparsync_tf_timeline(path, timeout_s, err, len(err))
        if s != W.OK:
            raise SparsyncError(err.value.decode(errors="replace"), s)

    def shutdown(self):
        self.c.sparsync_tf_shutdown()


_lock = threading.Lock()
_library = None


def library():
    """The op library, loaded on first use; SparsyncError when it is not built."""
    global _library
    with _lock:
        if _library is None:
            path = find_library()
            if path is None:
                raise SparsyncError(
                    "the sparsync TensorFlow op library (%s) is not built: run "
                    "deploy/install_deps.sh (it creates the TensorFlow environment .venv-tf), then "
                    "cmake -S . -B build -G Ninja && cmake --build build, or set SPARSYNC_TF_LIB"
                    % _NAME)
            _library = _Library(path)
        return _library


def ops():
    return library().ops


def as_sparsync_error(e):
    """The SparsyncError of an error the op library raised, else None."""
    # Eagerly TensorFlow writes "{{function_node ...}} sparsync: <ours> [Op:SparsyncAllreduce]".
    found = _MESSAGE.search(getattr(e, "message", str(e)))
    if found is None:
        return None
    status = next((s for cls, s in _STATUS_OF_ERROR.items() if isinstance(e, cls)), None)
    return SparsyncError(found.group(1), status)


def run_eagerly(fn, *args, **kwargs):
    """fn(*args, **kwargs); when executing eagerly, the op library's errors become
    SparsyncError (inside a graph they surface as TensorFlow's errors when it runs)."""
    if not tf.executing_eagerly():
        return fn(*args, **kwargs)
    try:
        return fn(*args, **kwargs)
    except tf.errors.OpError as e:
        converted = as_sparsync_error(e)
        if converted is None:
            raise
        raise converted from None


# ---------------------------------------------------------------------------------------------
# Raw ops (dtypes the daemon takes; sparsync.tensorflow converts the others)


def allreduce(tensor, reduce_op, name="", gradient=False, compressor=0, density=0.0):
    return ops().sparsync_allreduce(tensor, reduce_op=int(reduce_op), gradient=bool(gradient),
                                    compressor=int(compressor), density=float(density),
                                    tensor_name=name or "")


def allgather(tensor, name=""):
    return ops().sparsync_allgather(tensor, tensor_name=name or "")


def broadcast(tensor, root_rank, name=""):
    return ops().sparsync_broadcast(tensor, root_rank=int(root_rank), tensor_name=name or "")


def _grad_name(op):
    name = op.get_attr("tensor_name")
    name = name.decode() if isinstance(name, bytes) else name
    return name + ".grad" if name else ""


def register_gradients(rank_fn):
    """Registers the ops' gradients (once per process); `rank_fn()` is this worker's rank."""

    @tf.RegisterGradient("SparsyncAllreduce")
    def _allreduce_grad(op, grad):
        # d(mean or sum over ranks)/dx_r: the same reduction of every rank's upstream gradient.
        return allreduce(grad, op.get_attr("reduce_op"), _grad_name(op))

    @tf.RegisterGradient("SparsyncAllgather")
    def _allgather_grad(op, grad):
        # Every rank used the whole gathered tensor: sum the upstream gradients, keep our rows.
        name = _grad_name(op)
        summed = allreduce(grad, W.REDUCE_SUM, name)
        rows = tf.shape(op.inputs[0], out_type=tf.int32)[:1]
        every = allgather(rows, name + ".rows" if name else "")
        start = tf.reduce_sum(every[:rank_fn()])
        return summed[start:start + rows[0]]

    @tf.RegisterGradient("SparsyncBroadcast")
    def _broadcast_grad(op, grad):
        # Only the root's input reached the output: it gets the sum, the others nothing.
        summed = allreduce(grad, W.REDUCE_SUM, _grad_name(op))
        if rank_fn() != op.get_attr("root_rank"):
            return tf.zeros_like(summed)
        return summed
