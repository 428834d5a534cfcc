// What a pipeline's `experimental_intune` option asks for, as carried in the
// graph by IntuneOptionsDataset (a declaration) and IntuneRootDataset (the
// root).
#ifndef INTUNE_TF_CC_KERNELS_SETTINGS_H_
#define INTUNE_TF_CC_KERNELS_SETTINGS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "intune_tf/cc/settings_fields.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/status.h"

namespace tensorflow {
namespace intune {

// The attribute names (settings_fields.h): kTag, kEnabled, kRamBudget, ...
#define INTUNE_SETTING_NAME(constant, name, cc_type, attr_type, value) \
  inline constexpr char k##constant[] = #name;
INTUNE_SETTINGS_FIELDS(INTUNE_SETTING_NAME)
#undef INTUNE_SETTING_NAME

// The attributes' values (SettingValues, settings_fields.h: ram_budget 0 is
// unset: the process default, SessionRegistry::Create), max_cpus 0 keeps TF's runner, interleave_buffer 0 keeps TF's).
struct Settings : SettingValues {
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
