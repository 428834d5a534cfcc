// Live tuning sessions: one per iterator of an IntuneDataset.
//
// The root iterator owns a `model::Model`; a `TuningSession` shares it with the
// control ops, which find it by id through the process-wide `SessionRegistry`.
#ifndef INTUNE_TF_CC_KERNELS_SESSION_REGISTRY_H_
#define INTUNE_TF_CC_KERNELS_SESSION_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/model.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/status.h"
#include "tensorflow/core/platform/thread_annotations.h"

namespace tensorflow {
namespace intune {

namespace model = ::tensorflow::data::model;
using ModelPtr = std::shared_ptr<model::Model>;

inline constexpr char kParallelism[] = "parallelism";
inline constexpr char kBufferSize[] = "buffer_size";

// A tunable parameter of the model, as seen from outside.
struct Knob {
  std::string name;  // "<node long name>/<parameter name>"
  std::string parameter;
  double value;
  double min;
  double max;
};

// One node of the pipeline's model, as exported by IntuneObserve.
struct StageSample {
  std::string name;  // the node's long name, "<Name>(id:<n>)"
  int64_t elements;
  int64_t processing_time_ns;
  int64_t buffered_bytes;
  int64_t buffered_elements;
  int64_t bytes_produced;
  int64_t bytes_consumed;
};

// Counters of a session, exported in this order by IntuneSessionStats.
struct SessionCounters {
  int64_t elements = 0;           // elements returned by the root
  int64_t gap_time_us = 0;        // total consumer time between GetNext calls
  int64_t gap_count = 0;          // number of gaps recorded
  int64_t get_next_time_us = 0;   // total time spent inside the root GetNext
  int64_t buffered_bytes = 0;     // now, summed over the pipeline
  int64_t peak_buffered_bytes = 0;
  int64_t ram_budget = 0;         // bytes; 0 = no guard
  int64_t guard_shrinks = 0;      // knob decrements made by the guard
  int64_t guard_over_budget = 0;  // guard rounds that found bytes over budget
  int64_t created_us = 0;         // wall-clock microseconds since the epoch
};

class TuningSession {
 public:
  TuningSession(int64_t id, std::string tag, int64_t ram_budget,
                ModelPtr tf_model);

  int64_t id() const { return id_; }
  const std::string& tag() const { return tag_; }
  const ModelPtr& tf_model() const { return model_; }

  std::vector<Knob> ListKnobs() const;

  // Validates every (name, value) pair first; applies none unless all are
  // valid. Returns the values in force afterwards (the guard may lower buffer
  // knobs below what was asked).
  Status SetKnobs(const std::vector<std::string>& names,
                  const std::vector<double>& values,
                  std::vector<double>* applied);

  Status ModelProto(std::string* serialized);

  // The model's nodes, breadth first from the output: what a ModelProto
  // snapshot gives the tuner, without building and parsing one.
  std::vector<StageSample> Stages() const;

  // Lowers memory knobs until the pipeline's committed buffer bytes fit the
  // RAM budget. Called after every SetKnobs (`thorough`) and by the guard
  // thread, which skips the knob pass while the bytes actually buffered are
  // below half the budget: buffers then only grow by filling, which the next
  // round (5 ms later) sees long before they reach the budget.
  void EnforceBudget(bool thorough = true) TF_LOCKS_EXCLUDED(mu_);

  void set_ram_budget(int64_t bytes);
  void RecordGetNext(int64_t start_us, int64_t end_us);
  SessionCounters Counters() const;

 private:
  const int64_t id_;
  const std::string tag_;
  const ModelPtr model_;
  const int64_t created_us_;

  std::atomic<int64_t> ram_budget_;
  std::atomic<int64_t> elements_{0};
  std::atomic<int64_t> gap_time_us_{0};
  std::atomic<int64_t> gap_count_{0};
  std::atomic<int64_t> get_next_time_us_{0};
  std::atomic<int64_t> last_end_us_{0};
  std::atomic<int64_t> peak_buffered_bytes_{0};
  std::atomic<int64_t> guard_shrinks_{0};
  std::atomic<int64_t> guard_over_budget_{0};

  // Serializes knob writes from SetKnobs and the guard, so that a validated
  // batch of values is applied and then enforced as one step.
  mutable mutex mu_;
};

class SessionRegistry {
 public:
  static SessionRegistry* Global();

  std::shared_ptr<TuningSession> Create(const std::string& tag,
                                        int64_t ram_budget,
                                        ModelPtr tf_model)
      TF_LOCKS_EXCLUDED(mu_);
  void Remove(int64_t id) TF_LOCKS_EXCLUDED(mu_);
  // Live sessions, oldest first.
  std::vector<std::shared_ptr<TuningSession>> List() const
      TF_LOCKS_EXCLUDED(mu_);
  Status Lookup(int64_t id, std::shared_ptr<TuningSession>* session) const
      TF_LOCKS_EXCLUDED(mu_);

 private:
  mutable mutex mu_;
  int64_t next_id_ TF_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::weak_ptr<TuningSession>> sessions_ TF_GUARDED_BY(mu_);
};

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_SESSION_REGISTRY_H_
