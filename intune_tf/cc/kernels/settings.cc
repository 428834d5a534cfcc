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
#define INTUNE_SETTING_GET(constant, name, cc_type, attr_type, value) \
  TF_RETURN_IF_ERROR(ctx->GetAttr(k##constant, &s->name));
  INTUNE_SETTINGS_FIELDS(INTUNE_SETTING_GET)
#undef INTUNE_SETTING_GET
  if (s->ram_budget < 0) {
    return errors::InvalidArgument(
        "ram_budget must be >= 0 bytes (0 = no budget), got ", s->ram_budget,
        ".");
  }
  if (s->max_cpus < 0) {
    return errors::InvalidArgument(
        "max_cpus must be >= 0 (0 = the runner's thread pool size), got ",
        s->max_cpus, ".");
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
  std::vector<std::pair<StringPiece, AttrValue>> attrs;
#define INTUNE_SETTING_PUT(constant, name, cc_type, attr_type, value) \
  attrs.emplace_back(k##constant, AttrValue());                    \
  b->BuildAttrValue(name, &attrs.back().second);
  INTUNE_SETTINGS_FIELDS(INTUNE_SETTING_PUT)
#undef INTUNE_SETTING_PUT
  return attrs;
}

const Settings* FindSettings(const data::DatasetBase* dataset) {
  absl::flat_hash_map<const data::DatasetBase*, const Settings*> seen;
  return Find(dataset, &seen);
}

}  // namespace intune
}  // namespace tensorflow
