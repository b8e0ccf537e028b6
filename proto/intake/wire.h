// The daemon <-> shim wire format of the intake control socket.
//
// Transport: one SOCK_SEQPACKET Unix-domain connection per worker process. Every message is one
// datagram that starts with `sparsync_msg_header`; `size` is the whole datagram. Memory for tensor
// data never travels on the socket: the daemon creates it with memfd_create and passes the file
// descriptor with SCM_RIGHTS next to REGISTER_REPLY (the tensor's buffer) and to DONE of an
// allgather (the result, whose size is only known then).
//
// CUDA tensors (memory SPARSYNC_MEMORY_CUDA, version 3): the worker's device buffer is exported
// with cudaIpcGetMemHandle and ordered with two interprocess CUDA events. The memfd region still
// comes with REGISTER_REPLY: it is the daemon's host staging copy, and the worker need not map it.
//
// Conversation:
//   shim -> HELLO (protocol version, job token, local rank, pid)   daemon -> HELLO_REPLY
//   shim -> REGISTER (name, op, dtype, shape)                      daemon -> REGISTER_REPLY + fd
//   shim writes the tensor into the mapped region, then -> READY (tensor id, round)
//   daemon -> DONE (tensor id, round, status) once the collective result is in the region
// CUDA tensors instead:
//   shim -> REGISTER (..., memory CUDA, device, memory handle, offset, ready event handle)
//   daemon opens the handles once      daemon -> REGISTER_REPLY (done event handle) + fd
//   shim writes the device buffer, records the ready event on its stream, then -> READY
//   daemon: its stream waits on the ready event, copies device -> staging, reduces as above,
//   copies staging -> device, records the done event, then -> DONE; the shim's stream waits on
//   the done event before anything reads the buffer
//   shim -> UNREGISTER (tensor id) when the tensor is no longer used; no reply
//   shim -> GOODBYE before closing; a connection that closes without it while the job runs is a
//   worker failure and fails the job on every node.
//   shim -> TIMELINE (start with a path, or stop)                  daemon -> TIMELINE_REPLY
//   (hvd.start_timeline / stop_timeline: the daemon's Chrome trace, docs/operations.md)
// Rounds count from 1 per tensor: the n-th READY of a tensor carries round n and the daemon
// rejects anything else. Every field is validated by the daemon; a malformed message closes that
// connection with a logged reason.
//
// Plain C so that every shim (C++, Python ctypes, TF op) can include it. All integers are in the
// host's byte order (both ends are on one machine).
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SPARSYNC_INTAKE_MAGIC 0x59535053u /* "SPSY" little-endian */
#define SPARSYNC_INTAKE_VERSION 4u
#define SPARSYNC_MAX_MESSAGE_BYTES 4096u
#define SPARSYNC_MAX_NAME_BYTES 200u
#define SPARSYNC_MAX_DIMS 8u
#define SPARSYNC_MAX_TOKEN_BYTES 64u
#define SPARSYNC_MAX_ERROR_BYTES 512u
#define SPARSYNC_MAX_TENSORS_PER_WORKER 65536u
#define SPARSYNC_CUDA_IPC_HANDLE_BYTES 64u /* sizeof cudaIpcMemHandle_t, cudaIpcEventHandle_t */
#define SPARSYNC_MAX_CUDA_DEVICES 1024u
#define SPARSYNC_MAX_PATH_BYTES 1024u
#define SPARSYNC_MAX_SET_RANKS 1024u /* a process set names ranks below this */
#define SPARSYNC_SET_WORDS 16u       /* = SPARSYNC_MAX_SET_RANKS / 64 */
#define SPARSYNC_MAX_GROUP_SIZE 65536u

typedef enum sparsync_msg_type {
  SPARSYNC_MSG_HELLO = 1,
  SPARSYNC_MSG_HELLO_REPLY = 2,
  SPARSYNC_MSG_REGISTER = 3,
  SPARSYNC_MSG_REGISTER_REPLY = 4,
  SPARSYNC_MSG_READY = 5,
  SPARSYNC_MSG_DONE = 6,
  SPARSYNC_MSG_UNREGISTER = 7,
  SPARSYNC_MSG_GOODBYE = 8,
  SPARSYNC_MSG_TIMELINE = 9,
  SPARSYNC_MSG_TIMELINE_REPLY = 10,
  SPARSYNC_MSG_JOIN = 11,
  SPARSYNC_MSG_JOIN_REPLY = 12,
} sparsync_msg_type;

/* Element types. Values are part of the protocol. */
typedef enum sparsync_dtype {
  SPARSYNC_FLOAT32 = 0,
  SPARSYNC_FLOAT64 = 1,
  SPARSYNC_FLOAT16 = 2,
  SPARSYNC_BFLOAT16 = 3,
  SPARSYNC_INT32 = 4,
  SPARSYNC_INT64 = 5,
  SPARSYNC_UINT8 = 6,
  SPARSYNC_DTYPE_COUNT = 7,
} sparsync_dtype;

/* Bytes per element of a sparsync_dtype; 0 for an unknown value. */
static inline uint32_t sparsync_dtype_size(uint32_t dtype) {
  switch (dtype) {
    case SPARSYNC_FLOAT32: case SPARSYNC_INT32: return 4;
    case SPARSYNC_FLOAT64: case SPARSYNC_INT64: return 8;
    case SPARSYNC_FLOAT16: case SPARSYNC_BFLOAT16: return 2;
    case SPARSYNC_UINT8: return 1;
  }
  return 0;
}

/* Collective a registered tensor takes part in. */
typedef enum sparsync_op {
  SPARSYNC_OP_ALLREDUCE = 0,  /* explicit allreduce: always exact */
  SPARSYNC_OP_ALLGATHER = 1,  /* concatenation along dim 0, in global rank order */
  SPARSYNC_OP_BROADCAST = 2,  /* from global rank `root_rank` */
  SPARSYNC_OP_GRADIENT = 3,   /* gradient reduction: may be compressed by the daemon */
  SPARSYNC_OP_COUNT = 4,
} sparsync_op;

/* Compressor of a GRADIENT tensor. DEFAULT: the daemon's SPARSYNC_COMPRESSOR. Other ops are
 * always exact and must say DEFAULT. Values are part of the protocol. */
typedef enum sparsync_compressor {
  SPARSYNC_COMPRESSOR_DEFAULT = 0,
  SPARSYNC_COMPRESSOR_NONE = 1,
  SPARSYNC_COMPRESSOR_TOPK = 2,
  SPARSYNC_COMPRESSOR_RANDOMK = 3,
  SPARSYNC_COMPRESSOR_THRESHOLD = 4,
  SPARSYNC_COMPRESSOR_GAUSSIANK = 5,
  SPARSYNC_COMPRESSOR_WANGNI = 6,
  SPARSYNC_COMPRESSOR_DGC = 7,
  SPARSYNC_COMPRESSOR_GTOPK = 8,
  SPARSYNC_COMPRESSOR_COUNT = 9,
} sparsync_compressor;

/* Where a registered tensor's data lives. Values are part of the protocol. */
typedef enum sparsync_memory {
  SPARSYNC_MEMORY_HOST = 0, /* the memfd region of REGISTER_REPLY */
  SPARSYNC_MEMORY_CUDA = 1, /* a device buffer shared with CUDA IPC; ALLREDUCE, GRADIENT and
                               BROADCAST only (an allgather's result has no device buffer) */
  SPARSYNC_MEMORY_COUNT = 2,
} sparsync_memory;

typedef enum sparsync_reduce_op {
  SPARSYNC_REDUCE_AVERAGE = 0,
  SPARSYNC_REDUCE_SUM = 1,
  SPARSYNC_REDUCE_COUNT = 2,
} sparsync_reduce_op;

/* Status codes carried in replies and returned by the client library. */
typedef enum sparsync_status {
  SPARSYNC_OK = 0,
  SPARSYNC_ERR_INVALID = 1,      /* bad argument or malformed message */
  SPARSYNC_ERR_UNAVAILABLE = 2,  /* daemon not reachable, or the connection was closed */
  SPARSYNC_ERR_TIMEOUT = 3,      /* a wait passed its deadline */
  SPARSYNC_ERR_MISMATCH = 4,     /* nodes or workers disagree on a tensor's name/dtype/shape */
  SPARSYNC_ERR_ABORTED = 5,      /* the job failed elsewhere (a worker or node died) */
  SPARSYNC_ERR_INTERNAL = 6,
  SPARSYNC_ERR_PERMISSION = 7,   /* wrong job token or protocol version */
} sparsync_status;

typedef struct sparsync_msg_header {
  uint32_t magic;    /* SPARSYNC_INTAKE_MAGIC */
  uint16_t version;  /* SPARSYNC_INTAKE_VERSION */
  uint16_t type;     /* sparsync_msg_type */
  uint32_t size;     /* bytes of the whole message, header included */
  uint32_t reserved; /* must be 0 */
} sparsync_msg_header;

typedef struct sparsync_hello {
  sparsync_msg_header header;
  uint32_t local_rank; /* this worker's rank among the workers of its node */
  int32_t pid;         /* the worker's process id, for logs and error messages */
  uint32_t token_len;  /* bytes used in job_token */
  uint32_t reserved;
  char job_token[SPARSYNC_MAX_TOKEN_BYTES];
} sparsync_hello;

typedef struct sparsync_hello_reply {
  sparsync_msg_header header;
  int32_t status;      /* sparsync_status */
  uint32_t node_rank;  /* this daemon's node */
  uint32_t num_nodes;
  uint32_t local_rank; /* echoed */
  uint32_t local_size; /* workers per node */
  uint32_t rank;       /* global worker rank = node_rank * local_size + local_rank */
  uint32_t size;       /* total workers */
  uint32_t reserved;
  char message[SPARSYNC_MAX_ERROR_BYTES]; /* NUL-terminated reason when status != OK */
} sparsync_hello_reply;

typedef struct sparsync_register_msg {
  sparsync_msg_header header;
  uint32_t tensor_id; /* chosen by the worker, < SPARSYNC_MAX_TENSORS_PER_WORKER, unused */
  uint8_t op;         /* sparsync_op */
  uint8_t dtype;      /* sparsync_dtype */
  uint8_t reduce_op;  /* sparsync_reduce_op, for ALLREDUCE and GRADIENT */
  uint8_t ndim;       /* <= SPARSYNC_MAX_DIMS; 0 is a scalar */
  int32_t root_rank;  /* global rank, for BROADCAST; otherwise 0 */
  uint32_t name_len;  /* 1 .. SPARSYNC_MAX_NAME_BYTES, no NUL inside */
  uint8_t compressor; /* sparsync_compressor; DEFAULT unless op is GRADIENT */
  uint8_t memory;     /* sparsync_memory */
  uint8_t reserved[2];/* must be 0 */
  float density;      /* fraction sent, in (0, 1]; 0: the daemon's SPARSYNC_DENSITY */
  int64_t shape[SPARSYNC_MAX_DIMS]; /* each >= 0; unused entries 0 */
  char name[SPARSYNC_MAX_NAME_BYTES];
  /* memory CUDA only; all 0 for HOST. */
  int32_t cuda_device;   /* device ordinal in the worker's numbering, < SPARSYNC_MAX_CUDA_DEVICES */
  uint32_t reserved2;    /* must be 0 */
  uint64_t cuda_offset;  /* bytes from the start of the exported allocation to the tensor */
  /* cudaIpcMemHandle_t of the allocation that holds the tensor */
  uint8_t cuda_memory[SPARSYNC_CUDA_IPC_HANDLE_BYTES];
  /* cudaIpcEventHandle_t of an interprocess event the worker records after writing the data */
  uint8_t cuda_ready_event[SPARSYNC_CUDA_IPC_HANDLE_BYTES];
  /* The process set the tensor belongs to: bit r % 64 of members[r / 64] set for each member
   * global rank r. All 0: every rank (the global set). Only members register and post the tensor;
   * the collective waits for the members alone. Host tensors, and not GRADIENT. */
  uint64_t members[SPARSYNC_SET_WORDS];
  /* A grouped collective (Horovod's grouped_allreduce, ...): the tensor is one of `group_size`
   * (2 .. SPARSYNC_MAX_GROUP_SIZE) that share the key `group` (not 0; the same on every rank, e.g.
   * a hash of the group's name). The group is scheduled as one: none of its tensors before all
   * are ready on every node. group_size 0: no group (then `group` is 0 too). Not GRADIENT. */
  uint64_t group;
  uint32_t group_size;
  uint32_t reserved3; /* must be 0 */
} sparsync_register_msg;

typedef struct sparsync_register_reply {
  sparsync_msg_header header;
  uint32_t tensor_id;
  int32_t status;        /* on OK an fd of region_bytes travels with this message */
  uint64_t region_bytes; /* = numel * element size (at least 1 byte is mapped) */
  char message[SPARSYNC_MAX_ERROR_BYTES];
  /* memory CUDA, status OK: cudaIpcEventHandle_t the daemon records once the result is back in
   * the device buffer (before DONE); all 0 otherwise. */
  uint8_t cuda_done_event[SPARSYNC_CUDA_IPC_HANDLE_BYTES];
} sparsync_register_reply;

typedef struct sparsync_ready {
  sparsync_msg_header header;
  uint32_t tensor_id;
  uint32_t reserved;
  uint64_t round;        /* 1 for the first READY of this tensor, then +1 each time */
  uint64_t timestamp_ns; /* CLOCK_MONOTONIC when the data was written: backward timing */
} sparsync_ready;

typedef struct sparsync_done {
  sparsync_msg_header header;
  uint32_t tensor_id;
  int32_t status;        /* sparsync_status */
  uint64_t round;
  uint64_t result_bytes; /* ALLGATHER: bytes of the result region whose fd travels along */
  int64_t result_dim0;   /* ALLGATHER: first dimension of the result */
  char message[SPARSYNC_MAX_ERROR_BYTES];
} sparsync_done;

typedef struct sparsync_unregister_msg {
  sparsync_msg_header header;
  uint32_t tensor_id;
  uint32_t reserved;
} sparsync_unregister_msg;

typedef struct sparsync_goodbye {
  sparsync_msg_header header;
} sparsync_goodbye;

/* Starts or stops the daemon's timeline. Starting: `path` names the file on the daemon's machine
 * (absolute, or relative to the daemon's working directory); "{node}" in it stands for the node's
 * rank, and without it only node 0 records. Starting the file being written changes nothing. */
typedef struct sparsync_timeline_msg {
  sparsync_msg_header header;
  uint32_t start;    /* 1: start recording into `path`; 0: stop (path_len 0) */
  uint32_t path_len; /* 1 .. SPARSYNC_MAX_PATH_BYTES when starting, no NUL inside */
  char path[SPARSYNC_MAX_PATH_BYTES];
} sparsync_timeline_msg;

typedef struct sparsync_timeline_reply {
  sparsync_msg_header header;
  int32_t status;    /* sparsync_status */
  uint32_t reserved;
  char message[SPARSYNC_MAX_ERROR_BYTES]; /* NUL-terminated reason when status != OK */
} sparsync_timeline_reply;

/* hvd.join(): this worker is out of data. Until every worker of the job has joined, the daemon
 * takes its part in every collective as nothing (zeros in a sum, no rows in an allgather; a
 * broadcast from it fails the job); JOIN_REPLY comes once all have joined. The worker sends
 * nothing else meanwhile and has no collective in flight. */
typedef struct sparsync_join_msg {
  sparsync_msg_header header;
} sparsync_join_msg;

typedef struct sparsync_join_reply {
  sparsync_msg_header header;
  int32_t status;    /* sparsync_status */
  int32_t last_rank; /* the global rank that joined last */
  char message[SPARSYNC_MAX_ERROR_BYTES]; /* NUL-terminated reason when status != OK */
} sparsync_join_reply;

#ifdef __cplusplus
}  // extern "C"

static_assert(sizeof(sparsync_msg_header) == 16, "wire layout");
static_assert(sizeof(sparsync_hello) == 96, "wire layout");
static_assert(sizeof(sparsync_hello_reply) == 560, "wire layout");
static_assert(sizeof(sparsync_register_msg) == 592, "wire layout");
static_assert(sizeof(sparsync_register_reply) == 608, "wire layout");
static_assert(sizeof(sparsync_join_reply) == 536, "wire layout");
static_assert(sizeof(sparsync_ready) == 40, "wire layout");
static_assert(sizeof(sparsync_done) == 560, "wire layout");
static_assert(sizeof(sparsync_unregister_msg) == 24, "wire layout");
static_assert(sizeof(sparsync_goodbye) == 16, "wire layout");
static_assert(sizeof(sparsync_timeline_msg) == 1048, "wire layout");
static_assert(sizeof(sparsync_timeline_reply) == 536, "wire layout");
static_assert(sizeof(sparsync_done) <= SPARSYNC_MAX_MESSAGE_BYTES, "fits one datagram");
#endif
