// The C ABI of include/sparsync/client.h over Session: argument checks, the handle's last error,
// and the fence that keeps C++ exceptions (std::bad_alloc, std::system_error) from crossing into
// C, ctypes or a framework's op.
#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "shims/client/include/sparsync/client.h"
#include "shims/client/session.h"

using sparsync::client::ConnectOptions;
using sparsync::client::Session;
using sparsync::client::Status;

struct sparsync_client {
  std::unique_ptr<Session> session;
  std::mutex error_mu;     // guards last_error
  std::string last_error;  // of the last failing call
};

namespace {

// Runs `call` (returning Status) so that no exception escapes; `report(message)` records the
// message of a failure. An exception is an INTERNAL failure.
template <typename Call, typename Report>
sparsync_status Fenced(Call&& call, Report&& report) noexcept {
  std::string what;
  try {
    Status s = call();
    if (!s.ok()) report(s.message());
    return s.code();
  } catch (const std::bad_alloc&) {
    what = "out of memory";
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  try {
    report("sparsync client: " + what);
  } catch (...) {  // nothing more can be said
  }
  return SPARSYNC_ERR_INTERNAL;
}

// Fenced for a call on an open handle: failures become its last error.
template <typename Call>
sparsync_status OnHandle(sparsync_client* client, Call&& call) noexcept {
  return Fenced(call, [client](const std::string& message) {
    std::lock_guard<std::mutex> lock(client->error_mu);
    client->last_error = message;
  });
}

Status NullArgument(const char* function) {
  return Status(SPARSYNC_ERR_INVALID, std::string(function) + ": null argument");
}

void WriteError(char* error, size_t error_len, const std::string& message) {
  if (error == nullptr || error_len == 0) return;
  size_t n = std::min(message.size(), error_len - 1);
  memcpy(error, message.data(), n);
  error[n] = '\0';
}

}  // namespace

extern "C" {

sparsync_status sparsync_connect_with_options(const sparsync_connect_options* options,
                                              sparsync_client** out, char* error,
                                              size_t error_len) {
  if (out == nullptr) return SPARSYNC_ERR_INVALID;
  *out = nullptr;
  return Fenced(
      [&]() -> Status {
        if (options == nullptr) return NullArgument("sparsync_connect_with_options");
        if (options->struct_size != sizeof(sparsync_connect_options)) {
          return Status(SPARSYNC_ERR_INVALID,
                        "sparsync_connect_options.struct_size is " +
                            std::to_string(options->struct_size) + ", this library's is " +
                            std::to_string(sizeof(sparsync_connect_options)) +
                            ": the caller was built against another version of sparsync/client.h");
        }
        ConnectOptions o;
        o.socket_path = options->socket_path ? options->socket_path : "";
        if (options->job_token != nullptr) o.job_token = options->job_token;
        o.job_token_file = options->job_token_file ? options->job_token_file : "";
        o.local_rank = options->local_rank;
        o.timeout_s = options->timeout_s;
        o.cuda_runtime = options->cuda_runtime ? options->cuda_runtime : "";
        auto client = std::make_unique<sparsync_client>();
        if (Status s = Session::Connect(o, &client->session); !s.ok()) return s;
        *out = client.release();
        return Status::Ok();
      },
      [&](const std::string& message) { WriteError(error, error_len, message); });
}

sparsync_status sparsync_connect(const char* socket_path, const char* job_token,
                                 uint32_t local_rank, double timeout_s, sparsync_client** out,
                                 char* error, size_t error_len) {
  sparsync_connect_options options{};
  options.struct_size = sizeof(options);
  options.local_rank = local_rank;
  options.socket_path = socket_path;
  options.job_token = job_token;
  options.timeout_s = timeout_s;
  return sparsync_connect_with_options(&options, out, error, error_len);
}

void sparsync_close(sparsync_client* client) {
  if (client == nullptr) return;
  try {
    client->session->Goodbye();
  } catch (...) {  // closing goes on without the goodbye (a lock that cannot be taken)
  }
  delete client;
}

sparsync_status sparsync_get_world(sparsync_client* client, sparsync_world* out) {
  if (client == nullptr || out == nullptr) return SPARSYNC_ERR_INVALID;
  *out = client->session->world();
  return SPARSYNC_OK;
}

sparsync_status sparsync_register_tensor(sparsync_client* client, const sparsync_tensor_spec* spec,
                                         uint32_t* tensor_id, void** data, uint64_t* bytes) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return OnHandle(client, [&] {
    if (spec == nullptr || spec->name == nullptr || tensor_id == nullptr || data == nullptr ||
        bytes == nullptr) {
      return NullArgument("sparsync_register_tensor");
    }
    sparsync::client::Registration r;
    Status s = client->session->Register(*spec, nullptr, /*hand_over=*/false, &r);
    if (s.ok()) {
      *tensor_id = r.id;
      *data = r.data;
      *bytes = r.bytes;
    }
    return s;
  });
}

sparsync_status sparsync_register_tensor_fd(sparsync_client* client,
                                            const sparsync_tensor_spec* spec, uint32_t* tensor_id,
                                            int* fd, uint64_t* bytes) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return OnHandle(client, [&] {
    if (spec == nullptr || spec->name == nullptr || tensor_id == nullptr || fd == nullptr ||
        bytes == nullptr) {
      return NullArgument("sparsync_register_tensor_fd");
    }
    sparsync::client::Registration r;
    Status s = client->session->Register(*spec, nullptr, /*hand_over=*/true, &r);
    if (s.ok()) {
      *tensor_id = r.id;
      *fd = r.fd;
      *bytes = r.bytes;
    }
    return s;
  });
}

sparsync_status sparsync_register_cuda_tensor(sparsync_client* client,
                                              const sparsync_tensor_spec* spec, int32_t device,
                                              void* data, uint32_t* tensor_id) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return OnHandle(client, [&] {
    if (spec == nullptr || spec->name == nullptr || tensor_id == nullptr) {
      return NullArgument("sparsync_register_cuda_tensor");
    }
    sparsync::client::CudaTarget target{device, data};
    sparsync::client::Registration r;
    Status s = client->session->Register(*spec, &target, /*hand_over=*/false, &r);
    if (s.ok()) *tensor_id = r.id;
    return s;
  });
}

sparsync_status sparsync_post_ready(sparsync_client* client, uint32_t tensor_id) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return OnHandle(client, [&] { return client->session->PostReady(tensor_id, nullptr); });
}

sparsync_status sparsync_post_ready_cuda(sparsync_client* client, uint32_t tensor_id,
                                         void* stream) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return OnHandle(client, [&] { return client->session->PostReady(tensor_id, &stream); });
}

sparsync_status sparsync_wait_done(sparsync_client* client, uint32_t tensor_id, double timeout_s) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return OnHandle(client, [&] { return client->session->WaitDone(tensor_id, timeout_s, nullptr); });
}

sparsync_status sparsync_wait_done_cuda(sparsync_client* client, uint32_t tensor_id,
                                        double timeout_s, void* stream) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return OnHandle(client, [&] { return client->session->WaitDone(tensor_id, timeout_s, &stream); });
}

sparsync_status sparsync_allgather_result(sparsync_client* client, uint32_t tensor_id,
                                          const void** data, uint64_t* bytes, int64_t* dim0) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return OnHandle(client, [&] {
    if (data == nullptr || bytes == nullptr || dim0 == nullptr) {
      return NullArgument("sparsync_allgather_result");
    }
    return client->session->AllgatherResult(tensor_id, data, bytes, dim0);
  });
}

sparsync_status sparsync_unregister_tensor(sparsync_client* client, uint32_t tensor_id) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return OnHandle(client, [&] { return client->session->Unregister(tensor_id); });
}

sparsync_status sparsync_timeline(sparsync_client* client, const char* path, double timeout_s) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return OnHandle(client, [&] { return client->session->Timeline(path ? path : "", timeout_s); });
}

sparsync_status sparsync_join(sparsync_client* client, double timeout_s, int32_t* last_rank) {
  if (client == nullptr || last_rank == nullptr) return SPARSYNC_ERR_INVALID;
  return OnHandle(client, [&] { return client->session->Join(timeout_s, last_rank); });
}

const char* sparsync_last_error(sparsync_client* client) {
  if (client == nullptr) return "sparsync: null client handle";
  std::lock_guard<std::mutex> lock(client->error_mu);
  return client->last_error.c_str();
}

}  // extern "C"
