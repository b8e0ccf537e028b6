#include "daemon/pipeline/gtopk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>

namespace sparsync::pipeline {
namespace {

// A sparse vector: indices strictly ascending, one value per index.
struct SparseSet {
  std::vector<int32_t> indices;
  std::vector<float> values;
  size_t size() const { return indices.size(); }
};

// The selection key; NaN ranks as largest so that std::nth_element sees a strict weak order.
float Magnitude(float v) {
  return std::isnan(v) ? std::numeric_limits<float>::infinity() : std::fabs(v);
}

// out = a + b (values added at equal indices). Float addition commutes, so the two peers of a
// round, each calling Merge(mine, theirs), compute the same bits.
void Merge(const SparseSet& a, const SparseSet& b, SparseSet* out) {
  out->indices.clear();
  out->values.clear();
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a.indices[i] < b.indices[j])) {
      out->indices.push_back(a.indices[i]);
      out->values.push_back(a.values[i++]);
    } else if (i == a.size() || b.indices[j] < a.indices[i]) {
      out->indices.push_back(b.indices[j]);
      out->values.push_back(b.values[j++]);
    } else {
      out->indices.push_back(a.indices[i]);
      out->values.push_back(a.values[i++] + b.values[j++]);
    }
  }
}

// Keeps the k entries of largest |value| (ties: smaller index), still in index order.
void KeepLargest(int64_t k, SparseSet* s) {
  if (static_cast<int64_t>(s->size()) <= k) return;
  std::vector<size_t> order(s->size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto larger = [&](size_t x, size_t y) {
    float mx = Magnitude(s->values[x]), my = Magnitude(s->values[y]);
    return mx != my ? mx > my : s->indices[x] < s->indices[y];
  };
  std::nth_element(order.begin(), order.begin() + k, order.end(), larger);
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());  // positions ascending == indices ascending
  SparseSet kept;
  kept.indices.reserve(order.size());
  kept.values.reserve(order.size());
  for (size_t p : order) {
    kept.indices.push_back(s->indices[p]);
    kept.values.push_back(s->values[p]);
  }
  *s = std::move(kept);
}

Status CheckIndices(std::span<const int32_t> indices, int64_t numel) {
  for (size_t j = 0; j < indices.size(); ++j) {
    if (indices[j] < 0 || indices[j] >= numel || (j > 0 && indices[j] <= indices[j - 1])) {
      return InvalidArgument(
          "entry " + std::to_string(j) + " has index " + std::to_string(indices[j]) +
          "; indices must be strictly ascending in [0, " + std::to_string(numel) + ")");
    }
  }
  return Status::Ok();
}

// Wire layout of a round: n raw int32 indices, then n float32 values (host byte order, like the
// rest of the transport).
void Encode(const SparseSet& s, std::vector<char>* wire) {
  const size_t n = s.size();
  wire->resize(n * (sizeof(int32_t) + sizeof(float)));
  if (n == 0) return;
  std::memcpy(wire->data(), s.indices.data(), n * sizeof(int32_t));
  std::memcpy(wire->data() + n * sizeof(int32_t), s.values.data(), n * sizeof(float));
}

Status Decode(const char* wire, size_t bytes, int64_t numel, SparseSet* s) {
  constexpr size_t kEntry = sizeof(int32_t) + sizeof(float);
  if (bytes % kEntry != 0) {
    return Internal(std::to_string(bytes) + " bytes is not a whole number of (index, value) pairs");
  }
  const size_t n = bytes / kEntry;
  s->indices.resize(n);
  s->values.resize(n);
  if (n == 0) return Status::Ok();
  std::memcpy(s->indices.data(), wire, n * sizeof(int32_t));
  std::memcpy(s->values.data(), wire + n * sizeof(int32_t), n * sizeof(float));
  Status st = CheckIndices(s->indices, numel);
  return st.ok() ? st : Internal("malformed set received: " + st.message());
}

}  // namespace

bool GlobalTopKSupports(int num_nodes) {
  return num_nodes >= 1 && (num_nodes & (num_nodes - 1)) == 0;
}

Status GlobalTopK(transport::Transport* t, int64_t numel, int64_t k,
                  std::span<const int32_t> indices, std::span<const float> values,
                  std::vector<int32_t>* out_indices, std::vector<float>* out_values,
                  std::vector<uint8_t>* kept_mask, uint32_t* tag) {
  const int nodes = t->size();
  if (!GlobalTopKSupports(nodes)) {
    return InvalidArgument("gTop-k needs a power-of-two node count, but there are " +
                           std::to_string(nodes) + " nodes; use the allgather top-k exchange");
  }
  int rounds = 0;
  while ((1 << rounds) < nodes) ++rounds;
  const uint32_t base_tag = *tag;
  *tag += static_cast<uint32_t>(rounds) + 1;

  if (k < 0 || numel < 0 || numel > int64_t{std::numeric_limits<int32_t>::max()} + 1) {
    return InvalidArgument("gTop-k: k = " + std::to_string(k) + ", numel = " +
                           std::to_string(numel) + " (need k >= 0 and 0 <= numel <= 2^31)");
  }
  if (indices.size() != values.size() || static_cast<int64_t>(indices.size()) > k) {
    return InvalidArgument("gTop-k: " + std::to_string(indices.size()) + " indices, " +
                           std::to_string(values.size()) + " values, k = " + std::to_string(k) +
                           " (need as many values as indices, at most k)");
  }
  SPARSYNC_RETURN_IF_ERROR(CheckIndices(indices, numel).WithContext("gTop-k input"));

  SparseSet current;
  current.indices.assign(indices.begin(), indices.end());
  current.values.assign(values.begin(), values.end());
  // A peer's set has at most min(k, numel) entries.
  const size_t capacity =
      static_cast<size_t>(std::min(k, numel)) * (sizeof(int32_t) + sizeof(float));
  std::vector<char> send, recv(capacity);
  SparseSet theirs, merged;
  for (int round = 0; round < rounds; ++round) {
    const int peer = t->rank() ^ (1 << round);
    const std::string where =
        "gTop-k round " + std::to_string(round) + " with node " + std::to_string(peer);
    Encode(current, &send);
    size_t received = 0;
    SPARSYNC_RETURN_IF_ERROR(t->SendRecv(peer, send.data(), send.size(), recv.data(), recv.size(),
                                         &received, base_tag + round)
                                 .WithContext(where));
    SPARSYNC_RETURN_IF_ERROR(Decode(recv.data(), received, numel, &theirs).WithContext(where));
    Merge(current, theirs, &merged);
    KeepLargest(k, &merged);
    std::swap(current, merged);
  }

  // Correction round: exact sums at the final indices, and membership as the kept mask.
  std::vector<float> sums(current.size(), 0.0f);
  kept_mask->assign(indices.size(), 0);
  for (size_t j = 0, f = 0; j < indices.size(); ++j) {
    while (f < current.size() && current.indices[f] < indices[j]) ++f;
    if (f < current.size() && current.indices[f] == indices[j]) {
      sums[f] = values[j];
      (*kept_mask)[j] = 1;
    }
  }
  if (!sums.empty()) {  // the final set is the same on every node, so all skip or none do
    SPARSYNC_RETURN_IF_ERROR(t->AllReduceSum(sums.data(), sums.size(),
                                             transport::ElementType::kFloat32,
                                             base_tag + static_cast<uint32_t>(rounds))
                                 .WithContext("gTop-k value correction"));
  }
  *out_indices = std::move(current.indices);
  *out_values = std::move(sums);
  return Status::Ok();
}

}  // namespace sparsync::pipeline
