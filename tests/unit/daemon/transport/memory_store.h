// An in-memory RendezvousStore for the transports' tests (the coordinator's StoreSet / StoreGet
// without gRPC): Get waits, with a deadline, until every key exists.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/transport/transport.h"

namespace sparsync::transport {

class MemoryStore : public RendezvousStore {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
    return Status::Ok();
  }

  Result<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    const bool all_there = cv_.wait_for(lock, timeout, [&] {
      for (const auto& k : keys) {
        if (data_.count(k) == 0) return false;
      }
      return true;
    });
    if (!all_there) return DeadlineExceeded("rendezvous keys missing after the timeout");
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(data_[k]);
    return out;
  }

  std::optional<std::string> Peek(const std::string& key) {
    std::lock_guard lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

}  // namespace sparsync::transport
