/* The daemon's door to the CUDA sparsification kernels (cuda_kernels.h): a plain C interface
 * exported by a shared library that the daemon loads at run time (dlopen), as it loads the CUDA
 * runtime and NCCL, so that a daemon built without nvcc, or run on a machine without a GPU, is
 * unaffected. kernels/cuda/ builds the real library (libsparsync_sparsify_cuda.so) whenever nvcc is
 * found; tests/support/fake_sparsify/ builds one with the same symbols on the CPU kernels, for the
 * tests of machines without a GPU (there "device" memory is host memory, as with the fake CUDA
 * runtime).
 *
 * Conventions:
 *  - Pointers are device pointers on the current device of the calling thread; `stream` is a
 *    cudaStream_t of that device. Calls only enqueue work on the stream, except
 *    sparsync_sp_finish, which waits for it.
 *  - Every call returns a sparsync_sp_code; on an error it writes a message into `error` (which
 *    may be null).
 *  - A workspace belongs to one stream at a time; calls sharing it are ordered on that stream and
 *    each selection's result is read (sparsync_sp_finish) before the next call.
 */
#ifndef SPARSYNC_KERNELS_CUDA_SPARSIFY_PLUGIN_H_
#define SPARSYNC_KERNELS_CUDA_SPARSIFY_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* sparsync_sp_abi_version() of a library this header describes. */
#define SPARSYNC_SP_ABI_VERSION 2

typedef enum sparsync_sp_code {
  SPARSYNC_SP_OK = 0,
  SPARSYNC_SP_INVALID_ARGUMENT = 1, /* bad arguments, or an invalid payload entry (finish) */
  SPARSYNC_SP_NONFINITE = 2,        /* finish: the input held NaN/Inf at error->index */
  SPARSYNC_SP_OUT_OF_RANGE = 3,     /* finish: more pairs than the output holds */
  SPARSYNC_SP_CUDA = 4,             /* a CUDA runtime error */
  SPARSYNC_SP_INTERNAL = 5
} sparsync_sp_code;

typedef struct sparsync_sp_error {
  char message[256]; /* NUL-terminated */
  int64_t index;     /* SPARSYNC_SP_NONFINITE: the first non-finite element; else -1 */
} sparsync_sp_error;

/* Device scratch for one stream: cudaMalloc'd once on the current device, sized for tensors of
 * up to max_numel elements (<= INT32_MAX) and selections of up to max_k pairs. */
typedef struct sparsync_sp_workspace sparsync_sp_workspace;

/* One node's pairs in device memory: indices strictly ascending in [0, numel), float32 values. */
typedef struct sparsync_sp_payload {
  const int32_t* indices;
  const float* values;
  int64_t count;
} sparsync_sp_payload;

int sparsync_sp_abi_version(void);

int sparsync_sp_workspace_create(int64_t max_numel, int64_t max_k, sparsync_sp_workspace** out,
                                 sparsync_sp_error* error);
void sparsync_sp_workspace_destroy(sparsync_sp_workspace* workspace);

/* Top-k with error feedback (cuda_kernels.h TopKWithResidual): a = residual + grad; writes the k
 * largest |a| (ties: smaller index first) in ascending index order to indices/values, and leaves
 * residual = a with those coordinates zeroed. REQUIRES 1 <= k <= numel, k <= capacity. If a holds
 * a non-finite value, nothing is selected, finish reports SPARSYNC_SP_NONFINITE, and residual
 * is left unspecified: the caller must discard it (grad is never written). */
int sparsync_sp_topk_residual(const float* grad, float* residual, int64_t numel, int64_t k,
                              int32_t* indices, float* values, int64_t capacity,
                              sparsync_sp_workspace* workspace, void* stream,
                              sparsync_sp_error* error);

/* dense[i] = (sum over payloads, in the order given, of their value at i) / divisor, computed in
 * float32 with the additions in payload order and the division skipped for divisor 1, so that it
 * is bit-identical to the daemon's host decoding; zero where no payload has i
 * (cuda_kernels.h ScatterAddAverage). Invalid entries are never written out of bounds; finish
 * reports them. */
int sparsync_sp_scatter_add_average(const sparsync_sp_payload* payloads, int num_payloads,
                                    float* dense, int64_t numel, double divisor,
                                    sparsync_sp_workspace* workspace, void* stream,
                                    sparsync_sp_error* error);

/* out[j] = the float16 bits of values[j] (round to nearest even), and residual[indices[j]] =
 * values[j] - float(out[j]): the part of each value that float16 does not carry goes back to the
 * residual, which top-k left zero there (cuda_kernels.h PackFloat16WithResidual). Entries whose
 * index is outside [0, numel) are skipped. Enqueues only; uses no workspace, so it leaves the
 * result sparsync_sp_finish reports unchanged. */
int sparsync_sp_pack_float16_residual(const float* values, const int32_t* indices, int64_t count,
                                      uint16_t* out, float* residual, int64_t numel, void* stream,
                                      sparsync_sp_error* error);

/* In place: data[i] = data[i] / (float)divisor, for a dense float32 average; bit-identical to
 * the daemon's host division (an IEEE float32 division, skipped for divisor 1). REQUIRES
 * numel >= 0, divisor > 0. Enqueues only; uses no workspace. */
int sparsync_sp_divide(float* data, int64_t numel, double divisor, void* stream,
                       sparsync_sp_error* error);

/* Waits for `stream`, then gives the result of the workspace's last call: *count is the number
 * of pairs a selection wrote (0 after a scatter-add). */
int sparsync_sp_finish(sparsync_sp_workspace* workspace, void* stream, int64_t* count,
                       sparsync_sp_error* error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SPARSYNC_KERNELS_CUDA_SPARSIFY_PLUGIN_H_ */
