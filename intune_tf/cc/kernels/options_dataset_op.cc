// IntuneOptionsDataset: the `experimental_intune` option, in the graph.
//
// `Dataset.with_options` puts one above the options it sets, so that the
// option travels wherever the graph does (tf.function arguments, variants,
// tf.data service). It computes nothing: its iterator is transparent (its
// input's iterator keeps the checkpoint prefix it would have without it), and
// the InTune root removes it when it rewrites the pipeline.
#include <memory>
#include <string>
#include <utility>

#include "intune_tf/cc/kernels/pass_through.h"
#include "intune_tf/cc/kernels/settings.h"
#include "intune_tf/cc/kernels/tf_compat.h"
#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/model.h"

namespace tensorflow {
namespace intune {
namespace {

namespace model = ::tensorflow::data::model;

class IntuneOptionsDatasetOp : public data::UnaryDatasetOpKernel {
 public:
  explicit IntuneOptionsDatasetOp(OpKernelConstruction* ctx)
      : UnaryDatasetOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, Settings::FromAttrs(ctx, &settings_));
  }

 protected:
  void MakeDataset(OpKernelContext* ctx, data::DatasetBase* input,
                   data::DatasetBase** output) override;

 private:
  class Dataset;
  Settings settings_;
};

class IntuneOptionsDatasetOp::Dataset : public PassThroughDataset,
                                        public DeclaresSettings {
 public:
  Dataset(OpKernelContext* ctx, const DatasetBase* input, Settings settings)
      : PassThroughDataset(ctx, input),
        settings_(std::move(settings)) {}

  const Settings& settings() const override { return settings_; }

  std::unique_ptr<data::IteratorBase> MakeIteratorInternal(
      const std::string& prefix) const override {
    return std::make_unique<Iterator>(Iterator::Params{this, prefix});
  }

  std::string DebugString() const override {
    return "IntuneOptionsDatasetOp::Dataset";
  }
  Status Get(OpKernelContext* ctx, int64_t index,
             std::vector<Tensor>* out_tensors) const override {
    return input_->Get(ctx, index, out_tensors);
  }
#if INTUNE_TF_HAS_RANDOM_INDEXING
  Status Get(data::AnyContext ctx, int64_t index,
             std::vector<Tensor>* out_tensors) const override {
    return input_->Get(ctx, index, out_tensors);
  }
  Status RandomIndexingCompatible() const override {
    return input_->RandomIndexingCompatible();
  }
#endif

 protected:
  Status AsGraphDefInternal(data::SerializationContext* ctx,
                            DatasetGraphDefBuilder* b,
                            Node** output) const override {
    Node* input_node = nullptr;
    TF_RETURN_IF_ERROR(b->AddInputDataset(ctx, input_, &input_node));
    return b->AddDataset(this, {input_node}, settings_.ToAttrs(b), output);
  }

 private:
  class Iterator : public data::DatasetIterator<Dataset> {
   public:
    explicit Iterator(const Params& params)
        : DatasetIterator<Dataset>(params) {}

    bool SymbolicCheckpointCompatible() const override { return true; }

    Status Initialize(data::IteratorContext* ctx) override {
      return dataset()->input_->MakeIterator(ctx, this, prefix(),
                                             &input_impl_);
    }

    Status GetNextInternal(data::IteratorContext* ctx,
                           std::vector<Tensor>* out_tensors,
                           bool* end_of_sequence) override {
      return input_impl_->GetNext(ctx, out_tensors, end_of_sequence);
    }

   protected:
    std::shared_ptr<model::Node> CreateNode(
        data::IteratorContext* ctx, model::Node::Args args) const override {
      return model::MakeKnownRatioNode(std::move(args), /*ratio=*/1);
    }

    Status SaveInternal(data::SerializationContext* ctx,
                        data::IteratorStateWriter* writer) override {
      return SaveInput(ctx, writer, input_impl_);
    }

    Status RestoreInternal(data::IteratorContext* ctx,
                           data::IteratorStateReader* reader) override {
      return RestoreInput(ctx, reader, input_impl_);
    }

   private:
    std::unique_ptr<data::IteratorBase> input_impl_;
  };

  const Settings settings_;
};

void IntuneOptionsDatasetOp::MakeDataset(OpKernelContext* ctx,
                                         data::DatasetBase* input,
                                         data::DatasetBase** output) {
  *output = new Dataset(ctx, input, settings_);
}

REGISTER_KERNEL_BUILDER(Name("IntuneOptionsDataset").Device(DEVICE_CPU),
                        IntuneOptionsDatasetOp);

}  // namespace
}  // namespace intune
}  // namespace tensorflow
