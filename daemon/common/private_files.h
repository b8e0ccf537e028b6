// Files and directories that hold a secret or a socket only this user may reach: the control
// socket's directory, the job token file beside it, a token file given with
// SPARSYNC_JOB_TOKEN_FILE, a TLS private key. "Private" means owned by the daemon's effective
// user and granting nothing to group or others (mode & 077 == 0), like ssh's StrictModes: another
// local user who could write the directory could move the socket aside and listen in its place
// (issue 16, D1); one who could read the file would have the job's token.
//
// Every error names the path, its owner and its mode, and says what to do.
#pragma once

#include <string>

#include "daemon/common/status.h"

namespace sparsync {

// Creates `dir` with mode 0700 when it does not exist (its parents with the default mode), then
// checks that it is a directory (not a symbolic link), ours and private. `what` names the setting
// it comes from in errors ("the directory of SPARSYNC_SOCKET").
Status EnsurePrivateDirectory(const std::string& dir, const std::string& what);

// Reads at most `max_bytes` of a regular file that is ours and private (not following a symbolic
// link). A larger file is an error.
Result<std::string> ReadPrivateFile(const std::string& path, const std::string& what,
                                    size_t max_bytes);

// Writes `content` to `path` as a new file of mode 0600. A regular file of ours already there (a
// daemon that died left it) is replaced; anything else there is an error, and is left alone.
Status WritePrivateFile(const std::string& path, const std::string& content);

// Removes `path` if it is a regular file of ours; leaves anything else alone.
void RemovePrivateFile(const std::string& path);

}  // namespace sparsync
