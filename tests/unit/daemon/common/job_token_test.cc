// The job token's sources and the private files behind them (issue 16, D2, D3).
#include "daemon/common/job_token.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "daemon/common/private_files.h"

namespace sparsync {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class JobTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sparsync-token-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text, mode_t mode) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

TEST(TokensEqualTest, ComparesWholeStrings) {
  EXPECT_TRUE(TokensEqual("s3cret", "s3cret"));
  EXPECT_TRUE(TokensEqual("", ""));
  EXPECT_FALSE(TokensEqual("s3cret", "s3creT"));
  EXPECT_FALSE(TokensEqual("s3cret", "s3cret-and-more"));  // a prefix is not the token
  EXPECT_FALSE(TokensEqual("s3cret", ""));
  EXPECT_FALSE(TokensEqual(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(GenerateJobTokenTest, GivesFreshHexTokens) {
  auto a = GenerateJobToken();
  auto b = GenerateJobToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(*a, *b);
}

TEST_F(JobTokenTest, NodeZeroWithoutATokenGeneratesOne) {
  Config c;
  c.num_nodes = 2;
  ASSERT_TRUE(ResolveJobToken(&c).ok());
  EXPECT_TRUE(c.job_token_generated);
  EXPECT_EQ(c.job_token.size(), 32u);
}

TEST_F(JobTokenTest, OtherNodesWithoutATokenRefuseToStart) {
  Config c;
  c.num_nodes = 2;
  c.node_rank = 1;
  Status st = ResolveJobToken(&c);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), "SPARSYNC_JOB_TOKEN_FILE")) << st.message();
}

TEST_F(JobTokenTest, TheEnvironmentsTokenIsKept) {
  Config c;
  c.job_token = "from-the-environment";
  ASSERT_TRUE(ResolveJobToken(&c).ok());
  EXPECT_EQ(c.job_token, "from-the-environment");
  EXPECT_FALSE(c.job_token_generated);
}

TEST_F(JobTokenTest, APrivateFilesFirstLineIsTheToken) {
  Config c;
  c.node_rank = 3;
  c.num_nodes = 4;
  c.job_token_file = Write("token", "abc123\n", 0600);
  ASSERT_TRUE(ResolveJobToken(&c).ok());
  EXPECT_EQ(c.job_token, "abc123");
}

TEST_F(JobTokenTest, AFileOthersCanReadIsRefusedNamingItsMode) {
  Config c;
  c.job_token_file = Write("token", "abc123\n", 0644);
  Status st = ResolveJobToken(&c);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), "0644")) << st.message();
  EXPECT_TRUE(Contains(st.message(), "chmod 600")) << st.message();
}

TEST_F(JobTokenTest, BothSourcesAtOnceAreRefused) {
  Config c;
  c.job_token = "x";
  c.job_token_file = Write("token", "y", 0600);
  EXPECT_FALSE(ResolveJobToken(&c).ok());
}

TEST_F(JobTokenTest, AnEmptyOrOversizedFileIsRefused) {
  for (const std::string& text : {std::string("\n"), std::string(65, 'x')}) {
    Config c;
    c.job_token_file = Write("token", text, 0600);
    EXPECT_FALSE(ResolveJobToken(&c).ok()) << text.size();
  }
}

TEST_F(JobTokenTest, ASymbolicLinkIsNotFollowed) {
  Config c;
  std::string target = Write("target", "abc", 0600);
  c.job_token_file = dir_ + "/link";
  ASSERT_EQ(symlink(target.c_str(), c.job_token_file.c_str()), 0);
  EXPECT_FALSE(ResolveJobToken(&c).ok());
}

// Needs root to give a file away; without it the check of the owner cannot be shown.
TEST_F(JobTokenTest, AFileOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a file of another user's";
  Config c;
  c.job_token_file = Write("token", "abc", 0600);
  ASSERT_EQ(chown(c.job_token_file.c_str(), 65534, 65534), 0);
  Status st = ResolveJobToken(&c);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), "belongs to")) << st.message();
}

TEST_F(JobTokenTest, PrivateDirectoriesAreCreatedOrChecked) {
  const std::string fresh = dir_ + "/a/b";
  ASSERT_TRUE(EnsurePrivateDirectory(fresh, "the test directory").ok());
  struct stat st {};
  ASSERT_EQ(stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(chmod(fresh.c_str(), 0755), 0);
  Status open = EnsurePrivateDirectory(fresh, "the test directory");
  ASSERT_FALSE(open.ok());
  EXPECT_TRUE(Contains(open.message(), "0755")) << open.message();
}

TEST_F(JobTokenTest, WritePrivateFileReplacesOnlyItsOwnRegularFiles) {
  const std::string path = dir_ + "/t";
  ASSERT_TRUE(WritePrivateFile(path, "one").ok());
  ASSERT_TRUE(WritePrivateFile(path, "two").ok());  // a stale one of ours is replaced
  auto read = ReadPrivateFile(path, "test", 10);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(*read, "two");
  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  EXPECT_FALSE(WritePrivateFile(path, "three").ok());
  EXPECT_TRUE(std::filesystem::is_directory(path)) << "left alone";
}

}  // namespace
}  // namespace sparsync
