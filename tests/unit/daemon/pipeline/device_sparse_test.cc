// The device path (pipeline/device_sparse.h): a TensorTable that keeps gradients on the fake CUDA
// runtime's "device", the fake sparsification library (tests/support/fake_sparsify) and a
// one-node loopback transport (for dense groups, one that takes device memory), with this test
// playing the worker.
#include "daemon/pipeline/device_sparse.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "daemon/pipeline/dense_math.h"
#include "daemon/pipeline/executor.h"
#include "daemon/transport/loopback/loopback_transport.h"
#include "tests/unit/daemon/intake/cuda_test_fixture.h"

namespace sparsync::pipeline {
namespace {

using intake::kCudaMemcpyHostToDevice;
using intake::test::CudaStagingTest;
using intake::test::DeviceTensor;
using intake::test::kGuard;

class DeviceSparseTest : public CudaStagingTest {
 protected:
  void SetUp() override {
    CudaStagingTest::SetUp();
    allocations_before_ = fake_.Live("allocations");
    CudaOptions cuda{SPARSYNC_FAKE_CUDART, true, "", nullptr};
    cuda.keep_on_device = [](const negotiation::TensorMeta&) { return true; };
    table_ = std::make_unique<TensorTable>(
        World{0, 1, 1}, "",
        [this](ReadyNotice n) {
          std::lock_guard lock(mu_);
          notices_.push_back(n);
          changed_.notify_all();
        },
        [](const Status&) {}, std::move(cuda));
    sparsync_hello hello{};
    sparsync_hello_reply reply{};
    table_->OnHello(session_, hello, &reply);
    device_ = std::make_unique<DeviceSparse>(SPARSYNC_FAKE_SPARSIFY);
    ASSERT_TRUE(device_->LoadExplicit().ok());
    reducer_ = MakeReducer(NonFinitePolicy::kError);
  }

  void TearDown() override {
    scratch_.Clear();
    device_.reset();
    EXPECT_EQ(fake_.Live("allocations"), allocations_before_ + static_cast<int>(tensors_.size()))
        << "the device path leaked device memory";
    CudaStagingTest::TearDown();
  }

  std::unique_ptr<SparseReducer> MakeReducer(NonFinitePolicy nonfinite,
                                             ValueDType values = ValueDType::kFloat32) {
    Config config;
    config.compressor = Compressor::kTopK;
    config.density = 0.01;
    config.nonfinite = nonfinite;
    config.value_dtype = values;
    auto r = SparseReducer::Create(config, 0, 1, &transport_);
    EXPECT_TRUE(r.ok());
    return r.ok() ? std::move(*r) : nullptr;
  }

  // A round of `t` up to Resolve, with the worker's buffer holding `values`.
  std::vector<GroupMember> Round(DeviceTensor* t, uint64_t round,
                                 const std::vector<float>& values) {
    EXPECT_EQ(fake_.Memcpy(static_cast<char*>(t->alloc) + t->offset, values.data(),
                           values.size() * 4, kCudaMemcpyHostToDevice),
              0);
    EXPECT_EQ(fake_.EventRecord(t->ready, nullptr), 0);
    EXPECT_TRUE(Ready(t, round).ok());
    EXPECT_EQ(WaitNotices(round), round);
    return Resolve(std::string(t->msg.name, t->msg.name_len), 7);
  }

  std::vector<float> TensorValues(const DeviceTensor* t) {
    std::vector<unsigned char> bytes = DeviceBytes(t);
    std::vector<float> v(t->numel);
    std::memcpy(v.data(), bytes.data() + t->offset, t->numel * 4);
    return v;
  }

  // "fc.weight": 1000 floats at `offset` in an allocation of `alloc_bytes`, registered.
  DeviceTensor* RegisterWeight(size_t offset = 0, size_t alloc_bytes = 4096) {
    DeviceTensor* t = NewTensor(name_, 1000, offset, alloc_bytes, 5);
    EXPECT_EQ(Register(t).status, SPARSYNC_OK);
    return t;
  }

  static std::vector<float> Ramp(size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f;
    return v;
  }

  const std::string name_ = "fc.weight";
  std::vector<GroupSlice> slices_{{&name_, 0, 1000}};  // its group: the tensor alone
  transport::LoopbackTransport transport_{std::make_shared<transport::LoopbackHub>(1), 0};
  std::shared_ptr<DeviceSparse> device_;
  std::unique_ptr<SparseReducer> reducer_;
  DeviceSparse::Scratch scratch_;
  PreparedGroup prepared_;
  int allocations_before_ = 0;
};

TEST_F(DeviceSparseTest, OnlyTheSelectedPairsCrossToTheHost) {
  DeviceTensor* t = RegisterWeight(256, 8192);
  fake_.TakeJournal();
  std::vector<GroupMember> members = Round(t, 1, Ramp(1000));
  ASSERT_EQ(members.size(), 1u);
  EXPECT_TRUE(members[0].on_device);
  std::string journal = fake_.TakeJournal();
  EXPECT_EQ(journal.find("D2H"), std::string::npos) << "the sum was staged: " << journal;

  bool fall_back = true;
  Status st = device_->Select(members, slices_, reducer_.get(), &scratch_, &prepared_, &fall_back);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(fall_back);
  ASSERT_EQ(prepared_.indices.size(), 10u);  // density 0.01
  for (int j = 0; j < 10; ++j) EXPECT_EQ(prepared_.indices[j], 990 + j);
  journal = fake_.TakeJournal();
  EXPECT_NE(journal.find("wait " + Id(t->ready) + "\nD2D 4000\nmemset 4000\n"), std::string::npos)
      << journal;
  EXPECT_NE(journal.find("D2H 40\nD2H 40\nsync\n"), std::string::npos) << journal;
  EXPECT_EQ(journal.find("D2H 4000"), std::string::npos) << journal;

  uint32_t tag = 0;
  st = device_->Finish(members, slices_, reducer_.get(), &scratch_, prepared_, 1.0, &tag);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(members[0].result_on_device);
  DeliverResult(members[0]);
  EXPECT_EQ(ReceiveDone().status, SPARSYNC_OK);
  journal = fake_.TakeJournal();
  EXPECT_EQ(journal.find("H2D 4000"), std::string::npos) << journal;
  EXPECT_NE(journal.find("record " + Id(t->done)), std::string::npos) << journal;
  const std::vector<float> result = TensorValues(t);
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(result[i], i >= 990 ? static_cast<float>(i) * 0.5f : 0.0f) << i;
  }
  std::vector<unsigned char> bytes = DeviceBytes(t);
  for (size_t b = 0; b < 256; ++b) ASSERT_EQ(bytes[b], kGuard) << b;
  for (size_t b = 256 + 4000; b < bytes.size(); ++b) ASSERT_EQ(bytes[b], kGuard) << b;
  // What was not sent stays on the device, as the residual.
  EXPECT_EQ(device_->residual_bytes(), 4000u);
  EXPECT_TRUE(reducer_->state().Get(TensorState::Kind::kResidual, name_).empty());
  table_->Finish(members);

  // Once the tensor is gone, its residual goes too.
  const int allocations = fake_.Live("allocations");
  device_->Forget("another.tensor");
  EXPECT_EQ(device_->residual_bytes(), 4000u);
  device_->Forget(name_);
  EXPECT_EQ(device_->residual_bytes(), 0u);
  EXPECT_EQ(fake_.Live("allocations"), allocations - 1);
}

TEST_F(DeviceSparseTest, ResidualsFollowATensorToTheHostAndBack) {
  DeviceTensor* t = RegisterWeight();
  bool fall_back = true;
  uint32_t tag = 0;
  std::vector<GroupMember> members = Round(t, 1, Ramp(1000));
  ASSERT_TRUE(
      device_->Select(members, slices_, reducer_.get(), &scratch_, &prepared_, &fall_back).ok());
  ASSERT_TRUE(
      device_->Finish(members, slices_, reducer_.get(), &scratch_, prepared_, 1.0, &tag).ok());
  DeliverResult(members[0]);
  ReceiveDone();
  table_->Finish(members);

  // Its group goes through the host: the residual goes along, exactly.
  ASSERT_TRUE(device_->MoveResidualsToHost(slices_, reducer_.get()).ok());
  EXPECT_EQ(device_->residual_bytes(), 0u);
  std::span<const float> host = reducer_->state().Get(TensorState::Kind::kResidual, name_);
  ASSERT_EQ(host.size(), 1000u);
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(host[i], i >= 990 ? 0.0f : static_cast<float>(i) * 0.5f) << i;
  }

  // And back: the next selection on the device adds it (top-k of 2 * ramp below 990).
  members = Round(t, 2, Ramp(1000));
  fake_.TakeJournal();
  ASSERT_TRUE(
      device_->Select(members, slices_, reducer_.get(), &scratch_, &prepared_, &fall_back).ok());
  EXPECT_NE(fake_.TakeJournal().find("H2D 4000"), std::string::npos);
  EXPECT_TRUE(reducer_->state().Get(TensorState::Kind::kResidual, name_).empty());
  ASSERT_EQ(prepared_.indices.size(), 10u);
  for (int j = 0; j < 10; ++j) {
    EXPECT_EQ(prepared_.indices[j], 980 + j);
    EXPECT_EQ(prepared_.values[j], static_cast<float>(980 + j));
  }
  ASSERT_TRUE(
      device_->Finish(members, slices_, reducer_.get(), &scratch_, prepared_, 1.0, &tag).ok());
  DeliverResult(members[0]);
  ReceiveDone();
  table_->Finish(members);
}

TEST_F(DeviceSparseTest, Float16ValuesLeaveTheirRoundingInTheResidualAsOnTheHost) {
  DeviceTensor* t = RegisterWeight();
  std::vector<float> grad(1000);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i) * 0.37f + 0.001f;
  auto halves = MakeReducer(NonFinitePolicy::kError, ValueDType::kFloat16);
  bool fall_back = true;
  uint32_t tag = 0;
  std::vector<GroupMember> members = Round(t, 1, grad);
  ASSERT_TRUE(
      device_->Select(members, slices_, halves.get(), &scratch_, &prepared_, &fall_back).ok());
  ASSERT_FALSE(fall_back);
  ASSERT_TRUE(
      device_->Finish(members, slices_, halves.get(), &scratch_, prepared_, 1.0, &tag).ok());
  const std::vector<float> on_device = TensorValues(t);
  ASSERT_TRUE(device_->MoveResidualsToHost(slices_, halves.get()).ok());
  DeliverResult(members[0]);
  ReceiveDone();
  table_->Finish(members);

  // The same step on the host, from scratch.
  auto host = MakeReducer(NonFinitePolicy::kError, ValueDType::kFloat16);
  std::vector<float> group = grad;
  ASSERT_TRUE(host->Reduce(slices_, group, 1, 7, 1.0, &tag).ok());
  for (size_t i = 0; i < 1000; ++i) ASSERT_TRUE(on_device[i] == group[i]) << i;
  std::span<const float> expected = host->state().Get(TensorState::Kind::kResidual, name_);
  std::span<const float> kept = halves->state().Get(TensorState::Kind::kResidual, name_);
  ASSERT_EQ(kept.size(), expected.size());
  int rounded = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    ASSERT_EQ(std::memcmp(&kept[i], &expected[i], sizeof(float)), 0) << i;
    rounded += i >= 990 && kept[i] != 0.0f;
  }
  EXPECT_GT(rounded, 0) << "no selected value was rounded: the test checks nothing";
}

TEST_F(DeviceSparseTest, ANonFiniteGradientFollowsThePolicy) {
  DeviceTensor* t = RegisterWeight();
  std::vector<float> grad = Ramp(1000);
  grad[321] = std::numeric_limits<float>::quiet_NaN();
  bool fall_back = true;
  std::vector<GroupMember> members = Round(t, 1, grad);
  Status st = device_->Select(members, slices_, reducer_.get(), &scratch_, &prepared_, &fall_back);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tensor 'fc.weight' holds a non-finite gradient (nan)"),
            std::string::npos)
      << st.ToString();

  // SPARSYNC_NONFINITE=skip: the step's update is zero and the residual the tensor had (here
  // one it brings from the host) is kept as it was.
  auto skipping = MakeReducer(NonFinitePolicy::kSkip);
  const std::vector<float> before = Ramp(1000);
  skipping->AddResidual(name_, before);
  st = device_->Select(members, slices_, skipping.get(), &scratch_, &prepared_, &fall_back);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(prepared_.finite);
  uint32_t tag = 0;
  ASSERT_TRUE(
      device_->Finish(members, slices_, skipping.get(), &scratch_, prepared_, 1.0, &tag).ok());
  for (float v : TensorValues(t)) ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(device_->residual_bytes(), 4000u);
  ASSERT_TRUE(device_->MoveResidualsToHost(slices_, skipping.get()).ok());
  std::span<const float> kept = skipping->state().Get(TensorState::Kind::kResidual, name_);
  ASSERT_EQ(kept.size(), 1000u);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(kept[i], before[i]) << i;
  DeliverResult(members[0]);
  ReceiveDone();
  table_->Finish(members);
}

// ---- Dense groups on a transport that takes device memory ----

// Stands for a job of this node and one peer whose contribution it adds, taking the "device"
// memory of GPU 1 (the fake runtime's device memory is host memory, so it can read it).
class PeerOnDevice : public transport::LoopbackTransport {
 public:
  explicit PeerOnDevice(std::vector<float> peer)
      : LoopbackTransport(std::make_shared<transport::LoopbackHub>(1), 0), peer_(std::move(peer)) {}
  int cuda_device() const override { return device; }
  Status AllReduceSum(void* data, size_t count, transport::ElementType type,
                      uint32_t tag) override {
    ++host_calls;
    return LoopbackTransport::AllReduceSum(data, count, type, tag);
  }
  Status AllReduceSumOnDevice(void* data, size_t count, transport::ElementType type,
                              uint32_t tag) override {
    ++device_calls;
    if (!fail.ok()) return fail;
    EXPECT_EQ(type, transport::ElementType::kFloat32);
    EXPECT_LE(count, peer_.size());
    float* f = static_cast<float*>(data);
    for (size_t i = 0; i < count && i < peer_.size(); ++i) f[i] += peer_[i];
    last_count = count;
    return Status::Ok();
  }

  int device = 1;
  Status fail;
  int host_calls = 0;
  int device_calls = 0;
  size_t last_count = 0;

 private:
  std::vector<float> peer_;
};

class DeviceDenseTest : public DeviceSparseTest {
 protected:
  // Both tensors' round 1 posted with `weight` and `bias` in their buffers, and bound to slots
  // 7 and 8; the schedule entry that reduces them together.
  negotiation::ScheduleEntry PostGroup(DeviceTensor* w, DeviceTensor* b,
                                       const std::vector<float>& weight,
                                       const std::vector<float>& bias) {
    Write(w, weight);
    Write(b, bias);
    EXPECT_TRUE(Ready(w, 1).ok());
    EXPECT_TRUE(Ready(b, 1).ok());
    EXPECT_EQ(WaitNotices(2), 2u);
    table_->BindSlot(name_, 7);
    table_->BindSlot("fc.bias", 8);
    negotiation::ScheduleEntry entry;
    entry.seq = 1;
    entry.group.push_back({7, {}});
    entry.group.push_back({8, {}});
    return entry;
  }

  void Write(DeviceTensor* t, const std::vector<float>& values) {
    EXPECT_EQ(fake_.Memcpy(static_cast<char*>(t->alloc) + t->offset, values.data(),
                           values.size() * 4, kCudaMemcpyHostToDevice),
              0);
    EXPECT_EQ(fake_.EventRecord(t->ready, nullptr), 0);
  }

  // Runs `entry` through an executor of one node on `transport`; returns the first failure.
  Status Execute(const negotiation::ScheduleEntry& entry, transport::Transport* transport) {
    ExecutorOptions options;
    options.device_sparse = device_;
    Status failed;
    Executor executor(
        World{0, 1, 1}, table_.get(), transport,
        [](std::chrono::milliseconds) { return std::vector<negotiation::ScheduleEntry>{}; },
        [&failed](const Status& s) {
          if (failed.ok()) failed = s;
        },
        std::chrono::milliseconds(1000), nullptr, options);
    executor.Execute(entry);
    return failed;
  }

  static std::vector<float> Seq(size_t n, float first, float step) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = first + step * static_cast<float>(i);
    return v;
  }
};

TEST_F(DeviceDenseTest, AGroupIsReducedInDeviceMemoryWithoutCrossingPcie) {
  DeviceTensor* w = RegisterWeight(256, 8192);
  DeviceTensor* b = NewTensor("fc.bias", 10, 0, 64, 6);
  ASSERT_EQ(Register(b).status, SPARSYNC_OK);
  const std::vector<float> weight = Ramp(1000), bias = Seq(10, 1.0f, 1.0f);
  const std::vector<float> peer = Seq(1010, 0.0f, 0.25f);
  negotiation::ScheduleEntry entry = PostGroup(w, b, weight, bias);
  fake_.TakeJournal();

  PeerOnDevice transport(peer);
  Status st = Execute(entry, &transport);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ReceiveDone().status, SPARSYNC_OK);
  EXPECT_EQ(ReceiveDone().status, SPARSYNC_OK);
  EXPECT_EQ(transport.device_calls, 1);
  EXPECT_EQ(transport.host_calls, 0);
  EXPECT_EQ(transport.last_count, 1010u);  // one call for the fused group

  // Side by side in the slot's buffer, complete before the transport reads it; the results
  // back into the workers' buffers; the done events after them. Nothing to or from the host.
  const std::string journal = fake_.TakeJournal();
  EXPECT_NE(journal.find("D2D 4000\nwait " + Id(b->ready) + "\nD2D 40\nsync\n"),
            std::string::npos)
      << journal;
  EXPECT_NE(journal.find("D2D 4000\nD2D 40\nrecord " + Id(w->done)), std::string::npos)
      << journal;
  EXPECT_EQ(journal.find("D2H"), std::string::npos) << journal;
  EXPECT_EQ(journal.find("H2D"), std::string::npos) << journal;

  const std::vector<float> got_w = TensorValues(w);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(got_w[i], weight[i] + peer[i]) << i;
  std::vector<unsigned char> bytes = DeviceBytes(b);
  std::vector<float> got_b(10);
  std::memcpy(got_b.data(), bytes.data(), 40);
  for (size_t j = 0; j < 10; ++j) EXPECT_EQ(got_b[j], bias[j] + peer[1000 + j]) << j;
  // The weight's neighbours in its allocation are untouched.
  bytes = DeviceBytes(w);
  for (size_t i = 0; i < 256; ++i) ASSERT_EQ(bytes[i], kGuard) << i;
  for (size_t i = 256 + 4000; i < 8192; ++i) ASSERT_EQ(bytes[i], kGuard) << i;
}

TEST_F(DeviceDenseTest, ALoneTensorIsAveragedInItsOwnBufferAsTheHostWould) {
  DeviceTensor* t = RegisterWeight();
  const std::vector<float> peer = Seq(1000, -3.0f, 0.37f);
  std::vector<GroupMember> members = Round(t, 1, Seq(1000, 0.1f, 0.013f));
  PeerOnDevice transport(peer);
  ASSERT_TRUE(DeviceSparse::TakesDense(members, transport));
  fake_.TakeJournal();

  bool fall_back = true;
  Status st = device_->PrepareDense(members, slices_, &scratch_, &fall_back);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(fall_back);
  EXPECT_EQ(fake_.TakeJournal(), "wait " + Id(t->ready) + "\nsync\n");  // no copy at all
  uint32_t tag = 0;
  st = device_->FinishDense(members, slices_, &scratch_, &transport, 3.0, &tag);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(tag, 1u);
  EXPECT_TRUE(members[0].result_on_device);
  DeliverResult(members[0]);
  EXPECT_EQ(ReceiveDone().status, SPARSYNC_OK);
  table_->Finish(members);

  // The host path's arithmetic: the sum, then DivideInPlace.
  std::vector<float> expected = Seq(1000, 0.1f, 0.013f);
  for (size_t i = 0; i < 1000; ++i) expected[i] += peer[i];
  DivideInPlace(expected.data(), expected.size(), 3.0, SPARSYNC_FLOAT32);
  const std::vector<float> got = TensorValues(t);
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &expected[i], 4), 0) << i << ": " << got[i] << " vs "
                                                        << expected[i];
  }
}

TEST_F(DeviceDenseTest, OnlyATransportOnTheTensorsGpuTakesTheGroup) {
  DeviceTensor* t = RegisterWeight();
  std::vector<GroupMember> members = Round(t, 1, Ramp(1000));
  PeerOnDevice other_gpu({});
  other_gpu.device = 0;
  EXPECT_FALSE(DeviceSparse::TakesDense(members, other_gpu));
  EXPECT_FALSE(DeviceSparse::TakesDense(members, transport_));  // host memory only
  std::vector<GroupMember> doubles = members;
  doubles[0].meta.dtype = SPARSYNC_FLOAT64;
  PeerOnDevice same_gpu({});
  EXPECT_FALSE(DeviceSparse::TakesDense(doubles, same_gpu));
  std::vector<GroupMember> staged = members;
  staged[0].on_device = false;
  EXPECT_FALSE(DeviceSparse::TakesDense(staged, same_gpu));
  EXPECT_TRUE(DeviceSparse::TakesDense(members, same_gpu));
  DeliverResult(members[0]);
  ReceiveDone();
  table_->Finish(members);
}

TEST_F(DeviceDenseTest, OnAHostTransportTheGroupIsStagedAndStillRight) {
  DeviceTensor* w = RegisterWeight(256, 8192);
  DeviceTensor* b = NewTensor("fc.bias", 10, 0, 64, 6);
  ASSERT_EQ(Register(b).status, SPARSYNC_OK);
  const std::vector<float> weight = Ramp(1000), bias = Seq(10, 1.0f, 1.0f);
  negotiation::ScheduleEntry entry = PostGroup(w, b, weight, bias);
  fake_.TakeJournal();

  Status st = Execute(entry, &transport_);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ReceiveDone().status, SPARSYNC_OK);
  EXPECT_EQ(ReceiveDone().status, SPARSYNC_OK);
  const std::string journal = fake_.TakeJournal();
  EXPECT_NE(journal.find("D2H 4000"), std::string::npos) << journal;
  EXPECT_NE(journal.find("H2D 4000"), std::string::npos) << journal;
  EXPECT_EQ(TensorValues(w), weight);
}

TEST_F(DeviceDenseTest, ATransportFailureFailsTheGroup) {
  DeviceTensor* w = RegisterWeight(256, 8192);
  DeviceTensor* b = NewTensor("fc.bias", 10, 0, 64, 6);
  ASSERT_EQ(Register(b).status, SPARSYNC_OK);
  negotiation::ScheduleEntry entry = PostGroup(w, b, Ramp(1000), Seq(10, 1.0f, 1.0f));

  PeerOnDevice transport(Seq(1010, 0.0f, 1.0f));
  transport.fail = Aborted("allreduce 0 on CUDA device 1: a peer went away");
  Status st = Execute(entry, &transport);
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find("a peer went away"), std::string::npos) << st.ToString();
  for (int i = 0; i < 2; ++i) {
    sparsync_done done = ReceiveDone();
    EXPECT_NE(done.status, SPARSYNC_OK);
    EXPECT_NE(std::string(done.message).find("a peer went away"), std::string::npos)
        << done.message;
  }
}

}  // namespace
}  // namespace sparsync::pipeline
