// IntuneUntrackedDataset: a pass-through whose input runs without the model.
//
// With a model in the iterator context, every iterator records two clock
// readings, an element count and the bytes of every element it returns. For
// the row-level datasets that an interleave creates per input element
// (TextLineDataset and the zips, skips and repeats around it) that
// bookkeeping is a tenth of a row-level pipeline's CPU time, and none of
// those iterators has a knob. This op is one node in the model whose own
// time covers its whole input, which runs with no model at all.
#include <memory>
#include <string>
#include <utility>

#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/model.h"

namespace tensorflow {
namespace intune {
namespace {

namespace model = ::tensorflow::data::model;

inline constexpr char kNodeName[] = "IntuneUntracked";

class IntuneUntrackedDatasetOp : public data::UnaryDatasetOpKernel {
 public:
  explicit IntuneUntrackedDatasetOp(OpKernelConstruction* ctx)
      : UnaryDatasetOpKernel(ctx) {}

 protected:
  void MakeDataset(OpKernelContext* ctx, data::DatasetBase* input,
                   data::DatasetBase** output) override;

 private:
  class Dataset;
};

class IntuneUntrackedDatasetOp::Dataset : public data::DatasetBase {
 public:
  Dataset(OpKernelContext* ctx, const DatasetBase* input)
      : DatasetBase(data::DatasetContext(ctx)), input_(input) {
    input_->Ref();
  }

  ~Dataset() override { input_->Unref(); }

  std::unique_ptr<data::IteratorBase> MakeIteratorInternal(
      const std::string& prefix) const override {
    // The parent's prefix: checkpoint keys are those of the pipeline without
    // the wrapper, so checkpoints restore with InTune on or off.
    return std::make_unique<Iterator>(Iterator::Params{this, prefix});
  }

  const DataTypeVector& output_dtypes() const override {
    return input_->output_dtypes();
  }
  const std::vector<PartialTensorShape>& output_shapes() const override {
    return input_->output_shapes();
  }
  std::string DebugString() const override {
    return "IntuneUntrackedDatasetOp::Dataset";
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
  Status AsGraphDefInternal(data::SerializationContext* ctx,
                            DatasetGraphDefBuilder* b,
                            Node** output) const override {
    Node* input_node = nullptr;
    TF_RETURN_IF_ERROR(b->AddInputDataset(ctx, input_, &input_node));
    return b->AddDataset(this, {input_node}, output);
  }

 private:
  class Iterator : public data::DatasetIterator<Dataset> {
   public:
    explicit Iterator(const Params& params)
        : DatasetIterator<Dataset>(params) {}

    bool SymbolicCheckpointCompatible() const override { return true; }

    Status Initialize(data::IteratorContext* ctx) override {
      data::IteratorContext input_ctx(WithoutModel(ctx));
      Status s = dataset()->input_->MakeIterator(&input_ctx, this, prefix(),
                                                 &input_impl_);
      ctx->MergeCheckpoint(input_ctx.checkpoint());
      return s;
    }

    Status GetNextInternal(data::IteratorContext* ctx,
                           std::vector<Tensor>* out_tensors,
                           bool* end_of_sequence) override {
      data::IteratorContext input_ctx(WithoutModel(ctx));
      Status s = input_impl_->GetNext(&input_ctx, out_tensors, end_of_sequence);
      ctx->MergeCheckpoint(input_ctx.checkpoint());
      return s;
    }

   protected:
    std::shared_ptr<model::Node> CreateNode(
        data::IteratorContext* ctx, model::Node::Args args) const override {
      // Its own name in the model; the prefix it shares is its parent's.
      args.name = kNodeName;
      return model::MakeKnownRatioNode(std::move(args), /*ratio=*/1);
    }

    Status SaveInternal(data::SerializationContext* ctx,
                        data::IteratorStateWriter* writer) override {
      return SaveInput(ctx, writer, input_impl_);
    }

    Status RestoreInternal(data::IteratorContext* ctx,
                           data::IteratorStateReader* reader) override {
      data::IteratorContext input_ctx(WithoutModel(ctx));
      Status s = RestoreInput(&input_ctx, reader, input_impl_);
      ctx->MergeCheckpoint(input_ctx.checkpoint());
      return s;
    }

   private:
    static data::IteratorContext::Params WithoutModel(
        data::IteratorContext* ctx) {
      data::IteratorContext::Params params(ctx);
      params.model = nullptr;
      return params;
    }

    std::unique_ptr<data::IteratorBase> input_impl_;
  };

  const DatasetBase* const input_;
};

void IntuneUntrackedDatasetOp::MakeDataset(OpKernelContext* ctx,
                                           data::DatasetBase* input,
                                           data::DatasetBase** output) {
  *output = new Dataset(ctx, input);
}

REGISTER_KERNEL_BUILDER(Name("IntuneUntrackedDataset").Device(DEVICE_CPU),
                        IntuneUntrackedDatasetOp);

}  // namespace
}  // namespace intune
}  // namespace tensorflow
