// The device paths (daemon/device/device_topk_path.h, device_dense_path.h): the daemon's intake
// side keeping gradients on the fake CUDA runtime's "device", the fake sparsification library
// (tests/support/fake_sparsify) and a one-node loopback transport (for dense groups, one that
// takes device memory), with this test playing the worker.
#include "daemon/device/device_topk_path.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "daemon/device/device_dense_path.h"
#include "daemon/pipeline/delivery.h"
#include "daemon/pipeline/dense_math.h"
#include "daemon/pipeline/executor.h"
#include "daemon/pipeline/host_paths.h"
#include "daemon/transport/loopback/loopback_transport.h"
#include "tests/unit/daemon/device/cuda_test_fixture.h"

namespace sparsync::device {
namespace {

using pipeline::Group;
using pipeline::GroupMember;
using pipeline::NodeSum;
using pipeline::PreparedGroup;
using pipeline::SparseReducer;
using pipeline::TensorState;
using test::CudaStagingTest;
using test::DeviceTensor;
using test::kGuard;

Config TopKConfig(NonFinitePolicy nonfinite = NonFinitePolicy::kError,
                  ValueDType values = ValueDType::kFloat32) {
  Config config;
  config.compressor = Compressor::kTopK;
  config.density = 0.01;
  config.nonfinite = nonfinite;
  config.value_dtype = values;
  return config;
}

class DeviceTopKTest : public CudaStagingTest {
 protected:
  void SetUp() override {
    CudaStagingTest::SetUp();
    allocations_before_ = fake_.Live("allocations");
    table_ = MakeTable(SPARSYNC_FAKE_CUDART, 1, "", true, [](const TensorMeta&) { return true; });
    plugin_ = std::make_shared<SparsifyPlugin>(SPARSYNC_FAKE_SPARSIFY);
    ASSERT_TRUE(plugin_->LoadExplicit().ok());
    state_ = std::make_unique<TensorState>();
    topk_ = std::make_unique<DeviceTopKPath>(TopKConfig(), plugin_, state_.get());
    scratch_ = std::make_unique<DeviceTopKPath::TopKScratch>();
    reducer_ = MakeReducer(NonFinitePolicy::kError);
  }

  void TearDown() override {
    scratch_.reset();
    state_.reset();  // the device residuals go with the node's store
    topk_.reset();
    plugin_.reset();
    EXPECT_EQ(fake_.Live("allocations"), allocations_before_ + static_cast<int>(tensors_.size()))
        << "the device path leaked device memory";
    CudaStagingTest::TearDown();
  }

  // A top-k reducer sharing the node's store (`own_state`: one of its own, as a fresh node's).
  std::unique_ptr<SparseReducer> MakeReducer(NonFinitePolicy nonfinite,
                                             ValueDType values = ValueDType::kFloat32,
                                             bool own_state = false) {
    auto r = SparseReducer::Create(TopKConfig(nonfinite, values), 0, 1, &transport_,
                                   own_state ? nullptr : state_.get());
    EXPECT_TRUE(r.ok());
    return r.ok() ? std::move(*r) : nullptr;
  }

  // `members` as the executor forms their group (reduced with `reducer`; null: dense).
  static Group MakeGroup(std::vector<GroupMember> members, SparseReducer* reducer,
                         double divisor = 1.0) {
    Group g;
    g.seq = 1;
    g.op = CollectiveOp::kGradient;
    g.members = std::move(members);
    for (const GroupMember& m : g.members) {
      const size_t count = static_cast<size_t>(m.meta.NumElements());
      g.slices.push_back({&m.meta.name, g.elements, count});
      g.elements += count;
    }
    g.divisor = divisor;
    g.reducer = reducer;
    g.step = g.members.empty() ? 0 : g.members[0].parts[0].round;
    g.group_id = 7;
    return g;
  }

  // Stage A of the top-k path; a path that declines fails the test.
  Status Select(Group& group) {
    bool declined = false;
    Status st = topk_->Prepare(group, *scratch_, &declined);
    EXPECT_FALSE(declined);
    return st;
  }
  Status Finish(Group& group) {
    uint32_t tag = 0;
    return topk_->Exchange(group, *scratch_, &tag);
  }
  // A host path's first step: residuals kept on the device come to the host.
  Status MoveResidualsToHost(const Group& group) {
    std::vector<float> unused(group.elements);
    return state_->AddTo(TensorState::Kind::kResidual, group.slices, unused);
  }
  PreparedGroup& prepared() { return scratch_->prepared; }

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
  transport::LoopbackTransport transport_{std::make_shared<transport::LoopbackHub>(1), 0};
  std::shared_ptr<SparsifyPlugin> plugin_;
  std::unique_ptr<TensorState> state_;
  std::unique_ptr<DeviceTopKPath> topk_;
  std::unique_ptr<DeviceTopKPath::TopKScratch> scratch_;
  std::unique_ptr<SparseReducer> reducer_;
  int allocations_before_ = 0;
};

TEST_F(DeviceTopKTest, OnlyTheSelectedPairsCrossToTheHost) {
  DeviceTensor* t = RegisterWeight(256, 8192);
  fake_.TakeJournal();
  Group group = MakeGroup(Round(t, 1, Ramp(1000)), reducer_.get());
  ASSERT_EQ(group.members.size(), 1u);
  EXPECT_EQ(group.members[0].sum, NodeSum::kDeviceZero);
  std::string journal = fake_.TakeJournal();
  EXPECT_EQ(journal.find("D2H"), std::string::npos) << "the sum was staged: " << journal;

  EXPECT_TRUE(topk_->Takes(group)) << "a top-k group on one GPU takes the device path";
  Status st = Select(group);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(prepared().indices.size(), 10u);  // density 0.01
  for (int j = 0; j < 10; ++j) EXPECT_EQ(prepared().indices[j], 990 + j);
  journal = fake_.TakeJournal();
  EXPECT_NE(journal.find("wait " + Id(t->ready) + "\nD2D 4000\nmemset 4000\n"), std::string::npos)
      << journal;
  EXPECT_NE(journal.find("D2H 40\nD2H 40\nsync\n"), std::string::npos) << journal;
  EXPECT_EQ(journal.find("D2H 4000"), std::string::npos) << journal;

  st = Finish(group);
  ASSERT_TRUE(st.ok()) << st.ToString();
  topk_->Deliver(group.members[0], group, *scratch_);
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
  EXPECT_EQ(state_->device_bytes(), 4000u);
  EXPECT_TRUE(reducer_->state().Get(TensorState::Kind::kResidual, name_).empty());
  table_->Finish(group.members);

  // Once the tensor is gone, its residual goes too.
  const int allocations = fake_.Live("allocations");
  state_->Forget("another.tensor");
  EXPECT_EQ(state_->device_bytes(), 4000u);
  state_->Forget(name_);
  EXPECT_EQ(state_->device_bytes(), 0u);
  EXPECT_EQ(fake_.Live("allocations"), allocations - 1);
}

TEST_F(DeviceTopKTest, ResidualsFollowATensorToTheHostAndBack) {
  DeviceTensor* t = RegisterWeight();
  Group group = MakeGroup(Round(t, 1, Ramp(1000)), reducer_.get());
  ASSERT_TRUE(Select(group).ok());
  ASSERT_TRUE(Finish(group).ok());
  topk_->Deliver(group.members[0], group, *scratch_);
  ReceiveDone();
  table_->Finish(group.members);

  // Its group goes through the host: the residual goes along, exactly.
  ASSERT_TRUE(MoveResidualsToHost(group).ok());
  EXPECT_EQ(state_->device_bytes(), 0u);
  std::span<const float> host = reducer_->state().Get(TensorState::Kind::kResidual, name_);
  ASSERT_EQ(host.size(), 1000u);
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(host[i], i >= 990 ? 0.0f : static_cast<float>(i) * 0.5f) << i;
  }

  // And back: the next selection on the device adds it (top-k of 2 * ramp below 990).
  group = MakeGroup(Round(t, 2, Ramp(1000)), reducer_.get());
  fake_.TakeJournal();
  ASSERT_TRUE(Select(group).ok());
  EXPECT_NE(fake_.TakeJournal().find("H2D 4000"), std::string::npos);
  EXPECT_TRUE(reducer_->state().Get(TensorState::Kind::kResidual, name_).empty());
  ASSERT_EQ(prepared().indices.size(), 10u);
  for (int j = 0; j < 10; ++j) {
    EXPECT_EQ(prepared().indices[j], 980 + j);
    EXPECT_EQ(prepared().values[j], static_cast<float>(980 + j));
  }
  ASSERT_TRUE(Finish(group).ok());
  topk_->Deliver(group.members[0], group, *scratch_);
  ReceiveDone();
  table_->Finish(group.members);
}

TEST_F(DeviceTopKTest, Float16ValuesLeaveTheirRoundingInTheResidualAsOnTheHost) {
  DeviceTensor* t = RegisterWeight();
  std::vector<float> grad(1000);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i) * 0.37f + 0.001f;
  auto halves = MakeReducer(NonFinitePolicy::kError, ValueDType::kFloat16);
  uint32_t tag = 0;
  Group group = MakeGroup(Round(t, 1, grad), halves.get());
  ASSERT_TRUE(Select(group).ok());
  ASSERT_TRUE(Finish(group).ok());
  const std::vector<float> on_device = TensorValues(t);
  ASSERT_TRUE(MoveResidualsToHost(group).ok());
  topk_->Deliver(group.members[0], group, *scratch_);
  ReceiveDone();
  table_->Finish(group.members);

  // The same step on the host, from scratch (a node of its own).
  auto host = MakeReducer(NonFinitePolicy::kError, ValueDType::kFloat16, /*own_state=*/true);
  std::vector<float> values = grad;
  ASSERT_TRUE(host->Reduce(group.slices, values, 1, 7, 1.0, &tag).ok());
  for (size_t i = 0; i < 1000; ++i) ASSERT_TRUE(on_device[i] == values[i]) << i;
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

TEST_F(DeviceTopKTest, ANonFiniteGradientFollowsThePolicy) {
  DeviceTensor* t = RegisterWeight();
  std::vector<float> grad = Ramp(1000);
  grad[321] = std::numeric_limits<float>::quiet_NaN();
  Group group = MakeGroup(Round(t, 1, grad), reducer_.get());
  Status st = Select(group);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tensor 'fc.weight' holds a non-finite gradient (nan)"),
            std::string::npos)
      << st.ToString();

  // SPARSYNC_NONFINITE=skip: the step's update is zero and the residual the tensor had (here
  // one it brings from the host) is kept as it was.
  auto skipping = MakeReducer(NonFinitePolicy::kSkip);
  const std::vector<float> before = Ramp(1000);
  state_->Store(TensorState::Kind::kResidual, group.slices, before);
  group.reducer = skipping.get();
  st = Select(group);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(prepared().finite);
  ASSERT_TRUE(Finish(group).ok());
  for (float v : TensorValues(t)) ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(state_->device_bytes(), 4000u);
  ASSERT_TRUE(MoveResidualsToHost(group).ok());
  std::span<const float> kept = skipping->state().Get(TensorState::Kind::kResidual, name_);
  ASSERT_EQ(kept.size(), 1000u);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(kept[i], before[i]) << i;
  topk_->Deliver(group.members[0], group, *scratch_);
  ReceiveDone();
  table_->Finish(group.members);
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

class DeviceDenseTest : public DeviceTopKTest {
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
    negotiation::ScheduleEntry entry;
    entry.seq = 1;
    entry.group.push_back({7, {}, name_, nullptr});
    entry.group.push_back({8, {}, "fc.bias", nullptr});
    return entry;
  }

  void Write(DeviceTensor* t, const std::vector<float>& values) {
    EXPECT_EQ(fake_.Memcpy(static_cast<char*>(t->alloc) + t->offset, values.data(),
                           values.size() * 4, kCudaMemcpyHostToDevice),
              0);
    EXPECT_EQ(fake_.EventRecord(t->ready, nullptr), 0);
  }

  // The dense device path on `transport`, as the daemon builds it.
  std::unique_ptr<pipeline::ReducePath> DensePath(transport::Transport* transport) {
    Config dense;
    dense.compressor = Compressor::kNone;
    return MakeDeviceDensePath(dense, plugin_, transport);
  }

  // Runs `entry` through an executor of one node on `transport` with the daemon's paths for
  // compressor none; returns the job's failure.
  Status Execute(const negotiation::ScheduleEntry& entry, transport::Transport* transport) {
    std::vector<std::unique_ptr<pipeline::ReducePath>> paths;
    paths.push_back(DensePath(transport));
    for (auto& p : pipeline::HostPaths(pipeline::World{0, 1, 1}, transport)) {
      paths.push_back(std::move(p));
    }
    pipeline::Executor executor(
        pipeline::World{0, 1, 1}, &table_->table, transport,
        [](std::chrono::milliseconds) { return std::vector<negotiation::ScheduleEntry>{}; },
        &table_->failure, nullptr, std::move(paths));
    executor.Execute(entry);
    return table_->failure.status();
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
  Group group = MakeGroup(Round(t, 1, Seq(1000, 0.1f, 0.013f)), nullptr, /*divisor=*/3.0);
  PeerOnDevice transport(peer);
  std::unique_ptr<pipeline::ReducePath> dense = DensePath(&transport);
  ASSERT_TRUE(dense->Takes(group));
  fake_.TakeJournal();

  std::unique_ptr<pipeline::ReducePath::Scratch> scratch = dense->NewScratch();
  bool declined = false;
  Status st = dense->Prepare(group, *scratch, &declined);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(declined);
  EXPECT_EQ(fake_.TakeJournal(), "wait " + Id(t->ready) + "\nsync\n");  // no copy at all
  uint32_t tag = 0;
  st = dense->Exchange(group, *scratch, &tag);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(tag, 1u);
  EXPECT_EQ(transport.host_calls, 0) << "the result stays on the device";
  dense->Deliver(group.members[0], group, *scratch);
  EXPECT_EQ(ReceiveDone().status, SPARSYNC_OK);
  table_->Finish(group.members);

  // The host path's arithmetic: the sum, then DivideInPlace.
  std::vector<float> expected = Seq(1000, 0.1f, 0.013f);
  for (size_t i = 0; i < 1000; ++i) expected[i] += peer[i];
  pipeline::DivideInPlace(expected.data(), expected.size(), 3.0, DType::kFloat32);
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
  EXPECT_FALSE(DensePath(&other_gpu)->Takes(MakeGroup(members, nullptr)));
  EXPECT_FALSE(DensePath(&transport_)->Takes(MakeGroup(members, nullptr)));  // host memory only
  std::vector<GroupMember> doubles = members;
  doubles[0].meta.dtype = DType::kFloat64;
  PeerOnDevice same_gpu({});
  EXPECT_FALSE(DensePath(&same_gpu)->Takes(MakeGroup(doubles, nullptr)));
  std::vector<GroupMember> staged = members;
  staged[0].sum = NodeSum::kRegions;
  EXPECT_FALSE(DensePath(&same_gpu)->Takes(MakeGroup(staged, nullptr)));
  EXPECT_TRUE(DensePath(&same_gpu)->Takes(MakeGroup(members, nullptr)));
  pipeline::DeliverFromDevice(members[0]);
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
}  // namespace sparsync::device
