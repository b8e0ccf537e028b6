#include "daemon/common/config.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace sparsync {
namespace {

ParsedConfig Parse(std::vector<const char*> args, std::map<std::string, std::string> env = {}) {
  args.insert(args.begin(), "sparsyncd");
  return ParseConfig(static_cast<int>(args.size()), args.data(), env);
}

TEST(ConfigTest, DefaultsWithoutFlagsOrEnvironment) {
  ParsedConfig p = Parse({}, {{"XDG_RUNTIME_DIR", "/run/user/7"}});
  ASSERT_FALSE(p.exit) << p.message;
  EXPECT_EQ(p.config.node_rank, 0);
  EXPECT_EQ(p.config.num_nodes, 1);
  EXPECT_EQ(p.config.local_size, 1);
  EXPECT_EQ(p.config.merge.bucket_bytes, 64ull << 20);
  EXPECT_EQ(p.config.timeout_s, 300);
  EXPECT_EQ(p.config.stall_warn_s, 60);
  EXPECT_EQ(p.config.socket_path, "/run/user/7/sparsync/sparsyncd.sock");
  // Sparse by default: top-k at density 0.001 with error feedback, as OMGS-SGD runs it.
  EXPECT_EQ(p.config.compressor, Compressor::kTopK);
  EXPECT_EQ(p.config.density, 0.001);
  EXPECT_TRUE(p.config.ErrorFeedback());
  EXPECT_EQ(p.config.local_nccl, true);
}

// --help states each default; setting every variable to the value it states must change nothing.
TEST(ConfigTest, TheDefaultsHelpStatesAreTheDefaults) {
  ParsedConfig help = Parse({"--help"});
  // Each option's help ends "[env SPARSYNC_X, default VALUE]". (No std::regex: GCC 12 warns
  // inside it under the sanitizers.)
  std::map<std::string, std::string> env{{"XDG_RUNTIME_DIR", "/run/user/7"}};
  const std::string& text = help.message;
  const std::string open = "[env ", middle = ", default ";
  for (size_t at = text.find(open); at != std::string::npos; at = text.find(open, at + 1)) {
    size_t comma = text.find(middle, at);
    size_t close = text.find(']', at);
    ASSERT_TRUE(comma != std::string::npos && close != std::string::npos && comma < close);
    const std::string var = text.substr(at + open.size(), comma - at - open.size());
    if (var == "SPARSYNC_SOCKET" || var == "SPARSYNC_JOB_TOKEN") continue;  // described in words
    env[var] = text.substr(comma + middle.size(), close - comma - middle.size());
  }
  ASSERT_GE(env.size(), 28u) << help.message;
  ParsedConfig given = Parse({}, env);
  ASSERT_FALSE(given.exit) << given.message;
  const Config& a = given.config;
  const Config b = Parse({}, {{"XDG_RUNTIME_DIR", "/run/user/7"}}).config;
  EXPECT_EQ(a.Describe(), b.Describe());
  EXPECT_EQ(a.compressor, b.compressor);
  EXPECT_EQ(a.density, b.density);
  EXPECT_EQ(a.threshold, b.threshold);
  EXPECT_EQ(a.error_feedback, b.error_feedback);
  EXPECT_EQ(a.value_dtype, b.value_dtype);
  EXPECT_EQ(a.index_coding, b.index_coding);
  EXPECT_EQ(a.min_compress_bytes, b.min_compress_bytes);
  EXPECT_EQ(a.nonfinite, b.nonfinite);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.merge.planners, b.merge.planners);
  EXPECT_EQ(a.merge.warmup_steps, b.merge.warmup_steps);
  EXPECT_EQ(a.merge.replan_drift, b.merge.replan_drift);
  EXPECT_EQ(a.merge.replan_steps, b.merge.replan_steps);
  EXPECT_EQ(a.merge.calibrate, b.merge.calibrate);
  EXPECT_EQ(a.transport, b.transport);
  EXPECT_EQ(a.timeout_s, b.timeout_s);
  EXPECT_EQ(a.stall_warn_s, b.stall_warn_s);
  EXPECT_EQ(a.cycle_ms, b.cycle_ms);
  EXPECT_EQ(a.log_level, b.log_level);
  EXPECT_EQ(a.cudart, b.cudart);
  EXPECT_EQ(a.local_nccl, b.local_nccl);
  EXPECT_EQ(a.libnccl, b.libnccl);
  EXPECT_EQ(a.device_sparsify, b.device_sparsify);
  EXPECT_EQ(a.sparsify_library, b.sparsify_library);
}

TEST(ConfigTest, EnvironmentOverridesDefaultsAndFlagsOverrideEnvironment) {
  std::map<std::string, std::string> env = {{"SPARSYNC_NUM_NODES", "4"},
                                            {"SPARSYNC_NODE_RANK", "2"},
                                            {"SPARSYNC_TIMEOUT_S", "12.5"},
                                            {"SPARSYNC_MERGE", "fixed:1MiB"}};
  ParsedConfig p = Parse({"--node-rank", "3"}, env);
  ASSERT_FALSE(p.exit) << p.message;
  EXPECT_EQ(p.config.num_nodes, 4);
  EXPECT_EQ(p.config.node_rank, 3);
  EXPECT_DOUBLE_EQ(p.config.timeout_s, 12.5);
  EXPECT_EQ(p.config.merge.bucket_bytes, 1ull << 20);
}

TEST(ConfigTest, MergeAcceptsPlainBytesAndSuffixes) {
  EXPECT_EQ(Parse({"--merge", "fixed:4096"}).config.merge.bucket_bytes, 4096u);
  EXPECT_EQ(Parse({"--merge", "fixed:512KiB"}).config.merge.bucket_bytes, 512u << 10);
  EXPECT_EQ(Parse({"--merge", "fixed:2GiB"}).config.merge.bucket_bytes, 2ull << 30);
}

TEST(ConfigTest, CompressIsAutoOrAlways) {
  Config auto_mode = Parse({}).config;
  EXPECT_FALSE(auto_mode.merge.compress_always);
  EXPECT_TRUE(auto_mode.ChoosesDense()) << "top-k by default: dense where faster";
  Config always = Parse({}, {{"SPARSYNC_COMPRESS", "always"}}).config;
  EXPECT_TRUE(always.merge.compress_always);
  EXPECT_FALSE(always.ChoosesDense());
  EXPECT_FALSE(Parse({"--compressor", "none"}).config.ChoosesDense());
  EXPECT_FALSE(Parse({"--compressor", "dgc"}).config.ChoosesDense());
  ParsedConfig bad = Parse({}, {{"SPARSYNC_COMPRESS", "sometimes"}});
  EXPECT_TRUE(bad.exit);
  EXPECT_NE(bad.message.find("auto, always"), std::string::npos) << bad.message;
}

TEST(ConfigTest, MergeNamesAPlannerOrAList) {
  EXPECT_EQ(Parse({}).config.merge.planners, std::vector<std::string>{"optimal"});
  EXPECT_EQ(Parse({"--merge", "fixed:4096"}).config.merge.planners,
            std::vector<std::string>{"fixed"});
  MergePolicy list = Parse({"--merge", "layerwise,fixed:1KiB,optimal"}).config.merge;
  EXPECT_EQ(list.planners, (std::vector<std::string>{"layerwise", "fixed", "optimal"}));
  EXPECT_EQ(list.bucket_bytes, 1024u);
  for (const char* bad : {"", "omgs,", "greedy", "omgs,,single", "fixed:", "fixed:-3"}) {
    ParsedConfig p = Parse({}, {{"SPARSYNC_MERGE", bad}});
    EXPECT_TRUE(p.exit) << bad;
    EXPECT_NE(p.message.find("SPARSYNC_MERGE"), std::string::npos) << p.message;
  }
  ParsedConfig p = Parse({}, {{"SPARSYNC_PLAN_WARMUP_STEPS", "3"},
                              {"SPARSYNC_REPLAN_STEPS", "10"},
                              {"SPARSYNC_REPLAN_DRIFT", "0.5"},
                              {"SPARSYNC_CALIBRATE", "0"}});
  ASSERT_FALSE(p.exit) << p.message;
  EXPECT_EQ(p.config.merge.warmup_steps, 3);
  EXPECT_EQ(p.config.merge.replan_steps, 10);
  EXPECT_DOUBLE_EQ(p.config.merge.replan_drift, 0.5);
  EXPECT_FALSE(p.config.merge.calibrate);
  EXPECT_TRUE(Parse({}, {{"SPARSYNC_PLAN_WARMUP_STEPS", "0"}}).exit);
}

TEST(ConfigTest, DensityWarmupIsOffByDefaultAndTakesSteps) {
  EXPECT_EQ(Parse({}).config.density_warmup_steps, 0);
  ParsedConfig p = Parse({}, {{"SPARSYNC_DENSITY_WARMUP_STEPS", "936"}});
  ASSERT_FALSE(p.exit) << p.message;
  EXPECT_EQ(p.config.density_warmup_steps, 936);
  EXPECT_EQ(Parse({"--density-warmup-steps", "10"}).config.density_warmup_steps, 10);
}

struct BadValue {
  std::string env;
  std::string value;
  std::string must_mention;
};

class ConfigRejectsTest : public ::testing::TestWithParam<BadValue> {};

TEST_P(ConfigRejectsTest, NamesTheVariableAndTheAcceptedValues) {
  const BadValue& bad = GetParam();
  ParsedConfig p = Parse({}, {{bad.env, bad.value}});
  ASSERT_TRUE(p.exit);
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.message.find(bad.env), std::string::npos) << p.message;
  EXPECT_NE(p.message.find(bad.must_mention), std::string::npos) << p.message;
}

INSTANTIATE_TEST_SUITE_P(
    Values, ConfigRejectsTest,
    ::testing::Values(BadValue{"SPARSYNC_COMPRESSOR", "zip", "none, topk, randomk"},
                      BadValue{"SPARSYNC_DENSITY", "0", "(0, 1]"},
                      BadValue{"SPARSYNC_DENSITY", "1.5", "(0, 1]"},
                      BadValue{"SPARSYNC_DENSITY_WARMUP_STEPS", "-1", "[0, 1000000000]"},
                      BadValue{"SPARSYNC_DENSITY_WARMUP_STEPS", "many", "integer"},
                      BadValue{"SPARSYNC_ERROR_FEEDBACK", "yes", "auto, 1, 0"},
                      BadValue{"SPARSYNC_VALUE_DTYPE", "int8", "float32, float16"},
                      BadValue{"SPARSYNC_INDEX_CODING", "zip", "raw, delta"},
                      BadValue{"SPARSYNC_MIN_COMPRESS_BYTES", "lots", "byte count"},
                      BadValue{"SPARSYNC_NONFINITE", "ignore", "error, skip"},
                      BadValue{"SPARSYNC_EMULATE_SELECT_COST", "-1e-10", "[0, 1e-3]"},
                      BadValue{"SPARSYNC_EMULATE_SELECT_COST", "nan", "[0, 1e-3]"},
                      BadValue{"SPARSYNC_MERGE", "fixed:-3", "fixed:BYTES"},
                      BadValue{"SPARSYNC_MERGE", "bogus", "fixed:BYTES"},
                      BadValue{"SPARSYNC_NUM_NODES", "0", "[1, 65536]"},
                      BadValue{"SPARSYNC_NODE_RANK", "two", "integer"},
                      BadValue{"SPARSYNC_TIMEOUT_S", "-1", "positive"},
                      BadValue{"SPARSYNC_TRANSPORT", "mpi", "auto, gloo"},
                      BadValue{"SPARSYNC_LOG_LEVEL", "loud", "trace, debug"},
                      BadValue{"SPARSYNC_COORDINATOR", "nohost", "host:port"}));

TEST(ConfigTest, ErrorFeedbackDefaultsFollowTheCompressor) {
  EXPECT_TRUE(Parse({"--compressor", "topk"}).config.ErrorFeedback());
  EXPECT_TRUE(Parse({"--compressor", "randomk"}).config.ErrorFeedback());
  EXPECT_FALSE(Parse({"--compressor", "wangni"}).config.ErrorFeedback());
  EXPECT_FALSE(Parse({"--compressor", "dgc"}).config.ErrorFeedback());
  EXPECT_TRUE(Parse({"--compressor", "wangni"}, {{"SPARSYNC_ERROR_FEEDBACK", "1"}}).config.ErrorFeedback());
  EXPECT_FALSE(Parse({"--compressor", "topk", "--error-feedback", "0"}).config.ErrorFeedback());
}

TEST(ConfigTest, TheEmulatedSelectionCostIsOffUnlessSet) {
  EXPECT_EQ(Parse({}).config.emulated_select_cost, 0);
  EXPECT_DOUBLE_EQ(
      Parse({}, {{"SPARSYNC_EMULATE_SELECT_COST", "2.19e-10"}}).config.emulated_select_cost,
      2.19e-10);
}

TEST(ConfigTest, NodeRankMustBeBelowNodeCount) {
  ParsedConfig p = Parse({"--num-nodes", "2", "--node-rank", "2"});
  ASSERT_TRUE(p.exit);
  EXPECT_NE(p.message.find("SPARSYNC_NODE_RANK"), std::string::npos);
  EXPECT_NE(p.message.find("SPARSYNC_NUM_NODES"), std::string::npos);
}

TEST(ConfigTest, HelpListsEveryVariableWithItsDefault) {
  ParsedConfig p = Parse({"--help"});
  ASSERT_TRUE(p.exit);
  EXPECT_EQ(p.exit_code, 0);
  for (const char* var : {"SPARSYNC_NODE_RANK", "SPARSYNC_NUM_NODES", "SPARSYNC_COORDINATOR",
                          "SPARSYNC_LISTEN", "SPARSYNC_SOCKET", "SPARSYNC_COMPRESSOR",
                          "SPARSYNC_MERGE", "SPARSYNC_TIMEOUT_S", "SPARSYNC_STALL_WARN_S",
                          "SPARSYNC_JOB_TOKEN", "SPARSYNC_LOG_LEVEL", "SPARSYNC_LOCAL_SIZE",
                          "SPARSYNC_DENSITY", "SPARSYNC_ERROR_FEEDBACK", "SPARSYNC_VALUE_DTYPE",
                          "SPARSYNC_INDEX_CODING", "SPARSYNC_MIN_COMPRESS_BYTES",
                          "SPARSYNC_NONFINITE"}) {
    EXPECT_NE(p.message.find(var), std::string::npos) << var;
  }
  EXPECT_NE(p.message.find("default optimal"), std::string::npos);
  EXPECT_NE(p.message.find("env SPARSYNC_COMPRESS, default auto"), std::string::npos);
  for (const char* var : {"SPARSYNC_PLAN_WARMUP_STEPS", "SPARSYNC_DENSITY_WARMUP_STEPS",
                          "SPARSYNC_REPLAN_DRIFT",
                          "SPARSYNC_REPLAN_STEPS", "SPARSYNC_CALIBRATE"}) {
    EXPECT_NE(p.message.find(var), std::string::npos) << var;
  }
}

TEST(ConfigTest, UnknownFlagIsAnError) {
  ParsedConfig p = Parse({"--no-such-flag"});
  ASSERT_TRUE(p.exit);
  EXPECT_EQ(p.exit_code, 2);
}

}  // namespace
}  // namespace sparsync

namespace sparsync {
namespace {

// A token on the command line is visible to every user in `ps` (issue 16, D3).
TEST(ConfigTest, TheJobTokenIsRefusedAsAFlag) {
  ParsedConfig p = Parse({"--job-token", "s3cret"});
  ASSERT_TRUE(p.exit);
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.message.find("ps"), std::string::npos) << p.message;
  EXPECT_NE(p.message.find("SPARSYNC_JOB_TOKEN"), std::string::npos) << p.message;
  EXPECT_EQ(p.message.find("s3cret"), std::string::npos) << "the refusal must not echo it";
  ParsedConfig env = Parse({}, {{"SPARSYNC_JOB_TOKEN", "s3cret"}});
  ASSERT_FALSE(env.exit) << env.message;
  EXPECT_EQ(env.config.job_token, "s3cret");
  ParsedConfig file = Parse({"--job-token-file", "/run/token"});
  ASSERT_FALSE(file.exit) << file.message;
  EXPECT_EQ(file.config.job_token_file, "/run/token");
}

TEST(ConfigTest, TlsNeedsItsThreeFiles) {
  ParsedConfig partial = Parse({"--tls-cert", "c.pem", "--tls-key", "k.pem"});
  ASSERT_TRUE(partial.exit);
  EXPECT_NE(partial.message.find("SPARSYNC_TLS_CA"), std::string::npos) << partial.message;
  ParsedConfig all = Parse({}, {{"SPARSYNC_TLS_CERT", "c.pem"}, {"SPARSYNC_TLS_KEY", "k.pem"},
                                {"SPARSYNC_TLS_CA", "ca.pem"}});
  ASSERT_FALSE(all.exit) << all.message;
  EXPECT_TRUE(all.config.tls.enabled());
  EXPECT_FALSE(Parse({}).config.tls.enabled());
}

TEST(ConfigTest, RegisteredBytesDefaultToTheMachinesMemory) {
  EXPECT_EQ(Parse({}).config.max_registered_bytes, 0u);
  EXPECT_EQ(Parse({"--max-registered-bytes", "2GiB"}).config.max_registered_bytes, 2ull << 30);
  EXPECT_TRUE(Parse({"--max-registered-bytes", "lots"}).exit);
}

}  // namespace
}  // namespace sparsync
