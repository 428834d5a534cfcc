#include "intune_tf/cc/kernels/settings.h"

#include "absl/container/flat_hash_map.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace {

const Settings* Find(
    const data::DatasetBase* dataset,
    absl::flat_hash_map<const data::DatasetBase*, const Settings*>* seen) {
  auto it = seen->find(dataset);
  if (it != seen->end()) return it->second;
  const Settings* result = nullptr;
  if (const auto* declared = dynamic_cast<const DeclaresSettings*>(dataset)) {
    result = &declared->settings();
  } else {
    std::vector<const data::DatasetBase*> inputs;
    if (dataset->InputDatasets(&inputs).ok()) {
      for (const data::DatasetBase* input : inputs) {
        if (const Settings* found = Find(input, seen)) result = found;
      }
    }
  }
  (*seen)[dataset] = result;
  return result;
}

}  // namespace

Status Settings::FromAttrs(OpKernelConstruction* ctx, Settings* s) {
  TF_RETURN_IF_ERROR(ctx->GetAttr(kTag, &s->tag));
  TF_RETURN_IF_ERROR(ctx->GetAttr(kEnabled, &s->enabled));
  TF_RETURN_IF_ERROR(ctx->GetAttr(kRamBudget, &s->ram_budget));
  TF_RETURN_IF_ERROR(ctx->GetAttr(kMaxParallelism, &s->max_parallelism));
  TF_RETURN_IF_ERROR(ctx->GetAttr(kGuardPeriodUs, &s->guard_period_us));
  TF_RETURN_IF_ERROR(ctx->GetAttr(kIncludeFixed, &s->include_fixed));
  TF_RETURN_IF_ERROR(ctx->GetAttr(kInsertPrefetch, &s->insert_prefetch));
  TF_RETURN_IF_ERROR(ctx->GetAttr(kUntrackInner, &s->untrack_inner));
  TF_RETURN_IF_ERROR(ctx->GetAttr(kInterleaveBuffer, &s->interleave_buffer));
  if (s->ram_budget < 0) {
    return errors::InvalidArgument(
        "ram_budget must be >= 0 bytes (0 = no budget), got ", s->ram_budget,
        ".");
  }
  if (s->max_parallelism < 0) {
    return errors::InvalidArgument(
        "max_parallelism must be >= 0 (0 = the runner's thread pool size), "
        "got ", s->max_parallelism, ".");
  }
  if (s->guard_period_us <= 0) {
    return errors::InvalidArgument("guard_period_us must be > 0, got ",
                                   s->guard_period_us, ".");
  }
  if (s->interleave_buffer < 0) {
    return errors::InvalidArgument(
        "interleave_buffer must be >= 0 (0 = TF's), got ",
        s->interleave_buffer, ".");
  }
  return OkStatus();
}

std::vector<std::pair<StringPiece, AttrValue>> Settings::ToAttrs(
    data::DatasetBase::DatasetGraphDefBuilder* b) const {
  std::vector<std::pair<StringPiece, AttrValue>> attrs(9);
  attrs[0].first = kTag;
  b->BuildAttrValue(tag, &attrs[0].second);
  attrs[1].first = kEnabled;
  b->BuildAttrValue(enabled, &attrs[1].second);
  attrs[2].first = kRamBudget;
  b->BuildAttrValue(ram_budget, &attrs[2].second);
  attrs[3].first = kMaxParallelism;
  b->BuildAttrValue(max_parallelism, &attrs[3].second);
  attrs[4].first = kGuardPeriodUs;
  b->BuildAttrValue(guard_period_us, &attrs[4].second);
  attrs[5].first = kIncludeFixed;
  b->BuildAttrValue(include_fixed, &attrs[5].second);
  attrs[6].first = kInsertPrefetch;
  b->BuildAttrValue(insert_prefetch, &attrs[6].second);
  attrs[7].first = kUntrackInner;
  b->BuildAttrValue(untrack_inner, &attrs[7].second);
  attrs[8].first = kInterleaveBuffer;
  b->BuildAttrValue(interleave_buffer, &attrs[8].second);
  return attrs;
}

const Settings* FindSettings(const data::DatasetBase* dataset) {
  absl::flat_hash_map<const data::DatasetBase*, const Settings*> seen;
  return Find(dataset, &seen);
}

}  // namespace intune
}  // namespace tensorflow
