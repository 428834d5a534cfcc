// IntuneBufferReleaseDataset: a pass-through above a parallel interleave of
// records whose per-input buffers the guard bounds (bounded_buffers.h). It
// owns the interleave's BoundedBuffers and reports each record that leaves.
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

class IntuneBufferReleaseDatasetOp : public data::UnaryDatasetOpKernel {
 public:
  explicit IntuneBufferReleaseDatasetOp(OpKernelConstruction* ctx)
      : UnaryDatasetOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kBufferGroupAttr, &group_));
    OP_REQUIRES_OK(ctx,
                   ctx->GetAttr(kRecordsPerInputAttr, &records_));
    OP_REQUIRES(ctx, records_ > 0,
                errors::InvalidArgument(kRecordsPerInputAttr,
                                        " must be positive, got ", records_));
  }

 protected:
  void MakeDataset(OpKernelContext* ctx, data::DatasetBase* input,
                   data::DatasetBase** output) override;

 private:
  class Dataset;

  std::string group_;
  int64_t records_ = 0;
};

class IntuneBufferReleaseDatasetOp::Dataset : public PassThroughDataset {
 public:
  Dataset(OpKernelContext* ctx, const DatasetBase* input, std::string group,
          int64_t records)
      : PassThroughDataset(ctx, input),
        group_(std::move(group)),
        records_(records) {}

  std::unique_ptr<data::IteratorBase> MakeIteratorInternal(
      const std::string& prefix) const override {
    // The parent's prefix, as IntuneUntrackedDataset: checkpoints restore
    // with InTune on or off.
    return std::make_unique<Iterator>(Iterator::Params{this, prefix});
  }

  std::string DebugString() const override {
    return "IntuneBufferReleaseDatasetOp::Dataset";
  }

 protected:
  Status AsGraphDefInternal(data::SerializationContext* ctx,
                            DatasetGraphDefBuilder* b,
                            Node** output) const override {
    Node* input_node = nullptr;
    TF_RETURN_IF_ERROR(b->AddInputDataset(ctx, input_, &input_node));
    AttrValue group, records;
    b->BuildAttrValue(group_, &group);
    b->BuildAttrValue(records_, &records);
    return b->AddDataset(this, {input_node},
                         {{kBufferGroupAttr, group},
                          {kRecordsPerInputAttr, records}},
                         output);
  }

 private:
  class Iterator : public data::DatasetIterator<Dataset> {
   public:
    explicit Iterator(const Params& params)
        : DatasetIterator<Dataset>(params) {}

    bool SymbolicCheckpointCompatible() const override { return true; }

    Status Initialize(data::IteratorContext* ctx) override {
      // Made before the interleave, whose inputs find it.
      if (ctx->model() != nullptr) {
        buffers_ = GetBoundedBuffers(ctx->model().get(), dataset()->group_,
                                     dataset()->records_);
        buffers_->set_model(ctx->model());
      }
      TF_RETURN_IF_ERROR(
          dataset()->input_->MakeIterator(ctx, this, prefix(), &input_impl_));
      // The interleave's node: the one input of this iterator's own.
      const std::shared_ptr<model::Node> own = model_node();
      if (buffers_ != nullptr && own != nullptr && own->inputs().size() == 1) {
        buffers_->set_node(own->inputs().front());
      }
      return OkStatus();
    }

    Status GetNextInternal(data::IteratorContext* ctx,
                           std::vector<Tensor>* out_tensors,
                           bool* end_of_sequence) override {
      if (buffers_ == nullptr) {
        return input_impl_->GetNext(ctx, out_tensors, end_of_sequence);
      }
      buffers_->SetConsumerWaiting(true);
      Status s = input_impl_->GetNext(ctx, out_tensors, end_of_sequence);
      buffers_->SetConsumerWaiting(false);
      if (s.ok() && !*end_of_sequence) buffers_->Released(*out_tensors);
      return s;
    }

   protected:
    std::shared_ptr<model::Node> CreateNode(
        data::IteratorContext* ctx, model::Node::Args args) const override {
      // Left out of stage names (TuningSession::Walk).
      args.name = kBufferReleaseNode;
      return model::MakeKnownRatioNode(std::move(args), /*ratio=*/1);
    }

    Status SaveInternal(data::SerializationContext* ctx,
                        data::IteratorStateWriter* writer) override {
      if (buffers_ == nullptr) return SaveInput(ctx, writer, input_impl_);
      buffers_->SetSaving(true);
      Status s = SaveInput(ctx, writer, input_impl_);
      buffers_->SetSaving(false);
      return s;
    }

    Status RestoreInternal(data::IteratorContext* ctx,
                           data::IteratorStateReader* reader) override {
      return RestoreInput(ctx, reader, input_impl_);
    }

   private:
    std::unique_ptr<data::IteratorBase> input_impl_;
    std::shared_ptr<BoundedBuffers> buffers_;
  };

  const std::string group_;
  const int64_t records_;
};

void IntuneBufferReleaseDatasetOp::MakeDataset(OpKernelContext* ctx,
                                               data::DatasetBase* input,
                                               data::DatasetBase** output) {
  *output = new Dataset(ctx, input, group_, records_);
}

REGISTER_KERNEL_BUILDER(Name(kBufferReleaseOp).Device(DEVICE_CPU),
                        IntuneBufferReleaseDatasetOp);

}  // namespace
}  // namespace intune
}  // namespace tensorflow
