// sparsync client library: the C ABI every shim (PyTorch via ctypes, TensorFlow op, C/C++) uses to
// hand tensors to the node's sparsyncd. Depends only on the intake wire format
// (proto/intake/wire.h).
//
// Threading: a client handle may be used from several threads; calls are serialised internally.
// Errors: every function returns a sparsync_status; the text of the last error of a handle is
// available from sparsync_last_error() until the next failing call on that handle. No C++
// exception leaves the library.
// Configuration: the library reads no environment variable; everything comes through the calls.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "proto/intake/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sparsync_client sparsync_client;

typedef struct sparsync_world {
  uint32_t rank;       /* global worker rank */
  uint32_t size;       /* total workers */
  uint32_t local_rank; /* rank among the workers of this node */
  uint32_t local_size; /* workers per node */
  uint32_t node_rank;
  uint32_t num_nodes;
} sparsync_world;

typedef struct sparsync_tensor_spec {
  const char* name;       /* unique per op within a job; same on every worker */
  sparsync_op op;
  sparsync_dtype dtype;
  sparsync_reduce_op reduce_op;
  int32_t root_rank;      /* BROADCAST only */
  uint32_t ndim;
  const int64_t* shape;   /* ndim entries */
  sparsync_compressor compressor; /* GRADIENT only; SPARSYNC_COMPRESSOR_DEFAULT: the daemon's */
  float density;          /* GRADIENT only; 0: the daemon's SPARSYNC_DENSITY */
  uint32_t num_members;   /* 0: every rank. Else the process set: `members` holds this many
                             distinct global ranks below SPARSYNC_MAX_SET_RANKS, ascending, this
                             worker's among them; only they take part (host tensors; not
                             GRADIENT) */
  const int32_t* members;
  uint64_t group;         /* a grouped collective: the group's key (not 0, the same on every
                             rank) ... */
  uint32_t group_size;    /* ... and its number of tensors (2 .. SPARSYNC_MAX_GROUP_SIZE), which
                             are scheduled as one. 0: no group. Not GRADIENT */
} sparsync_tensor_spec;

/* What sparsync_connect_with_options needs. The library reads no environment variable: the
 * caller (a shim) passes what it was configured with. Zero-fill the struct, set struct_size,
 * then the fields. */
typedef struct sparsync_connect_options {
  uint32_t struct_size;     /* sizeof(sparsync_connect_options); a library built from another
                               version of this header refuses other values (INVALID) */
  uint32_t local_rank;      /* this worker's rank among the workers of its node */
  const char* socket_path;  /* the daemon's control socket (the shims take SPARSYNC_SOCKET) */
  const char* job_token;    /* must match the daemon's (SPARSYNC_JOB_TOKEN); NULL: read from
                               job_token_file, or when that is NULL too from the file the daemon
                               leaves beside its socket (socket_path + ".token") */
  double timeout_s;         /* keep retrying to connect this long (the daemon may still be
                               starting); the handshake then gets at least 5 s */
  const char* cuda_runtime; /* the CUDA runtime library for CUDA tensors, only that file
                               (SPARSYNC_CUDART); NULL or "": libcudart.so.13, .so.12 or .so,
                               preferring one the process has loaded already */
  const char* job_token_file; /* with job_token NULL: a file holding the token, which must be
                                 this user's and readable by nobody else
                                 (SPARSYNC_JOB_TOKEN_FILE); NULL: see job_token */
} sparsync_connect_options;

/* Connects to the daemon's control socket and performs the handshake. The listener must run as
 * this process's user (or root), or the token is not sent (PERMISSION). On failure *out is NULL
 * and the reason is written to `error` (if not NULL, at most error_len bytes, NUL-terminated). */
sparsync_status sparsync_connect_with_options(const sparsync_connect_options* options,
                                              sparsync_client** out, char* error, size_t error_len);

/* sparsync_connect_with_options with these fields and the default CUDA runtime search. */
sparsync_status sparsync_connect(const char* socket_path, const char* job_token,
                                 uint32_t local_rank, double timeout_s, sparsync_client** out,
                                 char* error, size_t error_len);

/* Sends GOODBYE, unmaps every region and frees the handle. NULL is ignored. */
void sparsync_close(sparsync_client* client);

sparsync_status sparsync_get_world(sparsync_client* client, sparsync_world* out);

/* Registers a tensor and maps its shared buffer. *data points to `*bytes` bytes that stay valid
 * until sparsync_unregister_tensor or sparsync_close.*/
sparsync_status sparsync_register_tensor(sparsync_client* client, const sparsync_tensor_spec* spec,
                                         uint32_t* tensor_id, void** data, uint64_t* bytes);

/* sparsync_register_tensor, except that the caller maps the buffer: *fd is the tensor's memfd
 * (the caller owns it: map it MAP_SHARED, `*bytes` bytes, then close it) and the library maps
 * nothing. The caller's mapping stays valid after sparsync_unregister_tensor and sparsync_close
 * (the memory lives as long as a mapping of it does), so a framework can hand out tensors over
 * it whose lifetime it does not control. */
sparsync_status sparsync_register_tensor_fd(sparsync_client* client,
                                            const sparsync_tensor_spec* spec, uint32_t* tensor_id,
                                            int* fd, uint64_t* bytes);

/* The buffer of `tensor_id` holds this worker's input: start the collective (non-blocking). */
sparsync_status sparsync_post_ready(sparsync_client* client, uint32_t tensor_id);

/* Waits until the last posted round of `tensor_id` is done, at most `timeout_s` seconds
 * (negative: no limit). On OK the result is in the tensor's buffer; for ALLGATHER it is in a
 * separate region, see sparsync_allgather_result. */
sparsync_status sparsync_wait_done(sparsync_client* client, uint32_t tensor_id, double timeout_s);

/* ALLGATHER only, after a successful wait: the gathered bytes and first dimension. The pointer is
 * valid until the next post of this tensor, its unregister, or close. */
sparsync_status sparsync_allgather_result(sparsync_client* client, uint32_t tensor_id,
                                          const void** data, uint64_t* bytes, int64_t* dim0);

sparsync_status sparsync_unregister_tensor(sparsync_client* client, uint32_t tensor_id);

/* CUDA tensors (CUDA IPC intake). The client loads the CUDA runtime at run time, at the first
 * CUDA registration (it does not link it): the file in sparsync_connect_options.cuda_runtime,
 * else the default search. `stream` is a cudaStream_t (NULL: the legacy default stream). The
 * calling thread's current device is left as it was. */

/* Registers `spec`'s tensor that lives at device pointer `data` on CUDA device `device`
 * (anywhere inside a cudaMalloc'd allocation, e.g. from PyTorch's caching allocator). The daemon
 * reads and writes that memory directly; it must stay allocated until sparsync_unregister_tensor
 * or sparsync_close. Not for ALLGATHER. UNAVAILABLE when no CUDA runtime can be loaded. */
sparsync_status sparsync_register_cuda_tensor(sparsync_client* client,
                                              const sparsync_tensor_spec* spec, int32_t device,
                                              void* data, uint32_t* tensor_id);

/* sparsync_post_ready for a CUDA tensor: first records the tensor's ready event on `stream`, so
 * the daemon reads the buffer only after the work queued on `stream` so far (which wrote it). */
sparsync_status sparsync_post_ready_cuda(sparsync_client* client, uint32_t tensor_id,
                                         void* stream);

/* sparsync_wait_done for a CUDA tensor: on OK also makes `stream` wait for the daemon's copy of
 * the result into the buffer, so work queued on `stream` afterwards sees the result. The host
 * must not read the buffer before that work (or a cudaStreamSynchronize) has run. */
sparsync_status sparsync_wait_done_cuda(sparsync_client* client, uint32_t tensor_id,
                                        double timeout_s, void* stream);

/* Starts the daemon's timeline into `path` (a file on the daemon's machine; "{node}" in it stands
 * for the node's rank, and without it only node 0 records), or stops it (`path` NULL or "").
 * Waits up to `timeout_s` seconds for the daemon's answer. */
sparsync_status sparsync_timeline(sparsync_client* client, const char* path, double timeout_s);

/* hvd.join(): this worker is out of data; until every worker of the job has joined, the daemon
 * takes its part in every collective as nothing. The first call sends JOIN; each call waits up to
 * `timeout_s` seconds for every worker to join and returns SPARSYNC_ERR_TIMEOUT while they have
 * not (call again to go on waiting), OK with the rank that joined last in `*last_rank`, or the
 * job's error. Post nothing and wait for nothing else meanwhile. */
sparsync_status sparsync_join(sparsync_client* client, double timeout_s, int32_t* last_rank);

/* The message of the last failing call on this handle ("" if none). Valid until the next call. */
const char* sparsync_last_error(sparsync_client* client);

#ifdef __cplusplus
}  // extern "C"
#endif
