// Slurm: what a daemon started by srun (one task per node) takes from Slurm's variables when the
// SPARSYNC_* variables and flags do not say it (config.h applies it; docs/operations.md):
//   node rank     SLURM_NODEID
//   node count    SLURM_STEP_NUM_NODES, else SLURM_JOB_NUM_NODES, else SLURM_NNODES
//   coordinator   the first host of SLURM_STEP_NODELIST, else of SLURM_JOB_NODELIST (expanded by
//                 `scontrol show hostnames`), port 29400 + SLURM_JOB_ID % 1000, so that two jobs
//                 sharing a node do not collide
//   listen        SLURMD_NODENAME, this node's name in Slurm
// One daemon per node: a task with SLURM_LOCALID > 0 is a second one on its node, an error.
// Pure functions of the variables given, except ScontrolHostnames, which runs scontrol.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "daemon/common/status.h"

namespace sparsync {

struct SlurmStep {
  int node_rank = 0;
  int num_nodes = 1;
  std::string nodelist;   // the hostlist expression the coordinator's host comes from
  std::string node_name;  // SLURMD_NODENAME ("" if unset)
  int coordinator_port = 29400;
};

// Expands a Slurm hostlist expression ("node[01-03],gpu7") into host names, in order.
using HostnamesFn = std::function<Result<std::vector<std::string>>(const std::string& nodelist)>;

// The step this process runs in, or nullopt when it is not a Slurm task (no SLURM_JOB_ID or no
// SLURM_NODEID). A variable that is set but malformed is an error naming it.
Result<std::optional<SlurmStep>> ReadSlurmStep(const std::map<std::string, std::string>& env);

// The first host of `step.nodelist`, through `expand`; errors name the variable and what to set.
Result<std::string> SlurmCoordinatorHost(const SlurmStep& step, const HostnamesFn& expand);

// Runs `scontrol show hostnames <nodelist>` (scontrol found on PATH), at most 10 s.
Result<std::vector<std::string>> ScontrolHostnames(const std::string& nodelist);

}  // namespace sparsync
