// The job token: the shared secret every daemon and worker of a job presents (issue 16, D2, D3).
// A job always has one. Where it comes from, first match wins:
//   SPARSYNC_JOB_TOKEN in the environment (never a flag: a command line is visible to every user
//     in `ps`; /proc/PID/environ is readable by the process's own user only);
//   SPARSYNC_JOB_TOKEN_FILE / --job-token-file: a file that is ours and of mode 0600;
//   generated (128 random bits) by a daemon that has neither: by node 0, or by the only node of a
//     one-node job. The other nodes of a job cannot learn a generated token by themselves: give it
//     to them as a file, or start the job with sparsyncrun, which hands one token to everyone.
// Each daemon writes the token it uses to <socket>.token (0600, in the 0700 socket directory), so
// the workers of its node read it there when their environment has none.
#pragma once

#include <string>
#include <string_view>

#include "daemon/common/config.h"
#include "daemon/common/status.h"

namespace sparsync {

// Equality whose time depends on the longer length only, not on where the strings differ.
bool TokensEqual(std::string_view a, std::string_view b);

// 32 hexadecimal characters from the kernel's random source.
Result<std::string> GenerateJobToken();

// Fills config->job_token from the sources above and sets config->job_token_generated.
// Errors: both sources given, an unreadable or non-private file, an empty or oversized token, a
// node other than 0 of a multi-node job without a token.
Status ResolveJobToken(Config* config);

// The file beside the control socket where the daemon leaves the token for its workers.
std::string WorkerTokenPath(const std::string& socket_path);

}  // namespace sparsync
