#include "daemon/common/private_files.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

namespace sparsync {
namespace {

std::string UserName(uid_t uid) {
  passwd entry{};
  passwd* found = nullptr;
  char buf[1024];
  if (getpwuid_r(uid, &entry, buf, sizeof(buf), &found) == 0 && found != nullptr) {
    return std::string(found->pw_name) + " (uid " + std::to_string(uid) + ")";
  }
  return "uid " + std::to_string(uid);
}

std::string Mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// OK when `st` is ours and grants nothing to group or others.
Status CheckPrivate(const struct stat& st, const std::string& path, const std::string& what,
                    const char* fix) {
  if (st.st_uid != geteuid()) {
    return PermissionDenied(what + " " + path + " belongs to " + UserName(st.st_uid) +
                            ", not to this daemon's user " + UserName(geteuid()) +
                            ": another user may have made it to intercept the job; " + fix);
  }
  if ((st.st_mode & 077) != 0) {
    return PermissionDenied(what + " " + path + " has mode " + Mode(st.st_mode) +
                            ", which lets other users in; " + fix);
  }
  return Status::Ok();
}

}  // namespace

Status EnsurePrivateDirectory(const std::string& dir, const std::string& what) {
  const std::string fix = "run `chmod 700 " + dir + "` if it is yours, or choose another path";
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoStatus("checking " + what + " " + dir, errno);
    std::error_code ec;
    std::filesystem::path parent = std::filesystem::path(dir).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) return Unavailable("cannot create " + parent.string() + ": " + ec.message());
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus("creating " + what + " " + dir, errno);
    }
    // Someone may have made it between the two calls: what is there now is checked below.
    if (lstat(dir.c_str(), &st) != 0) return ErrnoStatus("checking " + what + " " + dir, errno);
  }
  if (S_ISLNK(st.st_mode)) {
    return PermissionDenied(what + " " + dir +
                            " is a symbolic link; name the directory itself, which must be "
                            "yours and of mode 0700");
  }
  if (!S_ISDIR(st.st_mode)) return InvalidArgument(what + " " + dir + " is not a directory");
  return CheckPrivate(st, dir, what, fix.c_str());
}

Result<std::string> ReadPrivateFile(const std::string& path, const std::string& what,
                                    size_t max_bytes) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus("opening " + what + " " + path, errno);
  struct stat st {};
  Status checked = fstat(fd, &st) != 0 ? ErrnoStatus("checking " + what + " " + path, errno)
                   : !S_ISREG(st.st_mode)
                       ? InvalidArgument(what + " " + path + " is not a regular file")
                       : CheckPrivate(st, path, what, ("run `chmod 600 " + path + "`").c_str());
  std::string content;
  if (checked.ok() && static_cast<uint64_t>(st.st_size) > max_bytes) {
    checked = InvalidArgument(what + " " + path + " holds " + std::to_string(st.st_size) +
                              " bytes, more than the " + std::to_string(max_bytes) + " expected");
  }
  if (checked.ok()) {
    content.resize(max_bytes + 1);
    ssize_t n = read(fd, content.data(), content.size());
    if (n < 0) {
      checked = ErrnoStatus("reading " + what + " " + path, errno);
    } else if (static_cast<size_t>(n) > max_bytes) {
      checked = InvalidArgument(what + " " + path + " is longer than " +
                                std::to_string(max_bytes) + " bytes");
    } else {
      content.resize(static_cast<size_t>(n));
    }
  }
  close(fd);
  if (!checked.ok()) return checked;
  return content;
}

Status WritePrivateFile(const std::string& path, const std::string& content) {
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
      return PermissionDenied(path + " exists and is not a regular file of this user's: not "
                              "replacing it; remove it or choose another SPARSYNC_SOCKET");
    }
    if (unlink(path.c_str()) != 0) return ErrnoStatus("removing the stale " + path, errno);
  }
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("creating " + path, errno);
  ssize_t n = write(fd, content.data(), content.size());
  int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(content.size())) {
    unlink(path.c_str());
    return n < 0 ? ErrnoStatus("writing " + path, err) : Internal("short write to " + path);
  }
  return Status::Ok();
}

void RemovePrivateFile(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) {
    unlink(path.c_str());
  }
}

}  // namespace sparsync
