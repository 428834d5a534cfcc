// IntuneRootDataset: the root of a tuned pipeline.
//
// Made when the pipeline's iterator is made. It rewrites its input in place
// of the graph with TF's own rewrite path (`data::RewriteDataset`: resources
// and large tensors are passed by reference, so the user's variables, tables
// and generators are the ones the tuned pipeline uses), then its iterator
// creates and owns a `model::Model` and hands it to its input through the
// iterator context, so that every AUTOTUNE knob below registers in that model
// instead of TF's own autotuner (which the dataset's options turn off). The
// model is published as a `TuningSession` for the control ops.
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "intune_tf/cc/kernels/session_registry.h"
#include "intune_tf/cc/kernels/settings.h"
#include "intune_tf/cc/kernels/tf_compat.h"
#include "intune_tf/cc/op_names.h"
#include "intune_tf/cc/tf_cc_symbols.h"
#include "rewrites/rewrite.h"
#include "tensorflow/core/data/rewrite_utils.h"
#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/dataset_options.pb.h"
#include "tensorflow/core/framework/model.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tensorflow {
namespace intune {
namespace {

inline constexpr char kFindSettings[] = "find_settings";

// Models owned by live InTune iterators: a root whose context already holds
// one is nested under another root and leaves the tuning to it.
class OwnedModels {
 public:
  static OwnedModels* Global() {
    static OwnedModels* models = new OwnedModels;
    return models;
  }
  void Add(const model::Model* m) TF_LOCKS_EXCLUDED(mu_) {
    mutex_lock l(mu_);
    models_.insert(m);
  }
  void Remove(const model::Model* m) TF_LOCKS_EXCLUDED(mu_) {
    mutex_lock l(mu_);
    models_.erase(m);
  }
  bool Contains(const model::Model* m) const TF_LOCKS_EXCLUDED(mu_) {
    mutex_lock l(mu_);
    return models_.contains(m);
  }

 private:
  mutable mutex mu_;
  absl::flat_hash_set<const model::Model*> models_ TF_GUARDED_BY(mu_);
};

// Logs each distinct message once per process.
void WarnOnce(const std::string& message) {
  static mutex* mu = new mutex;
  static auto* seen = new absl::flat_hash_set<std::string>;
  mutex_lock l(*mu);
  if (seen->insert(message).second) LOG(WARNING) << message;
}

// The session tag: the options JSON with the warm-start fingerprint added.
std::string SessionTag(const std::string& options_json,
                       const std::string& fingerprint) {
  if (fingerprint.empty() || options_json.size() < 2 ||
      options_json.back() != '}') {
    return options_json;
  }
  std::string tag = options_json.substr(0, options_json.size() - 1);
  if (tag.find_first_not_of(" {") != std::string::npos) tag += ", ";
  return absl::StrCat(tag, "\"fingerprint\": \"", fingerprint, "\"}");
}

class RootDatasetOp : public data::UnaryDatasetOpKernel {
 public:
  explicit RootDatasetOp(OpKernelConstruction* ctx)
      : UnaryDatasetOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, Settings::FromAttrs(ctx, &settings_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kFindSettings, &find_settings_));
  }

 protected:
  void MakeDataset(OpKernelContext* ctx, data::DatasetBase* input,
                   data::DatasetBase** output) override;

 private:
  class Dataset;
  Settings settings_;
  bool find_settings_;
};

class RootDatasetOp::Dataset : public data::DatasetBase {
 public:
  // `input` is the user's pipeline (serialized by AsGraphDefInternal, so that
  // a rebuilt root rewrites it again); `rewritten` is what runs.
  Dataset(OpKernelContext* ctx, const DatasetBase* input,
          core::RefCountPtr<DatasetBase> rewritten, Settings settings,
          bool find_settings, rewrites::Report report)
      : DatasetBase(data::DatasetContext(ctx)),
        input_(input),
        rewritten_(std::move(rewritten)),
        settings_(std::move(settings)),
        find_settings_(find_settings),
        report_(std::move(report)),
        tag_(SessionTag(settings_.tag, report_.fingerprint)) {
    input_->Ref();
    // Merged over the input's options: TF's autotuner and the static passes
    // that add or resize buffers stay off under the root.
    data::Options options;
    options.mutable_autotune_options()->set_enabled(false);
    options.mutable_optimization_options()->set_inject_prefetch(false);
    set_options(options);
  }

  ~Dataset() override { input_->Unref(); }

  std::unique_ptr<data::IteratorBase> MakeIteratorInternal(
      const std::string& prefix) const override {
    // The prefix is the parent's: checkpoints of the pipeline below keep the
    // keys they have without InTune.
    return std::make_unique<Iterator>(Iterator::Params{this, prefix});
  }

  const DataTypeVector& output_dtypes() const override {
    return rewritten_->output_dtypes();
  }
  const std::vector<PartialTensorShape>& output_shapes() const override {
    return rewritten_->output_shapes();
  }
  std::string DebugString() const override { return "RootDatasetOp::Dataset"; }
  int64_t CardinalityInternal(data::CardinalityOptions options) const override {
    return rewritten_->Cardinality(options);
  }
  Status InputDatasets(
      std::vector<const DatasetBase*>* inputs) const override {
    inputs->push_back(rewritten_.get());
    return OkStatus();
  }
  Status CheckExternalState() const override {
    return rewritten_->CheckExternalState();
  }
  Status Get(OpKernelContext* ctx, int64_t index,
             std::vector<Tensor>* out_tensors) const override {
    return rewritten_->Get(ctx, index, out_tensors);
  }
#if INTUNE_TF_HAS_RANDOM_INDEXING
  Status Get(data::AnyContext ctx, int64_t index,
             std::vector<Tensor>* out_tensors) const override {
    return rewritten_->Get(ctx, index, out_tensors);
  }
  Status RandomIndexingCompatible() const override {
    return rewritten_->RandomIndexingCompatible();
  }
#endif

 protected:
  Status AsGraphDefInternal(data::SerializationContext* ctx,
                            DatasetGraphDefBuilder* b,
                            Node** output) const override {
    Node* input_node = nullptr;
    TF_RETURN_IF_ERROR(b->AddInputDataset(ctx, input_, &input_node));
    auto attrs = settings_.ToAttrs(b);
    AttrValue find;
    b->BuildAttrValue(find_settings_, &find);
    attrs.emplace_back(kFindSettings, find);
    return b->AddDataset(this, {input_node}, attrs, output);
  }

 private:
  class Iterator : public data::DatasetIterator<Dataset> {
   public:
    explicit Iterator(const Params& params)
        : DatasetIterator<Dataset>(params) {}

    ~Iterator() override {
      {
        mutex_lock l(guard_mu_);
        cancelled_ = true;
        guard_cv_.notify_all();
      }
      guard_thread_.reset();  // joins
      input_impl_.reset();
      if (session_ != nullptr) {
        SessionRegistry::Global()->Remove(session_->id());
        OwnedModels::Global()->Remove(model_.get());
      }
    }

    bool SymbolicCheckpointCompatible() const override { return true; }

    Status Initialize(data::IteratorContext* ctx) override {
      const Settings& s = dataset()->settings_;
      // Nested under another root (a pipeline inside a pipeline that is
      // tuned as a whole): the outer root's model already holds the knobs.
      if (ctx->model() == nullptr ||
          !OwnedModels::Global()->Contains(ctx->model().get())) {
        model_ = std::make_shared<model::Model>();
        if (s.max_cpus > 0) {
          thread_pool_ = std::make_unique<thread::ThreadPool>(
              Env::Default(), ThreadOptions(), "intune_runner",
              static_cast<int>(s.max_cpus),
              /*low_latency_hint=*/false);
        }
        OwnedModels::Global()->Add(model_.get());
        session_ = SessionRegistry::Global()->Create(dataset()->tag_,
                                                     s.ram_budget, model_);
        session_->DecideCache(dataset()->report_.cache);
      }
      data::IteratorContext input_ctx(CreateParams(ctx));
      Status status = dataset()->rewritten_->MakeIterator(
          &input_ctx, this, prefix(), &input_impl_);
      ctx->MergeCheckpoint(input_ctx.checkpoint());
      return status;
    }

    Status GetNextInternal(data::IteratorContext* ctx,
                           std::vector<Tensor>* out_tensors,
                           bool* end_of_sequence) override {
      if (session_ == nullptr) {
        return input_impl_->GetNext(ctx, out_tensors, end_of_sequence);
      }
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
      ctx->MergeCheckpoint(input_ctx.checkpoint());
      if (s.ok() && !*end_of_sequence) {
        session_->RecordGetNext(
            start, static_cast<int64_t>(Env::Default()->NowMicros()));
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
      Status s = RestoreInput(&input_ctx, reader, input_impl_);
      ctx->MergeCheckpoint(input_ctx.checkpoint());
      const rewrites::Report& report = dataset()->report_;
      if (s.ok() || !report.structure_changed) return s;
      return errors::FailedPrecondition(
          "InTune could not restore this iterator checkpoint: ", s.message(),
          " InTune's graph rewrites changed the pipeline's structure "
          "(prefetches inserted after parallel stages, or positions carried "
          "through a shuffle for the row store), so a checkpoint written with "
          "InTune off or with other IntuneOptions does not match it. Restore "
          "with the options the checkpoint was written with, or turn off the "
          "rewrite that changes the structure: "
          "IntuneOptions(insert_prefetch=False), or cache=False for the row "
          "store.");
    }

   private:
    data::IteratorContext::Params CreateParams(data::IteratorContext* ctx) {
      data::IteratorContext::Params params(ctx);
      if (model_ != nullptr) params.model = model_;
      if (dataset()->report_.global_shuffle) params.warm_start = false;
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
          guard_cv_.wait_for(l, std::chrono::microseconds(
                                    dataset()->settings_.guard_period_us));
          if (cancelled_) return;
        }
        session_->EnforceBudget(/*thorough=*/false);
      }
    }

    std::shared_ptr<model::Model> model_;
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
  const core::RefCountPtr<DatasetBase> rewritten_;
  const Settings settings_;
  const bool find_settings_;
  const rewrites::Report report_;
  const std::string tag_;
};

// Runs the rewrite passes `options` selects on `input`'s graph, collecting
// what they report.
Status Rewrite(OpKernelContext* ctx, data::DatasetBase* input,
               const rewrites::Options& options, rewrites::Report* report,
               core::RefCountPtr<data::DatasetBase>* output) {
  TF_ASSIGN_OR_RETURN(const RewriteDatasetFn rewrite_dataset,
                      FindRewriteDataset());
  rewrites::ScopedReport scoped(report);
  return rewrite_dataset(
      ctx, input, [&options]() { return rewrites::MakeRewriterConfig(options); },
      /*record_fingerprint=*/false, output);
}

// `input` without its declarations (IntuneOptionsDataset), for a pipeline
// whose option is off: left on top, a declaration is the last dataset that
// TF's inject_prefetch sees (it skips only TF's own wrappers, such as
// OptionsDataset), so it would add a prefetch above the user's last one.
// `input` itself if the rewrite fails.
void StripDeclarations(OpKernelContext* ctx, data::DatasetBase* input,
                       data::DatasetBase** output) {
  rewrites::Options options;
  options.tune = false;
  rewrites::Report report;
  core::RefCountPtr<data::DatasetBase> stripped;
  const Status status = Rewrite(ctx, input, options, &report, &stripped);
  if (!status.ok()) {
    WarnOnce(absl::StrCat("InTune could not remove its option from this "
                          "pipeline (",
                          status.message(), "); it runs with it."));
    input->Ref();
    *output = input;
    return;
  }
  *output = stripped.release();
}

void RootDatasetOp::MakeDataset(OpKernelContext* ctx,
                                data::DatasetBase* input,
                                data::DatasetBase** output) {
  const Settings* settings = &settings_;
  if (find_settings_) settings = FindSettings(input);
  if (settings == nullptr) {
    // Nothing below declares the option: the pipeline runs as it is.
    input->Ref();
    *output = input;
    return;
  }
  if (!settings->enabled) {
    StripDeclarations(ctx, input, output);
    return;
  }
  rewrites::Options options;
  options.include_fixed = settings->include_fixed;
  options.insert_prefetch = settings->insert_prefetch;
  // Symbolic checkpoints of interleaves restore through their inner
  // iterators; those run as TF builds them (restoring through an untracked
  // wrapper was seen to hang).
  options.inner_stats =
      settings->inner_stats || input->options().symbolic_checkpoint();
  options.interleave_buffer = settings->interleave_buffer;
  // A symbolic checkpoint is merged from every iterator's GetNext; the
  // cache's position is not one of them.
  options.cache = settings->cache && !input->options().symbolic_checkpoint();
  rewrites::SelectTfOptimizations(input->options(), &options);
  rewrites::Report report;
  core::RefCountPtr<data::DatasetBase> rewritten;
  const Status status = Rewrite(ctx, input, options, &report, &rewritten);
  if (!status.ok()) {
    WarnOnce(absl::StrCat(
        "InTune could not rewrite this pipeline (", status.message(),
        "); it is tuned as it is: only its AUTOTUNE stages are knobs."));
    input->Ref();
    rewritten.reset(input);
    report = rewrites::Report();
  }
  for (const std::string& skipped : report.skipped) {
    WarnOnce(absl::StrCat("InTune rewrite skipped: ", skipped));
  }
  *output = new Dataset(ctx, input, std::move(rewritten), *settings,
                        find_settings_, std::move(report));
}

REGISTER_KERNEL_BUILDER(Name(kRootOp).Device(DEVICE_CPU),
                        RootDatasetOp);
REGISTER_KERNEL_BUILDER(Name(kLegacyRootOp).Device(DEVICE_CPU),
                        RootDatasetOp);

}  // namespace
}  // namespace intune
}  // namespace tensorflow
