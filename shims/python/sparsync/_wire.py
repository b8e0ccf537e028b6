"""The intake wire format of proto/intake/wire.h, for Python: its constants and message layouts.

The one copy in Python. Names drop the ``SPARSYNC_`` prefix (``SPARSYNC_OP_GRADIENT`` is
``OP_GRADIENT``). tests/integration/test_wire.py parses wire.h and fails on any constant, enum
value or struct field that is missing here or differs.
"""

import struct

# #defines
INTAKE_MAGIC = 0x59535053  # "SPSY" little-endian
INTAKE_VERSION = 4
MAX_MESSAGE_BYTES = 4096
MAX_NAME_BYTES = 200
MAX_DIMS = 8
MAX_TOKEN_BYTES = 64
MAX_ERROR_BYTES = 512
MAX_TENSORS_PER_WORKER = 65536
CUDA_IPC_HANDLE_BYTES = 64
MAX_CUDA_DEVICES = 1024
MAX_PATH_BYTES = 1024
MAX_SET_RANKS = 1024
SET_WORDS = 16
MAX_GROUP_SIZE = 65536

# sparsync_msg_type
MSG_HELLO = 1
MSG_HELLO_REPLY = 2
MSG_REGISTER = 3
MSG_REGISTER_REPLY = 4
MSG_READY = 5
MSG_DONE = 6
MSG_UNREGISTER = 7
MSG_GOODBYE = 8
MSG_TIMELINE = 9
MSG_TIMELINE_REPLY = 10
MSG_JOIN = 11
MSG_JOIN_REPLY = 12

# sparsync_dtype
FLOAT32 = 0
FLOAT64 = 1
FLOAT16 = 2
BFLOAT16 = 3
INT32 = 4
INT64 = 5
UINT8 = 6
DTYPE_COUNT = 7
# sparsync_dtype_size
ITEMSIZE = {FLOAT32: 4, FLOAT64: 8, FLOAT16: 2, BFLOAT16: 2, INT32: 4, INT64: 8, UINT8: 1}

# sparsync_op
OP_ALLREDUCE = 0
OP_ALLGATHER = 1
OP_BROADCAST = 2
OP_GRADIENT = 3
OP_COUNT = 4

# sparsync_compressor
COMPRESSOR_DEFAULT = 0
COMPRESSOR_NONE = 1
COMPRESSOR_TOPK = 2
COMPRESSOR_RANDOMK = 3
COMPRESSOR_THRESHOLD = 4
COMPRESSOR_GAUSSIANK = 5
COMPRESSOR_WANGNI = 6
COMPRESSOR_DGC = 7
COMPRESSOR_GTOPK = 8
COMPRESSOR_COUNT = 9

# sparsync_memory
MEMORY_HOST = 0
MEMORY_CUDA = 1
MEMORY_COUNT = 2

# sparsync_reduce_op
REDUCE_AVERAGE = 0
REDUCE_SUM = 1
REDUCE_COUNT = 2

# sparsync_status
OK = 0
ERR_INVALID = 1
ERR_UNAVAILABLE = 2
ERR_TIMEOUT = 3
ERR_MISMATCH = 4
ERR_ABORTED = 5
ERR_INTERNAL = 6
ERR_PERMISSION = 7


def _by_value(prefix, skip=("COUNT",)):
    """{name after `prefix`: value} of this module's constants, in the order of their values."""
    found = {k[len(prefix):]: v for k, v in globals().items()
             if k.startswith(prefix) and isinstance(v, int) and k[len(prefix):] not in skip}
    return dict(sorted(found.items(), key=lambda kv: kv[1]))


# Compressor names as SPARSYNC_COMPRESSOR spells them ("default": the daemon's).
COMPRESSORS = {name.lower(): v for name, v in _by_value("COMPRESSOR_").items()}
STATUS_NAMES = {OK: "OK"}
STATUS_NAMES.update({v: name for name, v in _by_value("ERR_").items()})


class Layout:
    """One struct of wire.h as a little-endian struct.Struct, field by field.

    `fields` are (C field name, struct format) in declaration order; an array is one field
    ("8q", "64s"), a reserved byte array that must be zero is "Nx" (no value)."""

    def __init__(self, c_name, fields, msg_type=None):
        self.c_name = c_name
        self.msg_type = msg_type
        self.fields = list(fields)
        self.struct = struct.Struct("<" + "".join(f for _, f in self.fields))
        self.size = self.struct.size

    def offsets(self):
        """{field: (offset, size)} as this layout places them."""
        out, fmt = {}, "<"
        for name, f in self.fields:
            out[name] = (struct.calcsize(fmt), struct.calcsize("<" + f))
            fmt += f
        return out


HEADER = Layout("sparsync_msg_header", [("magic", "I"), ("version", "H"), ("type", "H"),
                                        ("size", "I"), ("reserved", "I")])


class Message(Layout):
    """A message: the header, then the body fields. pack/unpack handle the header."""

    def __init__(self, c_name, msg_type, body):
        super().__init__(c_name, [("header", "IHHII")] + list(body), msg_type)

    def pack(self, *body):
        """The datagram with these body values (header filled in)."""
        return self.struct.pack(INTAKE_MAGIC, INTAKE_VERSION, self.msg_type, self.size, 0, *body)

    def unpack(self, data):
        """The body values of a datagram of this type."""
        return self.struct.unpack(data)[5:]


_NAME = f"{MAX_NAME_BYTES}s"
_ERROR = f"{MAX_ERROR_BYTES}s"
_HANDLE = f"{CUDA_IPC_HANDLE_BYTES}s"

HELLO = Message("sparsync_hello", MSG_HELLO, [
    ("local_rank", "I"), ("pid", "i"), ("token_len", "I"), ("reserved", "I"),
    ("job_token", f"{MAX_TOKEN_BYTES}s")])
HELLO_REPLY = Message("sparsync_hello_reply", MSG_HELLO_REPLY, [
    ("status", "i"), ("node_rank", "I"), ("num_nodes", "I"), ("local_rank", "I"),
    ("local_size", "I"), ("rank", "I"), ("size", "I"), ("reserved", "I"), ("message", _ERROR)])
REGISTER = Message("sparsync_register_msg", MSG_REGISTER, [
    ("tensor_id", "I"), ("op", "B"), ("dtype", "B"), ("reduce_op", "B"), ("ndim", "B"),
    ("root_rank", "i"), ("name_len", "I"), ("compressor", "B"), ("memory", "B"),
    ("reserved", "2x"), ("density", "f"), ("shape", f"{MAX_DIMS}q"), ("name", _NAME),
    ("cuda_device", "i"), ("reserved2", "I"), ("cuda_offset", "Q"), ("cuda_memory", _HANDLE),
    ("cuda_ready_event", _HANDLE), ("members", f"{SET_WORDS}Q"),
    ("group", "Q"), ("group_size", "I"), ("reserved3", "I")])
REGISTER_REPLY = Message("sparsync_register_reply", MSG_REGISTER_REPLY, [
    ("tensor_id", "I"), ("status", "i"), ("region_bytes", "Q"), ("message", _ERROR),
    ("cuda_done_event", _HANDLE)])
READY = Message("sparsync_ready", MSG_READY, [
    ("tensor_id", "I"), ("reserved", "I"), ("round", "Q"), ("timestamp_ns", "Q")])
DONE = Message("sparsync_done", MSG_DONE, [
    ("tensor_id", "I"), ("status", "i"), ("round", "Q"), ("result_bytes", "Q"),
    ("result_dim0", "q"), ("message", _ERROR)])
UNREGISTER = Message("sparsync_unregister_msg", MSG_UNREGISTER, [
    ("tensor_id", "I"), ("reserved", "I")])
GOODBYE = Message("sparsync_goodbye", MSG_GOODBYE, [])
TIMELINE = Message("sparsync_timeline_msg", MSG_TIMELINE, [
    ("start", "I"), ("path_len", "I"), ("path", f"{MAX_PATH_BYTES}s")])
TIMELINE_REPLY = Message("sparsync_timeline_reply", MSG_TIMELINE_REPLY, [
    ("status", "i"), ("reserved", "I"), ("message", _ERROR)])

JOIN = Message("sparsync_join_msg", MSG_JOIN, [])
JOIN_REPLY = Message("sparsync_join_reply", MSG_JOIN_REPLY, [
    ("status", "i"), ("last_rank", "i"), ("message", _ERROR)])

LAYOUTS = [HEADER, HELLO, HELLO_REPLY, REGISTER, REGISTER_REPLY, READY, DONE, UNREGISTER,
           GOODBYE, TIMELINE, TIMELINE_REPLY, JOIN, JOIN_REPLY]
