// The TensorFlow side of the op library: the ops SparsyncAllreduce, SparsyncAllgather and
// SparsyncBroadcast, their AsyncOpKernels (CPU tensors, through the daemon's shared regions),
// and the C functions sparsync.tensorflow calls through ctypes to connect and disconnect.
//
// A kernel never blocks: it describes its tensor to Collectives (collectives.h), which posts it
// and completes the op on one of its own threads, setting the status and calling `done` there.
// Gradients are registered in Python (sparsync/tensorflow/_ops.py).
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "shims/tensorflow/collectives.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sparsync::tensorflow_shim {
namespace {

namespace tf = ::tensorflow;

// The connection every kernel of this process shares. TensorFlow constructs kernels itself and
// hands them nothing of ours, so this one object is reached by function; it is never destroyed
// (Python's atexit closes it), so that no kernel finds it gone during the interpreter's exit.
Collectives& Process() {
  static Collectives* collectives = new Collectives();
  return *collectives;
}

absl::Status ToTfStatus(const Outcome& o) {
  using absl::StatusCode;
  StatusCode code = StatusCode::kUnknown;
  switch (o.status) {
    case SPARSYNC_OK:
      return absl::OkStatus();
    case SPARSYNC_ERR_INVALID:
      code = StatusCode::kInvalidArgument;
      break;
    case SPARSYNC_ERR_UNAVAILABLE:
      code = StatusCode::kUnavailable;
      break;
    case SPARSYNC_ERR_TIMEOUT:
      code = StatusCode::kDeadlineExceeded;
      break;
    case SPARSYNC_ERR_MISMATCH:
      code = StatusCode::kFailedPrecondition;
      break;
    case SPARSYNC_ERR_ABORTED:
      code = StatusCode::kAborted;
      break;
    case SPARSYNC_ERR_INTERNAL:
      code = StatusCode::kInternal;
      break;
    case SPARSYNC_ERR_PERMISSION:
      code = StatusCode::kPermissionDenied;
      break;
  }
  return absl::Status(code, "sparsync: " + o.message);
}

bool WireDtype(tf::DataType t, sparsync_dtype* out) {
  switch (t) {
    case tf::DT_FLOAT:
      *out = SPARSYNC_FLOAT32;
      return true;
    case tf::DT_DOUBLE:
      *out = SPARSYNC_FLOAT64;
      return true;
    case tf::DT_HALF:
      *out = SPARSYNC_FLOAT16;
      return true;
    case tf::DT_BFLOAT16:
      *out = SPARSYNC_BFLOAT16;
      return true;
    case tf::DT_INT32:
      *out = SPARSYNC_INT32;
      return true;
    case tf::DT_INT64:
      *out = SPARSYNC_INT64;
      return true;
    case tf::DT_UINT8:
      *out = SPARSYNC_UINT8;
      return true;
    default:
      return false;
  }
}

// What the three kernels share: the tensor's name, and handing the request over.
class SparsyncKernel : public tf::AsyncOpKernel {
 public:
  SparsyncKernel(tf::OpKernelConstruction* ctx, sparsync_op op) : AsyncOpKernel(ctx), op_(op) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tensor_name", &tensor_name_));
    OP_REQUIRES(
        ctx, tensor_name_.size() <= SPARSYNC_MAX_NAME_BYTES,
        absl::InvalidArgumentError("sparsync: tensor name '" + tensor_name_ + "' is longer than " +
                                   std::to_string(SPARSYNC_MAX_NAME_BYTES) + " bytes"));
  }

 protected:
  // Fills the request's tensor from input 0 and its `done` from the op's.
  absl::Status Describe(tf::OpKernelContext* ctx, const DoneCallback& done, Request* r) {
    const tf::Tensor& input = ctx->input(0);
    r->tensor.name = tensor_name_.empty() ? UnnamedName(input) : tensor_name_;
    r->tensor.op = op_;
    if (!WireDtype(input.dtype(), &r->tensor.dtype)) {
      return absl::InvalidArgumentError("sparsync: tensor '" + r->tensor.name +
                                        "' has an unsupported dtype " +
                                        tf::DataTypeString(input.dtype()));
    }
    if (input.dims() > static_cast<int>(SPARSYNC_MAX_DIMS)) {
      return absl::InvalidArgumentError("sparsync: tensor '" + r->tensor.name + "' has " +
                                        std::to_string(input.dims()) + " dimensions; at most " +
                                        std::to_string(SPARSYNC_MAX_DIMS) + " are supported");
    }
    for (int d = 0; d < input.dims(); ++d) r->tensor.shape.push_back(input.dim_size(d));
    r->input = input.tensor_data().data();
    r->done = [ctx, done](const Outcome& o) {
      ctx->SetStatus(ToTfStatus(o));
      done();
    };
    return absl::OkStatus();
  }

  // Allocates output 0 in the input's shape and sends the request off.
  void SendSameShape(tf::OpKernelContext* ctx, const DoneCallback& done, Request r) {
    tf::Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, ctx->input(0).shape(), &output), done);
    r.output = const_cast<char*>(output->tensor_data().data());
    Process().Enqueue(std::move(r));
  }

 private:
  // The name of an op given none: its node's name (eagerly, its type's), which is the same on
  // every rank that runs the same program, and its dtype and shape (not an allgather's first
  // dimension, which may differ between ranks). One name must keep one spec: a worker that
  // registered the name again with another shape while a worker of its node still holds the
  // old one would be refused as a mismatch.
  std::string UnnamedName(const tf::Tensor& input) const {
    std::string n = "tf." + name() + ":" + tf::DataTypeString(input.dtype()) + "[";
    for (int d = op_ == SPARSYNC_OP_ALLGATHER ? 1 : 0; d < input.dims(); ++d) {
      n += std::to_string(input.dim_size(d)) + (d + 1 < input.dims() ? "," : "");
    }
    n += "]";
    if (n.size() <= SPARSYNC_MAX_NAME_BYTES) return n;
    // Too long for the wire: its tail and a hash of the whole (FNV-1a, the same everywhere).
    return "tf.~" + DigestHex(n) + n.substr(n.size() - (SPARSYNC_MAX_NAME_BYTES - 20));
  }

  const sparsync_op op_;
  std::string tensor_name_;
};

class AllreduceKernel : public SparsyncKernel {
 public:
  explicit AllreduceKernel(tf::OpKernelConstruction* ctx)
      : SparsyncKernel(ctx, Gradient(ctx) ? SPARSYNC_OP_GRADIENT : SPARSYNC_OP_ALLREDUCE) {
    int reduce_op = 0, compressor = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reduce_op", &reduce_op));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("compressor", &compressor));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("density", &density_));
    OP_REQUIRES(
        ctx, reduce_op >= 0 && reduce_op < SPARSYNC_REDUCE_COUNT,
        absl::InvalidArgumentError("sparsync: unknown reduce_op " + std::to_string(reduce_op)));
    OP_REQUIRES(
        ctx, compressor >= 0 && compressor < SPARSYNC_COMPRESSOR_COUNT,
        absl::InvalidArgumentError("sparsync: unknown compressor " + std::to_string(compressor)));
    reduce_op_ = static_cast<sparsync_reduce_op>(reduce_op);
    compressor_ = static_cast<sparsync_compressor>(compressor);
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    Request r;
    OP_REQUIRES_OK_ASYNC(ctx, Describe(ctx, done, &r), done);
    r.tensor.reduce_op = reduce_op_;
    r.tensor.compressor = compressor_;
    r.tensor.density = density_;
    SendSameShape(ctx, done, std::move(r));
  }

 private:
  static bool Gradient(tf::OpKernelConstruction* ctx) {
    bool gradient = false;
    return ctx->GetAttr("gradient", &gradient).ok() && gradient;
  }

  sparsync_reduce_op reduce_op_ = SPARSYNC_REDUCE_AVERAGE;
  sparsync_compressor compressor_ = SPARSYNC_COMPRESSOR_DEFAULT;
  float density_ = 0.0f;
};

class BroadcastKernel : public SparsyncKernel {
 public:
  explicit BroadcastKernel(tf::OpKernelConstruction* ctx)
      : SparsyncKernel(ctx, SPARSYNC_OP_BROADCAST) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("root_rank", &root_rank_));
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    Request r;
    OP_REQUIRES_OK_ASYNC(ctx, Describe(ctx, done, &r), done);
    r.tensor.root_rank = root_rank_;
    SendSameShape(ctx, done, std::move(r));
  }

 private:
  int32_t root_rank_ = 0;
};

class AllgatherKernel : public SparsyncKernel {
 public:
  explicit AllgatherKernel(tf::OpKernelConstruction* ctx)
      : SparsyncKernel(ctx, SPARSYNC_OP_ALLGATHER) {}

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    Request r;
    OP_REQUIRES_OK_ASYNC(ctx, Describe(ctx, done, &r), done);
    OP_REQUIRES_ASYNC(ctx, ctx->input(0).dims() >= 1,
                      absl::InvalidArgumentError("sparsync: allgather of tensor '" + r.tensor.name +
                                                 "' needs at least one dimension"),
                      done);
    // On a completion thread, once every rank's first dimension is known.
    r.allocate = [ctx](int64_t dim0, uint64_t bytes, std::string* error) -> void* {
      tf::TensorShape shape = ctx->input(0).shape();
      shape.set_dim(0, dim0);
      const uint64_t expected = shape.num_elements() * tf::DataTypeSize(ctx->input(0).dtype());
      if (expected != bytes) {
        *error = "sparsyncd gathered " + std::to_string(bytes) + " bytes in " +
                 std::to_string(dim0) + " rows, which should be " + std::to_string(expected);
        return nullptr;
      }
      tf::Tensor* output = nullptr;
      absl::Status s = ctx->allocate_output(0, shape, &output);
      if (!s.ok()) {
        *error = std::string(s.message());
        return nullptr;
      }
      return const_cast<char*>(output->tensor_data().data());
    };
    Process().Enqueue(std::move(r));
  }
};

}  // namespace

REGISTER_OP("SparsyncAllreduce")
    .Attr("T: {float, double, half, bfloat16, int32, int64}")
    .Attr("reduce_op: int = 0")      // sparsync_reduce_op: 0 average, 1 sum
    .Attr("gradient: bool = false")  // the GRADIENT op, which the daemon may compress
    .Attr("compressor: int = 0")     // sparsync_compressor (GRADIENT only); 0: the daemon's
    .Attr("density: float = 0")      // GRADIENT only; 0: the daemon's SPARSYNC_DENSITY
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Output("sum: T")
    // Not stateful, as Horovod's ops: a tf.function chains its stateful ops in program order
    // (automatic control dependencies), which would serialise the collectives and keep each
    // gradient's from starting before the previous one finished. Identical nodes may be merged
    // and unused ones pruned; the graph is the same on every rank, so that is the same there.
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc("The average or sum of `tensor` over every worker of the job, through sparsyncd.");

REGISTER_OP("SparsyncAllgather")
    .Attr("T: {float, double, half, bfloat16, int32, int64, uint8}")
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle output;
      TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &output));
      c->set_output(0, output);
      return absl::OkStatus();
    })
    .Doc("Every worker's `tensor` concatenated along dimension 0, in rank order.");

REGISTER_OP("SparsyncBroadcast")
    .Attr("T: {float, double, half, bfloat16, int32, int64, uint8}")
    .Attr("root_rank: int")
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(::tensorflow::shape_inference::UnchangedShape)
    .Doc("`tensor` of rank `root_rank`, on every worker.");

REGISTER_KERNEL_BUILDER(Name("SparsyncAllreduce").Device(::tensorflow::DEVICE_CPU),
                        AllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("SparsyncAllgather").Device(::tensorflow::DEVICE_CPU),
                        AllgatherKernel);
REGISTER_KERNEL_BUILDER(Name("SparsyncBroadcast").Device(::tensorflow::DEVICE_CPU),
                        BroadcastKernel);

}  // namespace sparsync::tensorflow_shim

// The functions sparsync.tensorflow calls through ctypes (the same loaded library as its ops).
namespace {

// A failed outcome's message into the caller's `error` buffer (NUL-terminated, truncated).
void CopyError(const sparsync::tensorflow_shim::Outcome& o, char* error, size_t error_len) {
  if (o.ok() || error == nullptr || error_len == 0) return;
  size_t n = std::min(o.message.size(), error_len - 1);
  memcpy(error, o.message.data(), n);
  error[n] = '\0';
}

}  // namespace

extern "C" {

// Connects this process's ops to the daemon; 0 on success, else a sparsync_status with the
// reason in `error`. The settings are the shim's SPARSYNC_* (the library reads no environment).
__attribute__((visibility("default"))) int sparsync_tf_init(
    const char* socket_path, const char* job_token, uint32_t local_rank, double connect_timeout_s,
    double wait_timeout_s, const char* timeout_hint, const char* cuda_runtime,
    sparsync_world* world, char* error, size_t error_len) {
  using sparsync::tensorflow_shim::ConnectSettings;
  ConnectSettings s;
  s.socket_path = socket_path ? socket_path : "";
  s.job_token = job_token ? job_token : "";
  s.local_rank = local_rank;
  s.connect_timeout_s = connect_timeout_s;
  s.wait_timeout_s = wait_timeout_s;
  s.timeout_hint = timeout_hint ? timeout_hint : "SPARSYNC_TIMEOUT_S";
  s.cuda_runtime = cuda_runtime ? cuda_runtime : "";
  sparsync::tensorflow_shim::Outcome o = sparsync::tensorflow_shim::Process().Connect(s, world);
  CopyError(o, error, error_len);
  return o.status;
}

// Starts the daemon's timeline into `path`, or stops it (NULL or ""); as sparsync_tf_init.
__attribute__((visibility("default"))) int sparsync_tf_timeline(const char* path, double timeout_s,
                                                                char* error, size_t error_len) {
  sparsync::tensorflow_shim::Outcome o =
      sparsync::tensorflow_shim::Process().Timeline(path ? path : "", timeout_s);
  CopyError(o, error, error_len);
  return o.status;
}

// Fails what is in flight, releases every region and says goodbye. Safe to call twice.
__attribute__((visibility("default"))) void sparsync_tf_shutdown(void) {
  sparsync::tensorflow_shim::Process().Close();
}

}  // extern "C"
