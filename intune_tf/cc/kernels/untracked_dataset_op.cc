// IntuneUntrackedDataset: a pass-through whose input runs without the model.
//
// With a model in the iterator context, every iterator records two clock
// readings, an element count and the bytes of every element it returns. For
// the row-level datasets that an interleave creates per input element
// (TextLineDataset and the zips, skips and repeats around it) that
// bookkeeping is a tenth of a row-level pipeline's CPU time, and none of
// those iterators has a knob. This op is one node in the model whose own
// time covers its whole input, which runs with no model at all.
//
// With a `buffer_group`, each iterator is one input of a parallel interleave
// whose buffers the guard bounds (bounded_buffers.h).
#include <memory>
#include <string>
#include <utility>

#include "intune_tf/cc/kernels/bounded_buffers.h"
#include "intune_tf/cc/kernels/pass_through.h"
#include "intune_tf/cc/op_names.h"
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
      : UnaryDatasetOpKernel(ctx) {
    OP_REQUIRES_OK(ctx,
                   ctx->GetAttr(kBufferGroupAttr, &buffer_group_));
  }

 protected:
  void MakeDataset(OpKernelContext* ctx, data::DatasetBase* input,
                   data::DatasetBase** output) override;

 private:
  class Dataset;

  std::string buffer_group_;
};

class IntuneUntrackedDatasetOp::Dataset : public PassThroughDataset {
 public:
  Dataset(OpKernelContext* ctx, const DatasetBase* input,
          std::string buffer_group)
      : PassThroughDataset(ctx, input),
        buffer_group_(std::move(buffer_group)) {}

  std::unique_ptr<data::IteratorBase> MakeIteratorInternal(
      const std::string& prefix) const override {
    // The parent's prefix: checkpoint keys are those of the pipeline without
    // the wrapper, so checkpoints restore with InTune on or off.
    return std::make_unique<Iterator>(Iterator::Params{this, prefix});
  }

  std::string DebugString() const override {
    return "IntuneUntrackedDatasetOp::Dataset";
  }

 protected:
  Status AsGraphDefInternal(data::SerializationContext* ctx,
                            DatasetGraphDefBuilder* b,
                            Node** output) const override {
    Node* input_node = nullptr;
    TF_RETURN_IF_ERROR(b->AddInputDataset(ctx, input_, &input_node));
    AttrValue group;
    b->BuildAttrValue(buffer_group_, &group);
    return b->AddDataset(this, {input_node},
                         {{kBufferGroupAttr, group}}, output);
  }

 private:
  class Iterator : public data::DatasetIterator<Dataset> {
   public:
    explicit Iterator(const Params& params)
        : DatasetIterator<Dataset>(params) {}

    ~Iterator() override {
      if (buffers_ != nullptr) buffers_->RemoveInput(input_);
    }

    bool SymbolicCheckpointCompatible() const override { return true; }

    Status Initialize(data::IteratorContext* ctx) override {
      if (!dataset()->buffer_group_.empty() && ctx->model() != nullptr) {
        buffers_ = FindBoundedBuffers(ctx->model().get(),
                                      dataset()->buffer_group_);
        if (buffers_ != nullptr) input_ = buffers_->AddInput();
      }
      data::IteratorContext input_ctx(WithoutModel(ctx));
      Status s = dataset()->input_->MakeIterator(&input_ctx, this, prefix(),
                                                 &input_impl_);
      ctx->MergeCheckpoint(input_ctx.checkpoint());
      return s;
    }

    Status GetNextInternal(data::IteratorContext* ctx,
                           std::vector<Tensor>* out_tensors,
                           bool* end_of_sequence) override {
      if (buffers_ != nullptr) {
        CancellationManager* cancellation = ctx->cancellation_manager();
        buffers_->WaitForRoom(input_, [cancellation]() {
          return cancellation != nullptr && cancellation->IsCancelled();
        });
      }
      data::IteratorContext input_ctx(WithoutModel(ctx));
      Status s = input_impl_->GetNext(&input_ctx, out_tensors, end_of_sequence);
      ctx->MergeCheckpoint(input_ctx.checkpoint());
      if (buffers_ != nullptr) {
        if (s.ok() && !*end_of_sequence) {
          buffers_->Produced(input_, *out_tensors);
        } else {
          buffers_->ReadNothing(input_);
        }
      }
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
    std::shared_ptr<BoundedBuffers> buffers_;
    int64_t input_ = 0;
  };

  const std::string buffer_group_;
};

void IntuneUntrackedDatasetOp::MakeDataset(OpKernelContext* ctx,
                                           data::DatasetBase* input,
                                           data::DatasetBase** output) {
  *output = new Dataset(ctx, input, buffer_group_);
}

REGISTER_KERNEL_BUILDER(Name("IntuneUntrackedDataset").Device(DEVICE_CPU),
                        IntuneUntrackedDatasetOp);

}  // namespace
}  // namespace intune
}  // namespace tensorflow
