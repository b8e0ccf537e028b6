// Timeline: the daemon's Chrome trace (SPARSYNC_TIMELINE, hvd.start_timeline), which Perfetto
// and chrome://tracing open; docs/operations.md shows one. One file per node, one process (pid =
// the node's rank) with these rows (tids):
//   1        plans and incidents: plan changes, the start-up calibration, node 0's planner notes
//            (each re-planning with its re-measured cost model) and stalls, the job's failure,
//            all as instant events
//   2        stage A: "prepare" per group (local sum, residual, selection and packing)
//   3        stage B: "exchange" per group (every transport call and the unpacking), "deliver"
//            (the write-back into the workers' memory and DONE)
//   100+i    one per tensor: "negotiate" (from the tensor being ready on this node to the
//            coordinator's schedule naming it, i.e. the wait for every node's report) and
//            "queue" (from then to stage A starting its group)
// Times are wall-clock microseconds (so that the files of several nodes line up), measured with
// the steady clock from the moment recording started.
//
// Recording is cheap for the executor: a call copies a few numbers under a mutex. A thread of the
// timeline's own formats and writes the events once a second (or when 4096 are waiting) through a
// TraceFile, so the file is valid JSON after each write, after Stop, after SIGTERM, and after a
// SIGKILL up to the last second.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "daemon/common/status.h"
#include "daemon/observe/observer.h"
#include "daemon/observe/trace_file.h"

namespace sparsync::observe {

class Timeline : public Observer {
 public:
  Timeline(int node_rank, int num_nodes);
  ~Timeline() override;  // Stop()

  // Starts recording into `path_template`, where "{node}" stands for this node's rank. Without
  // "{node}" only node 0 records (like Horovod, whose coordinator writes the timeline): on the
  // other nodes of a job of several nodes this returns OK and records nothing, so that several
  // daemons on one machine never write one file. Recording into that file already: nothing
  // changes; into another: it is closed first. Errors: the file cannot be created.
  Status Start(const std::string& path_template);
  // Writes what is pending and closes the file. Idempotent.
  void Stop();
  // The file being written, or "" when not recording.
  std::string path() const;

  // Observer
  void OnGroup(const GroupView& group) override;
  void OnPlan(const PlanView& plan) override;
  void OnIncident(Incident incident, std::string_view detail) override;

 private:
  struct GroupRecord;
  struct TensorRecord;
  struct InstantRecord;
  struct Batch;

  std::string Resolve(const std::string& path_template) const;
  void StopLocked();  // REQUIRES: control_mu_
  uint32_t RowOf(const std::string& name);  // REQUIRES: mu_
  void WriterLoop();
  void Format(const Batch& batch, std::string* out) const;
  void Push(InstantRecord record);

  const int node_rank_;
  const int num_nodes_;
  std::mutex control_mu_;  // serialises Start and Stop
  std::unique_ptr<TraceFile> file_;  // the writer thread's while it runs; else control_mu_'s
  std::thread writer_;

  std::atomic<bool> active_{false};
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::unique_ptr<Batch> batch_;  // guarded by mu_
  bool stop_ = false;             // guarded by mu_
  std::string path_;              // guarded by mu_
  std::unordered_map<std::string, uint32_t> rows_;  // tensor name -> row; guarded by mu_
  int64_t steady0_ns_ = 0;  // the clocks when recording started
  int64_t wall0_us_ = 0;
};

}  // namespace sparsync::observe
