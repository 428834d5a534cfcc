// A live tuning session: the model of one iterator of an IntuneRootDataset.
//
// The root iterator owns a `model::Model`; a `TuningSession` shares it with
// the control ops (which find it through `SessionRegistry`). It names the
// model's nodes (stage_names.h), sets their knobs, and runs the RAM budget
// guard's pass (EnforceBudget gathers the inputs of budget_guard.h's
// PlanBudget and writes its outputs).
#ifndef INTUNE_TF_CC_KERNELS_TUNING_SESSION_H_
#define INTUNE_TF_CC_KERNELS_TUNING_SESSION_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "intune_tf/cc/cache_decision.h"
#include "intune_tf/cc/kernels/cache_store.h"
#include "intune_tf/cc/kernels/node_access.h"
#include "tensorflow/core/framework/model.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/thread_annotations.h"

namespace tensorflow {
namespace intune {

using ModelPtr = std::shared_ptr<model::Model>;

// A knob of the pipeline, as seen from outside: one per name, whatever the
// number of live instances of its stage. Names: see stage_names.h.
struct Knob {
  std::string name;  // "<stage name>/<parameter>"
  std::string parameter;
  double value;         // in force on the first instance (output first)
  double min;           // the largest minimum of the instances
  double max;           // the smallest maximum of the instances
  std::string display;  // the instances' node long names, comma-separated
};

// One node of the pipeline's model, as exported by IntuneObserve.
struct StageSample {
  std::string name;     // the stage name (stage_names.h)
  int64_t node_id;      // the model node's id (display only)
  int64_t elements;
  int64_t processing_time_ns;
  int64_t buffered_bytes;
  int64_t buffered_elements;
  int64_t bytes_produced;
  int64_t bytes_consumed;
};

// Counters of a session, exported in this order by IntuneSessionCounters.
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
  // Bytes the guard could not lower at its last thorough pass (stages
  // without a memory knob: shuffle, cache, fixed buffers).
  int64_t unlowerable_bytes = 0;
  int64_t created_us = 0;         // wall-clock microseconds since the epoch
  int64_t pinned_ram_budget = 0;  // the user's pin (set_ram_budget); 0: none
  // InTune's cache (cache_store.h), over the entries the session reads.
  int64_t cache_bytes = 0;         // bytes held now
  int64_t cache_limit = 0;         // bytes the guard lets them hold
  int64_t cache_elements = 0;      // elements held now
  int64_t cache_complete = 0;      // entries that hold a whole epoch
  int64_t cache_hits = 0;          // elements this session read from a cache
  int64_t cache_misses = 0;        // elements it read from the input instead
  int64_t cache_saved_us = 0;      // upstream time the hits saved
  int64_t cache_shrinks = 0;       // bytes the guard dropped from caches
  int64_t row_store_rows = 0;      // rows the caches' row stores hold
  int64_t row_store_bytes = 0;     // their bytes
  int64_t row_store_gathered = 0;  // batches gathered from them
};

class TuningSession {
 public:
  TuningSession(int64_t id, std::string tag, int64_t ram_budget,
                ModelPtr tf_model);
  ~TuningSession();

  int64_t id() const { return id_; }
  const std::string& tag() const { return tag_; }
  // The OS thread (Linux tid) that made the session: the thread that created
  // its iterator (eager iterators are made on the caller's thread).
  int64_t creator_thread() const { return creator_thread_; }
  const ModelPtr& tf_model() const { return model_; }

  // The live knobs, and the idle ones below the cache (their stages do not
  // run while it serves an epoch: `display` empty, `value` the one they
  // come back at), sorted by name.
  std::vector<Knob> ListKnobs() TF_LOCKS_EXCLUDED(mu_);

  // Validates every (name, value) pair first; applies none unless all are
  // valid. A name is valid when the session has seen the knob (its stage may
  // be between two instances, e.g. between two epochs of a `repeat`). A value
  // is valid when finite and within the knob's range; it is rounded and
  // clamped to the range (and to what an int64 holds) before it is written
  // to every live instance of the knob, and remembered: instances created
  // later start at it. Returns the values in force afterwards (the guard may
  // lower buffer knobs below what was asked).
  absl::StatusOr<std::vector<double>> SetKnobs(
      const std::vector<std::string>& names, const std::vector<double>& values)
      TF_LOCKS_EXCLUDED(mu_);

  // The model as a serialized ModelProto.
  absl::StatusOr<std::string> ModelProto() TF_LOCKS_EXCLUDED(mu_);

  // The model's nodes, breadth first from the output: what a ModelProto
  // snapshot gives the tuner, without building and parsing one.
  std::vector<StageSample> Stages() TF_LOCKS_EXCLUDED(mu_);

  // Knobs and stages from one walk of the model (IntuneObserve).
  void Observe(std::vector<Knob>* knobs, std::vector<StageSample>* stages)
      TF_LOCKS_EXCLUDED(mu_);

  // Brings the nodes created since the last pass to the knob values last set
  // for their names (`SetKnobs`), and buffer knobs that have none to TF's
  // starting size (at least one element: a prefetch of 0 passes elements
  // through without overlap). Called by every other method that walks the
  // model, so also every `guard_period_us` by the root's guard thread (via
  // EnforceBudget). Its bookkeeping is one entry per live node and one per
  // knob name: it does not grow with the elements or the instances created.
  void SyncKnobs() TF_LOCKS_EXCLUDED(mu_);

  // Syncs knobs (SyncKnobs), then lowers memory knobs until the pipeline's
  // committed buffer bytes fit the RAM budget. Called after every SetKnobs
  // (`thorough`) and by the guard thread, which skips the knob pass while
  // the bytes actually buffered are below half the budget: buffers then only
  // grow by filling, which the next round (5 ms later) sees long before they
  // reach the budget.
  // With `proposal` (values about to be set, by parameter), the pass counts
  // them instead of the parameters' values and writes them, lowered where the
  // budget requires, in one step under mu_.
  using Proposal = absl::flat_hash_map<const model::Parameter*, double>;
  void EnforceBudget(bool thorough = true, const Proposal* proposal = nullptr)
      TF_LOCKS_EXCLUDED(mu_);

  // The budget in force; with `pin`, also the user's pin, which the tuner's
  // budget service keeps (it writes budgets without `pin`).
  void set_ram_budget(int64_t bytes, bool pin = false);
  void RecordGetNext(int64_t start_us, int64_t end_us);
  SessionCounters Counters() const;

  // A cache entry read by this session's pipeline: its bytes are under the
  // session's budget. The guard gives the caches what the buffers leave of
  // the budget and, under pressure, shrinks them before any buffer knob.
  // Called from a cache iterator's Initialize, nested in its parents'
  // (a prefetch holds its buffer's lock there, which SyncLocked takes under
  // mu_): it must not take mu_, so the knobs it brings wait in
  // `pending_below_` for the next SyncLocked.
  void AttachCache(std::shared_ptr<CacheEntry> entry)
      TF_LOCKS_EXCLUDED(cache_mu_, mu_);
  // An element read from a cache (`from_cache`, which saved
  // `upstream_us` of the input's time), or from the input.
  void RecordCacheRead(bool from_cache, double upstream_us);
  // What became of the pipeline's cache (cache_decision.h): the rewrite's
  // decision when the session starts (IntuneRootDataset), replaced by the
  // cache's kernel when it declines at run time. The last one stands.
  void DecideCache(CacheDecision decision) TF_LOCKS_EXCLUDED(cache_mu_);
  CacheDecision cache_decision() const TF_LOCKS_EXCLUDED(cache_mu_);

 private:
  // One node of a walk of the model, parents before children.
  // A bounded interleave's release node (bounded_buffers.h) is left out: the
  // walk goes from its parent straight to the interleave.
  struct WalkNode {
    std::shared_ptr<model::Node> node;
    int parent;    // index in the walk; -1 for the output
    int position;  // among the parent's inputs
    int siblings;  // the parent's number of inputs
    int64_t id;    // the node's id, or the id of the node left out above it
    bool below_cache = false;  // InTune's cache is above it
    // Set by SyncLocked; valid only while mu_ is held (it points into
    // `nodes_`, whose entries a later SyncLocked erases).
    const std::string* stage = nullptr;
  };
  // What the session remembers of a knob name.
  struct KnownKnob {
    double min = 0;
    double max = 0;
    bool has_value = false;  // set by SetKnobs
    double value = 0;
    // The value of the first instance once synced: what the guard raises a
    // knob back to when no value was ever set.
    bool has_start = false;
    double start = 0;
    // The most the guard allowed at its last pass (infinite before one).
    double allowed = std::numeric_limits<double>::infinity();
    // Its stage runs below InTune's cache: while the cache serves an epoch
    // it does not run, and the knob stays listed, idle, at `last` (its
    // value when last seen live) or the value set since.
    bool below_cache = false;
    bool has_last = false;
    double last = 0;
  };
  // A live node: its stage name, and the last pass that saw it.
  struct NodeEntry {
    std::string stage;
    uint64_t pass = 0;
  };

  // Sets the caches' limits from the budget and the bytes buffered now.
  void LimitCaches(int64_t budget, int64_t buffered)
      TF_LOCKS_EXCLUDED(cache_mu_);
  std::vector<std::shared_ptr<CacheEntry>> Caches() const
      TF_LOCKS_EXCLUDED(cache_mu_);

  std::vector<WalkNode> Walk() const TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Names the nodes of `walk`, applies remembered values to the new ones,
  // forgets the nodes that are gone.
  void SyncLocked(std::vector<WalkNode>* walk) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the knobs below the caches attached since the last pass known,
  // idle until their stages run (a session served from the cache from the
  // start).
  void AdoptKnobsBelowLocked() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string StageName(const std::vector<WalkNode>& walk, int index) const;
  std::vector<Knob> KnobsLocked(const std::vector<WalkNode>& walk)
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the caches the knobs of `names` that run below them, at the value
  // they come back at (CacheEntry::RememberKnobs).
  void TellCachesLocked(const std::vector<std::string>& names)
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t id_;
  const std::string tag_;
  const int64_t creator_thread_;
  const ModelPtr model_;
  const int64_t created_us_;

  std::atomic<int64_t> ram_budget_;
  std::atomic<int64_t> pinned_ram_budget_{0};
  std::atomic<int64_t> elements_{0};
  std::atomic<int64_t> gap_time_us_{0};
  std::atomic<int64_t> gap_count_{0};
  std::atomic<int64_t> get_next_time_us_{0};
  std::atomic<int64_t> last_end_us_{0};
  std::atomic<int64_t> peak_buffered_bytes_{0};
  std::atomic<int64_t> guard_shrinks_{0};
  std::atomic<int64_t> guard_over_budget_{0};
  std::atomic<int64_t> unlowerable_bytes_{0};
  std::atomic<int64_t> cache_hits_{0};
  std::atomic<int64_t> cache_misses_{0};
  std::atomic<double> cache_saved_us_{0};
  std::atomic<int64_t> cache_shrinks_{0};

  // A leaf: nothing else is locked while it is held.
  mutable mutex cache_mu_;
  std::vector<std::shared_ptr<CacheEntry>> caches_ TF_GUARDED_BY(cache_mu_);
  std::vector<CacheEntry::KnobBelow> pending_below_ TF_GUARDED_BY(cache_mu_);
  CacheDecision cache_decision_ TF_GUARDED_BY(cache_mu_);

  // Serializes knob writes (SetKnobs, the sync pass, the guard), so that a
  // validated batch of values is applied and then enforced as one step, and
  // guards the bookkeeping of the sync pass.
  mutable mutex mu_;
  uint64_t pass_ TF_GUARDED_BY(mu_) = 0;
  // Live nodes by id (std::unordered_map: the walk keeps pointers to the
  // stage names, which must not move when the map grows).
  std::unordered_map<int64_t, NodeEntry> nodes_ TF_GUARDED_BY(mu_);
  std::map<std::string, KnownKnob> known_ TF_GUARDED_BY(mu_);
};

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_TUNING_SESSION_H_
