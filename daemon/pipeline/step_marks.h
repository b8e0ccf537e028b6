// StepMarks: where a group's time goes inside the executor's two stages, for the timeline
// (observe/timeline.h). A reduce path, and the sparse reducer it calls, marks the end of each
// sub-step as it finishes it ("local reduce", "sparsify", "pack", "transfer", "unpack",
// "write-back"); a sub-step begins where the previous mark, or its stage, began. Marking costs one
// clock read; a path that marks nothing leaves the stages' own spans only.
//
// One group's marks are written by stage A, then by stage B, never at once (the executor hands
// the slot from one to the other), and read once the group is done.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>

namespace sparsync::pipeline {

class StepMarks {
 public:
  struct Mark {
    const char* name = "";  // a string literal
    int64_t end_ns = 0;     // steady clock, as the executor's stage times
  };

  // Records that the sub-step `name` (a string literal) ends now. Past kMax marks, ignored.
  void Add(const char* name) {
    if (count_ == kMax) return;
    marks_[count_++] = {name, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now().time_since_epoch())
                                  .count()};
  }
  void Clear() { count_ = 0; }
  std::span<const Mark> marks() const { return {marks_.data(), count_}; }

 private:
  static constexpr size_t kMax = 12;
  std::array<Mark, kMax> marks_{};
  size_t count_ = 0;
};

}  // namespace sparsync::pipeline
