// The part every pass-through dataset of the library shares: one input,
// whose elements, element spec, cardinality and external state it keeps.
#ifndef INTUNE_TF_CC_KERNELS_PASS_THROUGH_H_
#define INTUNE_TF_CC_KERNELS_PASS_THROUGH_H_

#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/dataset.h"

namespace tensorflow {
namespace intune {

class PassThroughDataset : public data::DatasetBase {
 public:
  PassThroughDataset(OpKernelContext* ctx, const DatasetBase* input)
      : DatasetBase(data::DatasetContext(ctx)), input_(input) {
    input_->Ref();
  }

  ~PassThroughDataset() override { input_->Unref(); }

  const DataTypeVector& output_dtypes() const override {
    return input_->output_dtypes();
  }
  const std::vector<PartialTensorShape>& output_shapes() const override {
    return input_->output_shapes();
  }
  int64_t CardinalityInternal(data::CardinalityOptions options) const override {
    return input_->Cardinality(options);
  }
  Status InputDatasets(
      std::vector<const DatasetBase*>* inputs) const override {
    inputs->push_back(input_);
    return OkStatus();
  }
  Status CheckExternalState() const override {
    return input_->CheckExternalState();
  }

 protected:
  const DatasetBase* const input_;
};

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_PASS_THROUGH_H_
