// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) with the project's
// own encoders, so that every seed is a well-formed input the fuzzer mutates from:
//   build-fuzz/tests/fuzz/fuzz_write_seeds tests/fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/intake/codec.h"
#include "daemon/pipeline/sparse_payload.h"
#include "sparsync/v1/coordinator.pb.h"

namespace {

using Bytes = std::vector<uint8_t>;

void Save(const std::filesystem::path& dir, const std::string& name, const Bytes& bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
Bytes Datagram(const T& msg, uint8_t fds = 0) {
  Bytes out{fds};
  const auto* p = reinterpret_cast<const uint8_t*>(&msg);
  out.insert(out.end(), p, p + sizeof(msg));
  return out;
}

void IntakeSeeds(const std::filesystem::path& dir) {
  using sparsync::intake::FillHeader;
  sparsync_hello hello{};
  FillHeader(&hello.header, SPARSYNC_MSG_HELLO, sizeof(hello));
  hello.token_len = 6;
  std::memcpy(hello.job_token, "s3cret", 6);
  Save(dir, "hello", Datagram(hello));
  sparsync_register_msg reg{};
  FillHeader(&reg.header, SPARSYNC_MSG_REGISTER, sizeof(reg));
  reg.tensor_id = 3;
  reg.op = SPARSYNC_OP_GRADIENT;
  reg.ndim = 2;
  reg.shape[0] = 512;
  reg.shape[1] = 784;
  reg.name_len = 10;
  std::memcpy(reg.name, "fc1.weight", 10);
  reg.compressor = SPARSYNC_COMPRESSOR_TOPK;
  reg.density = 0.01f;
  Save(dir, "register_gradient", Datagram(reg));
  sparsync_register_msg cuda = reg;
  cuda.memory = SPARSYNC_MEMORY_CUDA;
  cuda.cuda_device = 1;
  cuda.cuda_memory[0] = 1;
  cuda.cuda_ready_event[0] = 1;
  Save(dir, "register_cuda", Datagram(cuda));
  sparsync_register_msg gather = reg;
  gather.op = SPARSYNC_OP_ALLGATHER;
  gather.compressor = 0;
  gather.density = 0;
  gather.dtype = SPARSYNC_INT64;
  gather.reduce_op = SPARSYNC_REDUCE_SUM;
  Save(dir, "register_allgather", Datagram(gather));
  sparsync_ready ready{};
  FillHeader(&ready.header, SPARSYNC_MSG_READY, sizeof(ready));
  ready.tensor_id = 3;
  ready.round = 1;
  Save(dir, "ready", Datagram(ready));
  sparsync_unregister_msg unreg{};
  FillHeader(&unreg.header, SPARSYNC_MSG_UNREGISTER, sizeof(unreg));
  Save(dir, "unregister", Datagram(unreg));
  sparsync_goodbye bye{};
  FillHeader(&bye.header, SPARSYNC_MSG_GOODBYE, sizeof(bye));
  Save(dir, "goodbye", Datagram(bye));
  Save(dir, "hello_with_fd", Datagram(hello, 1));
  sparsync_timeline_msg timeline{};
  FillHeader(&timeline.header, SPARSYNC_MSG_TIMELINE, sizeof(timeline));
  timeline.start = 1;
  timeline.path_len = 15;
  std::memcpy(timeline.path, "/tmp/trace.json", 15);
  Save(dir, "timeline_start", Datagram(timeline));
  sparsync_timeline_msg stop{};
  FillHeader(&stop.header, SPARSYNC_MSG_TIMELINE, sizeof(stop));
  Save(dir, "timeline_stop", Datagram(stop));
}

void PayloadSeeds(const std::filesystem::path& dir) {
  using namespace sparsync::pipeline;
  const std::vector<int32_t> indices{0, 1, 2, 130, 4000, 70000};
  const std::vector<float> values{0.5f, -1.25f, 3.0f, -0.5f, 0.5f, -0.5f};
  SparseTensor t{100000, indices, values};
  int n = 0;
  for (auto ic : {sparsync::IndexCoding::kRaw32, sparsync::IndexCoding::kDeltaVarint}) {
    for (auto vc : {ValueCoding::kFloat32, ValueCoding::kFloat16, ValueCoding::kSignScale}) {
      Bytes out(MaxEncodedBytes(t.numel, 6, ic, vc));
      auto written = Encode(t, ic, vc, out);
      if (!written.ok()) continue;
      out.resize(*written);
      Save(dir, "payload" + std::to_string(n++), out);
    }
  }
  SparseTensor empty{10, {}, {}};
  Bytes out(MaxEncodedBytes(10, 0, sparsync::IndexCoding::kDeltaVarint, ValueCoding::kFloat32));
  auto written = Encode(empty, sparsync::IndexCoding::kDeltaVarint, ValueCoding::kFloat32, out);
  if (written.ok()) {
    out.resize(*written);
    Save(dir, "payload_empty", out);
  }
}

// One coordinator record: [rpc][node][length (2 bytes)][request].
void Record(Bytes* out, uint8_t rpc, uint8_t node, const google::protobuf::Message& req) {
  const std::string body = req.SerializeAsString();
  out->push_back(rpc);
  out->push_back(node);
  out->push_back(static_cast<uint8_t>(body.size()));
  out->push_back(static_cast<uint8_t>(body.size() >> 8));
  out->insert(out->end(), body.begin(), body.end());
}

void CoordinatorSeeds(const std::filesystem::path& dir) {
  namespace v1 = sparsync::v1;
  Bytes job;
  for (uint8_t node = 0; node < 3; ++node) {
    v1::JoinRequest join;
    join.set_protocol_version(1);
    join.set_num_nodes(3);
    join.set_local_size(2);
    Record(&job, 0, node, join);
  }
  for (int step = 0; step < 4; ++step) {
    for (uint8_t node = 0; node < 3; ++node) {
      v1::ReportRequest report;
      if (step == 0) {
        for (const char* name : {"fc1.weight", "fc1.bias"}) {
          v1::TensorMeta* m = report.add_new_tensors();
          m->set_name(name);
          m->set_op(SPARSYNC_OP_GRADIENT);
          m->add_shape(64);
        }
        report.add_ready()->set_new_index(0);
        report.add_ready()->set_new_index(1);
      } else {
        report.add_ready()->set_slot(1);
        report.add_ready()->set_slot(2);
      }
      Record(&job, 3, node, report);
      v1::PollRequest poll;
      poll.set_after_seq(static_cast<uint64_t>(step));
      Record(&job, 4, node, poll);
    }
    Record(&job, 7, 0, v1::PollRequest());  // a tick
  }
  Save(dir, "three_nodes_four_steps", job);
  Bytes failing = job;
  v1::FailRequest fail;
  fail.set_message("worker local rank 1 (pid 42) on node 2 died");
  fail.set_code(5);
  Record(&failing, 5, 2, fail);
  Record(&failing, 6, 1, v1::LeaveRequest());
  Save(dir, "then_a_failure", failing);
  // Rank news: node 2's ranks join, rank 3 (node 1) goes and comes back, rank 2 goes, and node 0
  // reports the tensors again.
  Bytes ranks = job;
  v1::ReportRequest news;
  news.add_joined_ranks(4);
  news.add_joined_ranks(5);
  Record(&ranks, 3, 2, news);
  news.Clear();
  news.add_gone_ranks(3);
  Record(&ranks, 3, 1, news);
  news.Clear();
  news.add_back_ranks(3);
  news.add_gone_ranks(2);
  Record(&ranks, 3, 1, news);
  news.Clear();
  news.add_ready()->set_slot(1);
  news.add_ready()->set_slot(2);
  Record(&ranks, 3, 0, news);
  Record(&ranks, 7, 0, v1::PollRequest());
  Save(dir, "joins_and_departures", ranks);
  Bytes store;
  v1::StoreSetRequest set;
  set.set_key("gloo/0");
  set.set_value("addr");
  Record(&store, 1, 0, set);
  v1::StoreGetRequest get;
  get.add_keys("gloo/0");
  Record(&store, 2, 1, get);
  Record(&store, 2, 0x81, get);  // without the token
  Save(dir, "store", store);
}

void ConfigSeeds(const std::filesystem::path& dir) {
  auto seed = [&](const std::string& name, const std::vector<std::string>& args,
                  const std::vector<std::string>& env) {
    Bytes out{static_cast<uint8_t>(args.size())};
    for (const auto& a : args) {
      out.push_back(0);
      out.insert(out.end(), a.begin(), a.end());
    }
    for (const auto& e : env) {
      out.push_back(0);
      out.insert(out.end(), e.begin(), e.end());
    }
    Save(dir, name, out);
  };
  seed("defaults", {}, {});
  seed("flags", {"--num-nodes", "4", "--node-rank", "2", "--compressor", "dgc", "--merge",
                 "fixed:64MiB,omgs"},
       {});
  seed("environment", {}, {"SPARSYNC_DENSITY=0.01", "SPARSYNC_MIN_COMPRESS_BYTES=64KiB",
                           "SPARSYNC_TIMEOUT_S=30", "SPARSYNC_JOB_TOKEN=abc",
                           "XDG_RUNTIME_DIR=/run/user/7"});
  seed("tls", {"--tls-cert", "c.pem"}, {"SPARSYNC_TLS_KEY=k.pem", "SPARSYNC_TLS_CA=ca.pem"});
  seed("refused_token_flag", {"--job-token", "s3cret"}, {});
  seed("help", {"--help"}, {});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  IntakeSeeds(root / "intake_decode");
  PayloadSeeds(root / "sparse_payload");
  CoordinatorSeeds(root / "coordinator");
  ConfigSeeds(root / "config");
  return 0;
}
