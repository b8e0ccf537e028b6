// Helpers shared by the negotiation tests: tensor metadata, report references, and the slots of a
// schedule as plain values that gtest can compare and print.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "daemon/negotiation/coordinator_link.h"

namespace sparsync::negotiation::testing {

inline TensorMeta Meta(const std::string& name, std::vector<int64_t> shape,
                       CollectiveOp op = CollectiveOp::kGradient, DType dtype = DType::kFloat32) {
  TensorMeta m;
  m.name = name;
  m.op = op;
  m.dtype = dtype;
  m.reduce_op = ReduceOp::kAverage;
  m.shape = std::move(shape);
  return m;
}

inline ReportedReady NewRef(uint32_t index, std::vector<int64_t> worker_dim0 = {},
                            int64_t ready_ns = 0) {
  ReportedReady r;
  r.new_index = index;
  r.worker_dim0 = std::move(worker_dim0);
  r.ready_ns = ready_ns;
  return r;
}

inline ReportedReady SlotRef(uint32_t slot, std::vector<int64_t> worker_dim0 = {},
                             int64_t ready_ns = 0) {
  ReportedReady r;
  r.slot = slot;
  r.worker_dim0 = std::move(worker_dim0);
  r.ready_ns = ready_ns;
  return r;
}

inline JoinInfo Joiner(int rank, int num_nodes, int local_size, const std::string& token,
                       uint32_t protocol_version) {
  JoinInfo info;
  info.protocol_version = protocol_version;
  info.job_token = token;
  info.node_rank = rank;
  info.num_nodes = num_nodes;
  info.local_size = local_size;
  return info;
}

// An entry as "seq:slot,slot" (groups), "seq:plan vN" (announcements) or "seq:fatal CODE: msg".
inline std::string Describe(const ScheduleEntry& e) {
  std::string s = std::to_string(e.seq) + ":";
  if (!e.fatal.ok()) return s + "fatal " + e.fatal.ToString();
  if (e.plan) s += "plan v" + std::to_string(e.plan->version);
  for (size_t i = 0; i < e.group.size(); ++i) {
    s += (i ? "," : "") + std::to_string(e.group[i].slot);
    if (!e.group[i].worker_dim0.empty()) {
      s += "[";
      for (size_t d = 0; d < e.group[i].worker_dim0.size(); ++d) {
        s += (d ? " " : "") + std::to_string(e.group[i].worker_dim0[d]);
      }
      s += "]";
    }
  }
  if (e.plan_version) {
    s += " (v" + std::to_string(e.plan_version) + " #" + std::to_string(e.group_index) + ")";
  }
  return s;
}

inline std::vector<std::string> Describe(const std::vector<ScheduleEntry>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(Describe(e));
  return out;
}

inline bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

inline bool HasFatal(const std::vector<ScheduleEntry>& entries) {
  return std::any_of(entries.begin(), entries.end(), [](const auto& e) { return !e.fatal.ok(); });
}

// Polls `node` from `after` on until `done` holds for what it received or 10 s passed.
inline std::vector<ScheduleEntry> PollUntil(
    CoordinatorLink& link, int node, uint64_t after,
    const std::function<bool(const std::vector<ScheduleEntry>&)>& done) {
  std::vector<ScheduleEntry> got;
  auto start = std::chrono::steady_clock::now();
  while (!done(got) && SecondsSince(start) < 10) {
    auto entries = link.Poll(node, after, std::chrono::milliseconds(200));
    if (!entries.ok()) {
      ADD_FAILURE() << "node " << node << ": " << entries.status().ToString();
      break;
    }
    for (auto& e : *entries) {
      after = std::max(after, e.seq);
      got.push_back(std::move(e));
    }
  }
  return got;
}

// What each node of RunRounds saw.
struct RoundsSeen {
  std::vector<std::map<std::string, uint32_t>> slots;  // per node: name -> slot it was given
  std::vector<std::vector<ScheduleEntry>> entries;     // per node, in the order received
};

// Nodes as threads, node n on links[n]: for `rounds` rounds every node reports every tensor (in
// its own order, rotated by node and round; metadata the first time, the slot afterwards), then
// polls until this round's entries name as many tensors as it reported, as a worker waits for
// DONE before posting again. ALLGATHER tensors carry worker_dim0 {n + 1, 10 n + round}.
inline RoundsSeen RunRounds(const std::vector<CoordinatorLink*>& links,
                            const std::vector<TensorMeta>& tensors, int rounds) {
  const int nodes = static_cast<int>(links.size());
  RoundsSeen seen;
  seen.slots.resize(nodes);
  seen.entries.resize(nodes);
  std::vector<std::thread> threads;
  for (int n = 0; n < nodes; ++n) {
    threads.emplace_back([&, n] {
      CoordinatorLink& link = *links[n];
      auto& slots = seen.slots[n];
      uint64_t after = 0;
      for (int round = 0; round < rounds; ++round) {
        for (size_t i = 0; i < tensors.size(); ++i) {
          const TensorMeta& t = tensors[(i + n + round) % tensors.size()];
          std::vector<int64_t> dims;
          if (t.op == CollectiveOp::kAllGather) dims = {n + 1, 10 * n + round};
          auto known = slots.find(t.name);
          auto r = known == slots.end() ? link.Report(n, {t}, {NewRef(0, dims)})
                                        : link.Report(n, {}, {SlotRef(known->second, dims)});
          ASSERT_TRUE(r.ok()) << "node " << n << ": " << r.status().ToString();
          ASSERT_EQ(r->size(), known == slots.end() ? 1u : 0u);
          if (known == slots.end()) slots[t.name] = r->front();
        }
        size_t named = 0;
        auto got = PollUntil(link, n, after, [&](const std::vector<ScheduleEntry>& es) {
          named = 0;
          for (const auto& e : es) named += e.group.size();
          return named >= tensors.size() || HasFatal(es);
        });
        ASSERT_EQ(named, tensors.size()) << "node " << n << " round " << round;
        for (auto& e : got) {
          after = e.seq;
          seen.entries[n].push_back(std::move(e));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return seen;
}

// Checks what RunRounds saw: every node the same slots and the same schedule, seq 1, 2, 3, ...,
// every tensor exactly once per round, ALLGATHER dimensions in node order.
inline void ExpectOneSchedule(const RoundsSeen& seen, const std::vector<TensorMeta>& tensors,
                              int rounds) {
  const size_t nodes = seen.entries.size();
  for (size_t n = 1; n < nodes; ++n) {
    EXPECT_EQ(seen.slots[n], seen.slots[0]) << "node " << n;
    EXPECT_EQ(Describe(seen.entries[n]), Describe(seen.entries[0])) << "node " << n;
  }
  const std::vector<ScheduleEntry>& all = seen.entries[0];
  std::vector<uint32_t> order;
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].seq, i + 1);
    EXPECT_TRUE(all[i].fatal.ok()) << all[i].fatal.ToString();
    for (const auto& g : all[i].group) {
      order.push_back(g.slot);
      const TensorMeta* meta = nullptr;
      for (const auto& t : tensors) {
        auto it = seen.slots[0].find(t.name);
        if (it != seen.slots[0].end() && it->second == g.slot) meta = &t;
      }
      ASSERT_NE(meta, nullptr) << "slot " << g.slot << " was never assigned";
      if (meta->op != CollectiveOp::kAllGather) continue;
      ASSERT_EQ(g.worker_dim0.size(), 2 * nodes);
      for (size_t n = 0; n < nodes; ++n) {
        EXPECT_EQ(g.worker_dim0[2 * n], static_cast<int64_t>(n + 1));
      }
    }
  }
  ASSERT_EQ(order.size(), tensors.size() * rounds);
  for (int round = 0; round < rounds; ++round) {
    std::vector<uint32_t> in_round(order.begin() + round * tensors.size(),
                                   order.begin() + (round + 1) * tensors.size());
    std::sort(in_round.begin(), in_round.end());
    EXPECT_EQ(std::unique(in_round.begin(), in_round.end()), in_round.end()) << "round " << round;
  }
}

}  // namespace sparsync::negotiation::testing
