#include "daemon/observe/trace_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace sparsync::observe {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class TraceFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/trace-file-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/t.json";
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  std::string dir_, path_;
};

// The file is a JSON array at every moment between appends: empty, after one, after several.
TEST_F(TraceFileTest, IsAValidJsonArrayAfterEveryAppend) {
  auto file = TraceFile::Create(path_);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(nlohmann::json::parse(Read(path_)), nlohmann::json::array());
  ASSERT_TRUE((*file)->Append("{\"a\":1}").ok());
  EXPECT_EQ(nlohmann::json::parse(Read(path_)), nlohmann::json::parse("[{\"a\":1}]"));
  ASSERT_TRUE((*file)->Append("").ok());  // nothing
  ASSERT_TRUE((*file)->Append("{\"b\":2},\n{\"c\":\"]\"}").ok());
  ASSERT_TRUE((*file)->Append("{\"d\":[4]}").ok());
  EXPECT_EQ(nlohmann::json::parse(Read(path_)),
            nlohmann::json::parse(R"([{"a":1},{"b":2},{"c":"]"},{"d":[4]}])"));
  // Nothing is buffered: the content is there before the object goes.
  file->reset();
  EXPECT_EQ(nlohmann::json::parse(Read(path_)).size(), 4u);
}

TEST_F(TraceFileTest, TruncatesAnOldFile) {
  { std::ofstream(path_) << std::string(5000, 'x'); }
  auto file = TraceFile::Create(path_);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append("{}").ok());
  EXPECT_EQ(Read(path_), "[\n{}\n]\n");
}

TEST_F(TraceFileTest, ACreateErrorNamesTheFile) {
  auto file = TraceFile::Create(dir_ + "/no/such/dir/t.json");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("no/such/dir/t.json"), std::string::npos)
      << file.status().message();
}

}  // namespace
}  // namespace sparsync::observe
