#include "daemon/common/slurm.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <sstream>

extern char** environ;

namespace sparsync {
namespace {

const std::string* Find(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

Result<int> Integer(const std::map<std::string, std::string>& env, const std::string& key,
                    int lo) {
  const std::string* v = Find(env, key);
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(v->c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || n < lo || n > 65536) {
    return InvalidArgument(key + " = '" + *v + "' is not a node number Slurm would set");
  }
  return static_cast<int>(n);
}

}  // namespace

Result<std::optional<SlurmStep>> ReadSlurmStep(const std::map<std::string, std::string>& env) {
  const std::string* job_id = Find(env, "SLURM_JOB_ID");
  if (job_id == nullptr || Find(env, "SLURM_NODEID") == nullptr) return std::optional<SlurmStep>();
  SlurmStep step;
  SPARSYNC_ASSIGN_OR_RETURN(step.node_rank, Integer(env, "SLURM_NODEID", 0));
  if (Find(env, "SLURM_LOCALID") != nullptr) {
    SPARSYNC_ASSIGN_OR_RETURN(int local, Integer(env, "SLURM_LOCALID", 0));
    if (local != 0) {
      return InvalidArgument("srun started more than one sparsyncd on node " +
                             std::to_string(step.node_rank) + " (this is SLURM_LOCALID=" +
                             std::to_string(local) + "): start the daemons with one task per "
                             "node (srun --ntasks-per-node=1 --ntasks=<nodes>)");
    }
  }
  bool counted = false;
  for (const char* key : {"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"}) {
    if (Find(env, key) == nullptr) continue;
    SPARSYNC_ASSIGN_OR_RETURN(step.num_nodes, Integer(env, key, 1));
    counted = true;
    break;
  }
  if (!counted) {
    return InvalidArgument("SLURM_NODEID is set but none of SLURM_STEP_NUM_NODES, "
                           "SLURM_JOB_NUM_NODES, SLURM_NNODES: set SPARSYNC_NUM_NODES");
  }
  for (const char* key : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (const std::string* v = Find(env, key)) {
      step.nodelist = *v;
      break;
    }
  }
  if (const std::string* v = Find(env, "SLURMD_NODENAME")) step.node_name = *v;
  char* end = nullptr;
  errno = 0;
  unsigned long long id = std::strtoull(job_id->c_str(), &end, 10);
  if (errno != 0 || *end != '\0') {
    return InvalidArgument("SLURM_JOB_ID = '" + *job_id + "' is not a job number");
  }
  step.coordinator_port = 29400 + static_cast<int>(id % 1000);
  return std::optional<SlurmStep>(step);
}

Result<std::string> SlurmCoordinatorHost(const SlurmStep& step, const HostnamesFn& expand) {
  if (step.nodelist.empty()) {
    return InvalidArgument("under Slurm, neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is "
                           "set: set SPARSYNC_COORDINATOR=host:port");
  }
  auto hosts = expand(step.nodelist);
  if (!hosts.ok()) {
    return hosts.status().WithContext("the coordinator's host is the first of the Slurm node "
                                      "list '" + step.nodelist + "' (or set SPARSYNC_COORDINATOR)");
  }
  if (hosts->empty()) {
    return InvalidArgument("the Slurm node list '" + step.nodelist + "' names no host");
  }
  return hosts->front();
}

Result<std::vector<std::string>> ScontrolHostnames(const std::string& nodelist) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe for scontrol", errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  std::string a0 = "scontrol", a1 = "show", a2 = "hostnames", a3 = nodelist;
  char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "scontrol", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (spawned != 0) {
    close(pipe_fds[0]);
    return ErrnoStatus("cannot run scontrol show hostnames (is Slurm's scontrol on PATH?)",
                       spawned);
  }
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool timed_out = false;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{pipe_fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      timed_out = true;
      break;
    }
    char buf[4096];
    const ssize_t n = read(pipe_fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) return DeadlineExceeded("scontrol show hostnames did not finish within 10 s");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Unavailable("scontrol show hostnames '" + nodelist + "' failed (exit status " +
                       std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  }
  std::vector<std::string> hosts;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) hosts.push_back(line);
  }
  return hosts;
}

}  // namespace sparsync
