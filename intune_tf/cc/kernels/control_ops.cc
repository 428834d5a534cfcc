// Control ops: reach the live tuning sessions from Python.
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "intune_tf/cc/cache_decision.h"
#include "intune_tf/cc/kernels/cache_store.h"
#include "intune_tf/cc/kernels/session_registry.h"
#include "intune_tf/cc/kernels/settings.h"
#include "intune_tf/cc/layout.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace intune {
namespace {

inline constexpr char kSessionId[] = "session_id";
inline constexpr char kPin[] = "pin";

// Checks the rank of input `index` (0: a scalar, 1: a vector); on failure
// sets an InvalidArgument status that names the input and returns false.
bool CheckRank(OpKernelContext* ctx, int index, const char* name, int rank) {
  const TensorShape& shape = ctx->input(index).shape();
  if (shape.dims() == rank) return true;
  ctx->SetStatus(errors::InvalidArgument(
      name, " must be a ", rank == 0 ? "scalar" : "vector", ", got shape ",
      shape.DebugString()));
  return false;
}

// The session named by input 0, null if it is gone; writes output `found`
// (the op's last). Returns false, with the op's status set, if the id is not
// a scalar. A session that is gone is not an error (intune_ops.cc): the op
// then writes its other outputs empty.
bool FindSession(OpKernelContext* ctx,
                 std::shared_ptr<TuningSession>* session) {
  if (!CheckRank(ctx, 0, kSessionId, 0)) return false;
  *session = SessionRegistry::Global()->Lookup(ctx->input(0).scalar<int64_t>()());
  Tensor* found;
  const Status allocated =
      ctx->allocate_output(ctx->num_outputs() - 1, TensorShape({}), &found);
  if (!allocated.ok()) {
    ctx->SetStatus(allocated);
    return false;
  }
  found->scalar<bool>()() = *session != nullptr;
  return true;
}

class IntuneListSessionsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    auto sessions = SessionRegistry::Global()->List();
    const int64_t n = sessions.size();
    Tensor *ids, *tags, *threads;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &ids));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &tags));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &threads));
    for (int64_t i = 0; i < n; ++i) {
      ids->vec<int64_t>()(i) = sessions[i]->id();
      tags->vec<tstring>()(i) = sessions[i]->tag();
      threads->vec<int64_t>()(i) = sessions[i]->creator_thread();
    }
  }
};

class IntuneModelProtoOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    std::shared_ptr<TuningSession> session;
    if (!FindSession(ctx, &session)) return;
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    if (session == nullptr) return;
    absl::StatusOr<std::string> serialized = session->ModelProto();
    OP_REQUIRES_OK(ctx, serialized.status());
    out->scalar<tstring>()() = *serialized;
  }
};

class IntuneListKnobsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    std::shared_ptr<TuningSession> session;
    if (!FindSession(ctx, &session)) return;
    const std::vector<Knob> knobs =
        session != nullptr ? session->ListKnobs() : std::vector<Knob>();
    const int64_t n = knobs.size();
    Tensor *names, *values, *mins, *maxs, *displays;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &names));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &mins));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({n}), &maxs));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({n}), &displays));
    for (int64_t i = 0; i < n; ++i) {
      names->vec<tstring>()(i) = knobs[i].name;
      values->vec<double>()(i) = knobs[i].value;
      mins->vec<double>()(i) = knobs[i].min;
      maxs->vec<double>()(i) = knobs[i].max;
      displays->vec<tstring>()(i) = knobs[i].display;
    }
  }
};

class IntuneSetKnobsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    // Every input's shape first, then the session.
    if (!CheckRank(ctx, 0, kSessionId, 0) || !CheckRank(ctx, 1, "names", 1) ||
        !CheckRank(ctx, 2, "values", 1)) {
      return;
    }
    const Tensor& names_t = ctx->input(1);
    const Tensor& values_t = ctx->input(2);
    OP_REQUIRES(ctx, names_t.NumElements() == values_t.NumElements(),
                errors::InvalidArgument("Got ", names_t.NumElements(),
                                        " knob names but ",
                                        values_t.NumElements(), " values."));
    std::shared_ptr<TuningSession> session;
    if (!FindSession(ctx, &session)) return;
    if (session == nullptr) {
      Tensor* none;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({0}), &none));
      return;
    }
    std::vector<std::string> names;
    std::vector<double> values;
    for (int64_t i = 0; i < names_t.NumElements(); ++i) {
      names.emplace_back(names_t.vec<tstring>()(i));
    }
    for (int64_t i = 0; i < values_t.NumElements(); ++i) {
      values.push_back(values_t.vec<double>()(i));
    }
    absl::StatusOr<std::vector<double>> set = session->SetKnobs(names, values);
    OP_REQUIRES_OK(ctx, set.status());
    const std::vector<double>& applied = *set;
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({static_cast<int64_t>(applied.size())}),
                            &out));
    for (size_t i = 0; i < applied.size(); ++i) out->vec<double>()(i) = applied[i];
  }
};

// The counters in the order IntuneSessionCounters documents (zeros for a
// session that is gone).
std::vector<int64_t> CounterFields(const TuningSession* session) {
  std::vector<int64_t> fields(kNumCounters, 0);
  if (session == nullptr) return fields;
  const SessionCounters c = session->Counters();
  fields[kCounterElements] = c.elements;
  fields[kCounterGapTimeUs] = c.gap_time_us;
  fields[kCounterGapCount] = c.gap_count;
  fields[kCounterGetNextTimeUs] = c.get_next_time_us;
  fields[kCounterBufferedBytes] = c.buffered_bytes;
  fields[kCounterPeakBufferedBytes] = c.peak_buffered_bytes;
  fields[kCounterRamBudget] = c.ram_budget;
  fields[kCounterGuardShrinks] = c.guard_shrinks;
  fields[kCounterGuardOverBudget] = c.guard_over_budget;
  fields[kCounterCreatedUs] = c.created_us;
  fields[kCounterUnlowerableBytes] = c.unlowerable_bytes;
  fields[kCounterPinnedRamBudget] = c.pinned_ram_budget;
  fields[kCounterCacheBytes] = c.cache_bytes;
  fields[kCounterCacheLimit] = c.cache_limit;
  fields[kCounterCacheElements] = c.cache_elements;
  fields[kCounterCacheComplete] = c.cache_complete;
  fields[kCounterCacheHits] = c.cache_hits;
  fields[kCounterCacheMisses] = c.cache_misses;
  fields[kCounterCacheSavedUs] = c.cache_saved_us;
  fields[kCounterCacheShrinks] = c.cache_shrinks;
  fields[kCounterRowStoreRows] = c.row_store_rows;
  fields[kCounterRowStoreBytes] = c.row_store_bytes;
  fields[kCounterRowStoreGathered] = c.row_store_gathered;
  return fields;
}

Status OutputCounters(OpKernelContext* ctx, int index,
                      const TuningSession* session) {
  const std::vector<int64_t> fields = CounterFields(session);
  Tensor* out;
  TF_RETURN_IF_ERROR(ctx->allocate_output(
      index, TensorShape({static_cast<int64_t>(fields.size())}), &out));
  for (size_t i = 0; i < fields.size(); ++i) out->vec<int64_t>()(i) = fields[i];
  return OkStatus();
}

class IntuneSessionCountersOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    std::shared_ptr<TuningSession> session;
    if (!FindSession(ctx, &session)) return;
    OP_REQUIRES_OK(ctx, OutputCounters(ctx, 0, session.get()));
  }
};

// What became of the session's cache (cache_decision.h): its state, where,
// and why there or why none.
class IntuneSessionCacheOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    std::shared_ptr<TuningSession> session;
    if (!FindSession(ctx, &session)) return;
    const CacheDecision decision =
        session != nullptr ? session->cache_decision() : CacheDecision();
    const std::string fields[] = {CacheStateName(decision.state),
                                  decision.point, decision.reason};
    for (int i = 0; i < 3; ++i) {
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({}), &out));
      out->scalar<tstring>()() = fields[i];
    }
  }
};

// Knobs, per-node statistics and counters in one call: one tuning step's
// reading of the session.
class IntuneObserveOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    std::shared_ptr<TuningSession> session;
    if (!FindSession(ctx, &session)) return;
    std::vector<Knob> knobs;
    std::vector<StageSample> stages;
    if (session != nullptr) session->Observe(&knobs, &stages);
    const int64_t k = knobs.size();
    const int64_t s = stages.size();
    Tensor *knob_names, *knob_values, *stage_names, *stage_stats,
        *knob_displays;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({k}), &knob_names));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(
                            1, TensorShape({k, kNumKnobColumns}), &knob_values));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(2, TensorShape({s}), &stage_names));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(
                            3, TensorShape({s, kNumStageColumns}), &stage_stats));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(5, TensorShape({k}), &knob_displays));
    auto values = knob_values->matrix<double>();
    for (int64_t i = 0; i < k; ++i) {
      knob_names->vec<tstring>()(i) = knobs[i].name;
      knob_displays->vec<tstring>()(i) = knobs[i].display;
      values(i, kKnobValue) = knobs[i].value;
      values(i, kKnobMin) = knobs[i].min;
      values(i, kKnobMax) = knobs[i].max;
    }
    auto stats = stage_stats->matrix<int64_t>();
    for (int64_t i = 0; i < s; ++i) {
      const StageSample& st = stages[i];
      stage_names->vec<tstring>()(i) = st.name;
      stats(i, kStageElements) = st.elements;
      stats(i, kStageProcessingTimeNs) = st.processing_time_ns;
      stats(i, kStageBufferedBytes) = st.buffered_bytes;
      stats(i, kStageBufferedElements) = st.buffered_elements;
      stats(i, kStageBytesProduced) = st.bytes_produced;
      stats(i, kStageBytesConsumed) = st.bytes_consumed;
      stats(i, kStageNodeId) = st.node_id;
    }
    OP_REQUIRES_OK(ctx, OutputCounters(ctx, 4, session.get()));
  }
};

class IntuneLayoutOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Tensor *counters, *columns;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({kNumCounters}),
                                             &counters));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, TensorShape({kNumStageColumns}), &columns));
    for (int i = 0; i < kNumCounters; ++i) {
      counters->vec<tstring>()(i) = kCounterNames[i];
    }
    for (int i = 0; i < kNumStageColumns; ++i) {
      columns->vec<tstring>()(i) = kStageColumnNames[i];
    }
  }
};

// Input `index`, a scalar RAM budget in bytes, else sets the op's status
// (naming the input) and returns false.
bool ReadRamBudget(OpKernelContext* ctx, int index, int64_t* bytes) {
  if (!CheckRank(ctx, index, kRamBudget, 0)) return false;
  *bytes = ctx->input(index).scalar<int64_t>()();
  if (*bytes >= 0) return true;
  ctx->SetStatus(errors::InvalidArgument(kRamBudget, " must be >= 0 bytes, got ",
                                         *bytes, "."));
  return false;
}

class IntuneSetRamBudgetOp : public OpKernel {
 public:
  explicit IntuneSetRamBudgetOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kPin, &pin_));
  }
  void Compute(OpKernelContext* ctx) override {
    int64_t budget;
    if (!CheckRank(ctx, 0, kSessionId, 0) || !ReadRamBudget(ctx, 1, &budget)) {
      return;
    }
    std::shared_ptr<TuningSession> session;
    if (!FindSession(ctx, &session)) return;
    if (session != nullptr) session->set_ram_budget(budget, pin_);
  }

 private:
  bool pin_;
};

class IntuneSetDefaultRamBudgetOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    int64_t budget;
    if (!ReadRamBudget(ctx, 0, &budget)) return;
    SessionRegistry::Global()->SetDefaultRamBudget(budget);
  }
};

class IntuneProcessCachesOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    CacheStore* store = CacheStore::Global();
    const int64_t room = store->room();
    const int64_t figures[] = {
        static_cast<int64_t>(store->List().size()), store->bytes(),
        room == std::numeric_limits<int64_t>::max() ? -1 : room,
        store->process_budget(), store->buffered()};
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({5}), &out));
    for (int i = 0; i < 5; ++i) out->vec<int64_t>()(i) = figures[i];
  }
};

REGISTER_KERNEL_BUILDER(Name("IntuneListSessions").Device(DEVICE_CPU),
                        IntuneListSessionsOp);
REGISTER_KERNEL_BUILDER(Name("IntuneModelProto").Device(DEVICE_CPU),
                        IntuneModelProtoOp);
REGISTER_KERNEL_BUILDER(Name("IntuneListKnobs").Device(DEVICE_CPU),
                        IntuneListKnobsOp);
REGISTER_KERNEL_BUILDER(Name("IntuneSetKnobs").Device(DEVICE_CPU),
                        IntuneSetKnobsOp);
REGISTER_KERNEL_BUILDER(Name("IntuneSessionCounters").Device(DEVICE_CPU),
                        IntuneSessionCountersOp);
REGISTER_KERNEL_BUILDER(Name("IntuneObserve").Device(DEVICE_CPU),
                        IntuneObserveOp);
REGISTER_KERNEL_BUILDER(Name("IntuneSessionCache").Device(DEVICE_CPU),
                        IntuneSessionCacheOp);
REGISTER_KERNEL_BUILDER(Name("IntuneLayout").Device(DEVICE_CPU),
                        IntuneLayoutOp);
REGISTER_KERNEL_BUILDER(Name("IntuneSetRamBudget").Device(DEVICE_CPU),
                        IntuneSetRamBudgetOp);
REGISTER_KERNEL_BUILDER(Name("IntuneSetDefaultRamBudget").Device(DEVICE_CPU),
                        IntuneSetDefaultRamBudgetOp);
REGISTER_KERNEL_BUILDER(Name("IntuneProcessCaches").Device(DEVICE_CPU),
                        IntuneProcessCachesOp);

}  // namespace
}  // namespace intune
}  // namespace tensorflow
