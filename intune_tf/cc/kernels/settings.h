// What a pipeline's `experimental_intune` option asks for, as carried in the
// graph by IntuneOptionsDataset (a declaration) and IntuneDataset (the root).
#ifndef INTUNE_TF_CC_KERNELS_SETTINGS_H_
#define INTUNE_TF_CC_KERNELS_SETTINGS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/status.h"

namespace tensorflow {
namespace intune {

inline constexpr char kTag[] = "tag";
inline constexpr char kEnabled[] = "enabled";
inline constexpr char kRamBudget[] = "ram_budget";
inline constexpr char kMaxParallelism[] = "max_parallelism";
inline constexpr char kGuardPeriodUs[] = "guard_period_us";
inline constexpr char kIncludeFixed[] = "include_fixed";
inline constexpr char kInsertPrefetch[] = "insert_prefetch";
inline constexpr char kUntrackInner[] = "untrack_inner";
inline constexpr char kInterleaveBuffer[] = "interleave_buffer";

struct Settings {
  std::string tag;  // the IntuneOptions JSON, shown by session listings
  bool enabled = true;
  int64_t ram_budget = 0;       // bytes; 0 = no guard
  int64_t max_parallelism = 0;  // private runner pool size; 0 = TF's runner
  int64_t guard_period_us = 5000;
  bool include_fixed = false;
  bool insert_prefetch = false;
  bool untrack_inner = true;
  int64_t interleave_buffer = 0;  // 0 = TF's

  // Reads and checks the attributes above.
  static Status FromAttrs(OpKernelConstruction* ctx, Settings* settings);
  // The attributes above, for AsGraphDefInternal.
  std::vector<std::pair<StringPiece, AttrValue>> ToAttrs(
      data::DatasetBase::DatasetGraphDefBuilder* b) const;
};

// Implemented by the dataset of IntuneOptionsDataset.
class DeclaresSettings {
 public:
  virtual const Settings& settings() const = 0;

 protected:
  ~DeclaresSettings() = default;
};

// The declaration in force for `dataset`, in TF's order for options: a
// declaration overrides everything below it, and among the inputs of one
// dataset the later input wins (as `Options` merge). nullptr when none.
const Settings* FindSettings(const data::DatasetBase* dataset);

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_SETTINGS_H_
