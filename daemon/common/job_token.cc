#include "daemon/common/job_token.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>

#include "daemon/common/private_files.h"

namespace sparsync {
namespace {

constexpr size_t kMaxTokenBytes = 64;  // SPARSYNC_MAX_TOKEN_BYTES of the intake protocol

}  // namespace

bool TokensEqual(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

Result<std::string> GenerateJobToken() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("generating a job token (getrandom)", errno);
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 15]);
  }
  return token;
}

std::string WorkerTokenPath(const std::string& socket_path) { return socket_path + ".token"; }

Status ResolveJobToken(Config* c) {
  c->job_token_generated = false;
  if (!c->job_token.empty() && !c->job_token_file.empty()) {
    return InvalidArgument("both SPARSYNC_JOB_TOKEN and SPARSYNC_JOB_TOKEN_FILE (--job-token-file) "
                           "are set: give the token one way");
  }
  if (!c->job_token_file.empty()) {
    SPARSYNC_ASSIGN_OR_RETURN(std::string text,
                              ReadPrivateFile(c->job_token_file, "SPARSYNC_JOB_TOKEN_FILE",
                                              kMaxTokenBytes + 2));
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (text.empty() || text.size() > kMaxTokenBytes) {
      return InvalidArgument("SPARSYNC_JOB_TOKEN_FILE " + c->job_token_file +
                             " must hold a token of 1 to 64 bytes on its first line");
    }
    c->job_token = text;
    return Status::Ok();
  }
  if (!c->job_token.empty()) return Status::Ok();
  if (c->node_rank != 0) {
    return InvalidArgument(
        "no job token: every node of a job needs the same one (SPARSYNC_JOB_TOKEN in the "
        "environment or SPARSYNC_JOB_TOKEN_FILE); node 0 generates one when it has none and "
        "leaves it in the file SPARSYNC_SOCKET.token beside its socket");
  }
  SPARSYNC_ASSIGN_OR_RETURN(c->job_token, GenerateJobToken());
  c->job_token_generated = true;
  return Status::Ok();
}

}  // namespace sparsync
