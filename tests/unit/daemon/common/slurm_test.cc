#include "daemon/common/slurm.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "daemon/common/config.h"

namespace sparsync {
namespace {

using Env = std::map<std::string, std::string>;

// What srun gives a task of a 3-node step of job 4242 on node "gpu2".
Env SrunTask() {
  return {{"SLURM_JOB_ID", "4242"},        {"SLURM_NODEID", "1"},
          {"SLURM_JOB_NUM_NODES", "4"},    {"SLURM_STEP_NUM_NODES", "3"},
          {"SLURM_JOB_NODELIST", "gpu[1-4]"}, {"SLURM_STEP_NODELIST", "gpu[1-3]"},
          {"SLURMD_NODENAME", "gpu2"},     {"XDG_RUNTIME_DIR", "/run/user/7"}};
}

// Stands in for scontrol: gpu[1-3] -> gpu1 gpu2 gpu3, anything else fails.
Result<std::vector<std::string>> Expand(const std::string& list) {
  if (list == "gpu[1-3]") return std::vector<std::string>{"gpu1", "gpu2", "gpu3"};
  if (list == "gpu[1-4]") return std::vector<std::string>{"gpu1", "gpu2", "gpu3", "gpu4"};
  return InvalidArgument("cannot expand '" + list + "'");
}

ParsedConfig Parse(const Env& env, std::vector<const char*> args = {}) {
  args.insert(args.begin(), "sparsyncd");
  return ParseConfig(static_cast<int>(args.size()), args.data(), env, Expand);
}

TEST(SlurmTest, NotATaskWithoutJobIdAndNodeId) {
  auto step = ReadSlurmStep({{"SLURM_JOB_ID", "1"}});  // e.g. the shell of salloc
  ASSERT_TRUE(step.ok());
  EXPECT_FALSE(step->has_value());
  step = ReadSlurmStep({});
  ASSERT_TRUE(step.ok());
  EXPECT_FALSE(step->has_value());
}

// The step's node count and list win over the job's: the daemons may run on part of the job.
TEST(SlurmTest, ReadsTheStep) {
  auto step = ReadSlurmStep(SrunTask());
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  ASSERT_TRUE(step->has_value());
  EXPECT_EQ((*step)->node_rank, 1);
  EXPECT_EQ((*step)->num_nodes, 3);
  EXPECT_EQ((*step)->nodelist, "gpu[1-3]");
  EXPECT_EQ((*step)->node_name, "gpu2");
  EXPECT_EQ((*step)->coordinator_port, 29400 + 242);
  Env job_only = SrunTask();
  job_only.erase("SLURM_STEP_NUM_NODES");
  job_only.erase("SLURM_STEP_NODELIST");
  step = ReadSlurmStep(job_only);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ((*step)->num_nodes, 4);
  EXPECT_EQ((*step)->nodelist, "gpu[1-4]");
}

// srun with the job's K tasks per node would start K daemons on each node: all but one refuse.
TEST(SlurmTest, ASecondDaemonOnANodeIsRefused) {
  Env env = SrunTask();
  env["SLURM_LOCALID"] = "0";
  EXPECT_TRUE(ReadSlurmStep(env).ok());
  env["SLURM_LOCALID"] = "1";
  auto step = ReadSlurmStep(env);
  ASSERT_FALSE(step.ok());
  EXPECT_NE(step.status().message().find("--ntasks-per-node=1"), std::string::npos)
      << step.status().message();
}

TEST(SlurmTest, AMalformedVariableIsNamed) {
  Env env = SrunTask();
  env["SLURM_NODEID"] = "one";
  auto step = ReadSlurmStep(env);
  ASSERT_FALSE(step.ok());
  EXPECT_NE(step.status().message().find("SLURM_NODEID"), std::string::npos);
  env = SrunTask();
  env.erase("SLURM_STEP_NUM_NODES");
  env.erase("SLURM_JOB_NUM_NODES");
  step = ReadSlurmStep(env);
  ASSERT_FALSE(step.ok());
  EXPECT_NE(step.status().message().find("SPARSYNC_NUM_NODES"), std::string::npos);
}

// Under srun the daemon needs no SPARSYNC_* for its place in the job.
TEST(SlurmTest, ConfigTakesNodeCoordinatorAndListenFromSlurm) {
  ParsedConfig p = Parse(SrunTask());
  ASSERT_FALSE(p.exit) << p.message;
  EXPECT_EQ(p.config.node_rank, 1);
  EXPECT_EQ(p.config.num_nodes, 3);
  EXPECT_EQ(p.config.coordinator, "gpu1:29642");
  EXPECT_EQ(p.config.listen, "gpu2");
  EXPECT_TRUE(p.config.from_slurm);
  EXPECT_NE(p.config.Describe().find("Slurm"), std::string::npos);
}

// SPARSYNC_* and flags win over Slurm, and a coordinator that is given needs no expansion.
TEST(SlurmTest, SparsyncVariablesAndFlagsWin) {
  Env env = SrunTask();
  env["SPARSYNC_COORDINATOR"] = "10.0.0.1:1234";
  env["SPARSYNC_LISTEN"] = "10.0.0.2";
  env["SPARSYNC_NUM_NODES"] = "5";
  env["SLURM_STEP_NODELIST"] = "cannot[expand";
  ParsedConfig p = Parse(env, {"--node-rank", "4"});
  ASSERT_FALSE(p.exit) << p.message;
  EXPECT_EQ(p.config.node_rank, 4);
  EXPECT_EQ(p.config.num_nodes, 5);
  EXPECT_EQ(p.config.coordinator, "10.0.0.1:1234");
  EXPECT_EQ(p.config.listen, "10.0.0.2");
}

TEST(SlurmTest, ANodeListThatCannotBeExpandedStopsTheDaemonSayingWhatToSet) {
  Env env = SrunTask();
  env["SLURM_STEP_NODELIST"] = "cannot[expand";
  ParsedConfig p = Parse(env);
  ASSERT_TRUE(p.exit);
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.message.find("cannot[expand"), std::string::npos) << p.message;
  EXPECT_NE(p.message.find("SPARSYNC_COORDINATOR"), std::string::npos) << p.message;
  // Outside Slurm nothing of it is looked at.
  ParsedConfig plain = Parse({{"SLURM_STEP_NODELIST", "cannot[expand"}});
  EXPECT_FALSE(plain.exit) << plain.message;
  EXPECT_EQ(plain.config.coordinator, "127.0.0.1:29400");
}

// ScontrolHostnames runs the scontrol it finds on PATH (here a script standing in for it, so
// that the test needs no Slurm configuration) and keeps its order.
TEST(SlurmTest, ScontrolHostnamesRunsScontrol) {
  char dir[] = "/tmp/fake-scontrol-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string script = std::string(dir) + "/scontrol";
  {
    std::ofstream out(script);
    out << "#!/bin/sh\n"
           "[ \"$1 $2\" = \"show hostnames\" ] || exit 3\n"
           "case \"$3\" in\n"
           "  'n[2-3],a1') printf 'n2\\nn3\\na1\\n' ;;\n"
           "  *) echo \"bad list $3\" >&2; exit 1 ;;\n"
           "esac\n";
  }
  chmod(script.c_str(), 0755);
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  setenv("PATH", (std::string(dir) + ":" + saved).c_str(), 1);
  auto hosts = ScontrolHostnames("n[2-3],a1");
  auto bad = ScontrolHostnames("zz");
  setenv("PATH", saved.c_str(), 1);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(hosts.ok()) << hosts.status().ToString();
  EXPECT_EQ(*hosts, (std::vector<std::string>{"n2", "n3", "a1"}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("zz"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace sparsync
