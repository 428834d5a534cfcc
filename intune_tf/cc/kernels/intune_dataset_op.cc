// IntuneDataset: the root of a tuned pipeline.
//
// Its iterator creates and owns a `model::Model` and hands it to its input
// through the iterator context, so that every AUTOTUNE knob below registers in
// that model instead of TF's own autotuner (which the dataset's options turn
// off). The model is published as a `TuningSession` for the control ops.
#include <memory>
#include <string>
#include <utility>

#include "intune_tf/cc/kernels/session_registry.h"
#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/dataset_options.pb.h"
#include "tensorflow/core/framework/model.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tensorflow {
namespace intune {
namespace {

inline constexpr char kDatasetType[] = "Intune";
inline constexpr char kTag[] = "tag";
inline constexpr char kRamBudget[] = "ram_budget";
inline constexpr char kMaxParallelism[] = "max_parallelism";
inline constexpr char kGuardPeriodUs[] = "guard_period_us";

class IntuneDatasetOp : public data::UnaryDatasetOpKernel {
 public:
  explicit IntuneDatasetOp(OpKernelConstruction* ctx)
      : UnaryDatasetOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kTag, &tag_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kRamBudget, &ram_budget_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kMaxParallelism, &max_parallelism_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kGuardPeriodUs, &guard_period_us_));
    OP_REQUIRES(ctx, ram_budget_ >= 0,
                errors::InvalidArgument("ram_budget must be >= 0 bytes (0 = "
                                        "no budget), got ",
                                        ram_budget_, "."));
    OP_REQUIRES(ctx, max_parallelism_ >= 0,
                errors::InvalidArgument("max_parallelism must be >= 0 (0 = "
                                        "the runner's thread pool size), got ",
                                        max_parallelism_, "."));
    OP_REQUIRES(ctx, guard_period_us_ > 0,
                errors::InvalidArgument("guard_period_us must be > 0, got ",
                                        guard_period_us_, "."));
  }

 protected:
  void MakeDataset(OpKernelContext* ctx, data::DatasetBase* input,
                   data::DatasetBase** output) override;

 private:
  class Dataset;
  std::string tag_;
  int64_t ram_budget_;
  int64_t max_parallelism_;
  int64_t guard_period_us_;
};

class IntuneDatasetOp::Dataset : public data::DatasetBase {
 public:
  Dataset(OpKernelContext* ctx, const DatasetBase* input, std::string tag,
          int64_t ram_budget, int64_t max_parallelism, int64_t guard_period_us)
      : DatasetBase(data::DatasetContext(ctx)),
        input_(input),
        tag_(std::move(tag)),
        ram_budget_(ram_budget),
        max_parallelism_(max_parallelism),
        guard_period_us_(guard_period_us) {
    input_->Ref();
    // These options take precedence over the inputs' when they are merged:
    // TF's autotuner and the static passes that resize buffers stay off.
    data::Options options;
    options.mutable_autotune_options()->set_enabled(false);
    options.mutable_optimization_options()->set_inject_prefetch(false);
    set_options(options);
  }

  ~Dataset() override { input_->Unref(); }

  std::unique_ptr<data::IteratorBase> MakeIteratorInternal(
      const std::string& prefix) const override {
    return std::make_unique<Iterator>(Iterator::Params{
        this, absl::StrCat(prefix, "::", kDatasetType)});
  }

  const DataTypeVector& output_dtypes() const override {
    return input_->output_dtypes();
  }
  const std::vector<PartialTensorShape>& output_shapes() const override {
    return input_->output_shapes();
  }
  std::string DebugString() const override { return "IntuneDatasetOp::Dataset"; }
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
    AttrValue tag, ram_budget, max_parallelism, guard_period_us;
    b->BuildAttrValue(tag_, &tag);
    b->BuildAttrValue(ram_budget_, &ram_budget);
    b->BuildAttrValue(max_parallelism_, &max_parallelism);
    b->BuildAttrValue(guard_period_us_, &guard_period_us);
    return b->AddDataset(this, {input_node},
                         {{kTag, tag},
                          {kRamBudget, ram_budget},
                          {kMaxParallelism, max_parallelism},
                          {kGuardPeriodUs, guard_period_us}},
                         output);
  }

 private:
  class Iterator : public data::DatasetIterator<Dataset> {
   public:
    explicit Iterator(const Params& params)
        : DatasetIterator<Dataset>(params),
          model_(std::make_shared<model::Model>()) {}

    ~Iterator() override {
      {
        mutex_lock l(guard_mu_);
        cancelled_ = true;
        guard_cv_.notify_all();
      }
      guard_thread_.reset();  // joins
      if (session_ != nullptr) SessionRegistry::Global()->Remove(session_->id());
    }

    Status Initialize(data::IteratorContext* ctx) override {
      if (dataset()->max_parallelism_ > 0) {
        thread_pool_ = std::make_unique<thread::ThreadPool>(
            Env::Default(), ThreadOptions(), "intune_runner",
            static_cast<int>(dataset()->max_parallelism_),
            /*low_latency_hint=*/false);
      }
      session_ = SessionRegistry::Global()->Create(
          dataset()->tag_, dataset()->ram_budget_, model_);
      data::IteratorContext input_ctx(CreateParams(ctx));
      return dataset()->input_->MakeIterator(&input_ctx, this, prefix(),
                                             &input_impl_);
    }

    Status GetNextInternal(data::IteratorContext* ctx,
                           std::vector<Tensor>* out_tensors,
                           bool* end_of_sequence) override {
      {
        mutex_lock l(guard_mu_);
        if (guard_thread_ == nullptr && !cancelled_) {
          guard_thread_ = ctx->StartThread("intune_budget_guard",
                                           [this]() { GuardLoop(); });
        }
      }
      const int64_t start = static_cast<int64_t>(Env::Default()->NowMicros());
      data::IteratorContext input_ctx(CreateParams(ctx));
      Status s = input_impl_->GetNext(&input_ctx, out_tensors, end_of_sequence);
      if (s.ok() && !*end_of_sequence) {
        session_->RecordGetNext(start,
                                static_cast<int64_t>(Env::Default()->NowMicros()));
      }
      return s;
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
      data::IteratorContext input_ctx(CreateParams(ctx));
      return RestoreInput(&input_ctx, reader, input_impl_);
    }

   private:
    data::IteratorContext::Params CreateParams(data::IteratorContext* ctx) {
      data::IteratorContext::Params params(ctx);
      params.model = model_;
      if (thread_pool_ != nullptr) {
        thread::ThreadPool* pool = thread_pool_.get();
        params.runner = [pool](std::function<void()> c) {
          pool->Schedule(std::move(c));
        };
        params.runner_threadpool_size = pool->NumThreads();
      }
      return params;
    }

    void GuardLoop() {
      while (true) {
        {
          mutex_lock l(guard_mu_);
          if (cancelled_) return;
          guard_cv_.wait_for(
              l, std::chrono::microseconds(dataset()->guard_period_us_));
          if (cancelled_) return;
        }
        session_->EnforceBudget(/*thorough=*/false);
      }
    }

    const std::shared_ptr<model::Model> model_;
    std::shared_ptr<TuningSession> session_;
    // Declared before input_impl_: the pool must outlive the input iterators
    // that schedule work on it, so it is destroyed after them.
    std::unique_ptr<thread::ThreadPool> thread_pool_;
    std::unique_ptr<data::IteratorBase> input_impl_;
    mutex guard_mu_;
    condition_variable guard_cv_;
    bool cancelled_ TF_GUARDED_BY(guard_mu_) = false;
    std::unique_ptr<Thread> guard_thread_ TF_GUARDED_BY(guard_mu_);
  };

  const DatasetBase* const input_;
  const std::string tag_;
  const int64_t ram_budget_;
  const int64_t max_parallelism_;
  const int64_t guard_period_us_;
};

void IntuneDatasetOp::MakeDataset(OpKernelContext* ctx,
                                  data::DatasetBase* input,
                                  data::DatasetBase** output) {
  *output = new Dataset(ctx, input, tag_, ram_budget_, max_parallelism_,
                        guard_period_us_);
}

REGISTER_KERNEL_BUILDER(Name("IntuneDataset").Device(DEVICE_CPU),
                        IntuneDatasetOp);

}  // namespace
}  // namespace intune
}  // namespace tensorflow
