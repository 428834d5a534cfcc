// The Grappler custom optimizer kOptimizerName: RunPasses inside
// data::RewriteDataset.
#include "rewrites/optimizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/grappler/grappler_item.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

void OptionsToParameters(const Options& options, ParameterMap* parameters) {
  (*parameters)[kIncludeFixed].set_b(options.include_fixed);
  (*parameters)[kInsertPrefetch].set_b(options.insert_prefetch);
  (*parameters)[kUntrackInner].set_b(options.untrack_inner);
  (*parameters)[kInterleaveBuffer].set_i(options.interleave_buffer);
}

Status OptionsFromParameters(const ParameterMap& parameters, Options* options) {
  for (const auto& [name, value] : parameters) {
    const bool is_bool = value.value_case() == AttrValue::kB;
    if (name == kIncludeFixed && is_bool) {
      options->include_fixed = value.b();
    } else if (name == kInsertPrefetch && is_bool) {
      options->insert_prefetch = value.b();
    } else if (name == kUntrackInner && is_bool) {
      options->untrack_inner = value.b();
    } else if (name == kInterleaveBuffer &&
               value.value_case() == AttrValue::kI) {
      options->interleave_buffer = value.i();
    } else {
      return errors::InvalidArgument(kOptimizerName, ": unknown parameter ",
                                     name, " or wrong type: ",
                                     value.ShortDebugString());
    }
  }
  return OkStatus();
}

namespace {

class IntuneRewritesOptimizer : public grappler::CustomGraphOptimizer {
 public:
  std::string name() const override { return kOptimizerName; }

  // untrack_inner edits the library's functions, and the fingerprint counts
  // their ops: without this Grappler hands the optimizer a stub library.
  bool UsesFunctionLibrary() const override { return true; }

  Status Init(const RewriterConfig_CustomGraphOptimizer* config) override {
    if (config == nullptr) return OkStatus();
    return OptionsFromParameters(config->parameter_map(), &options_);
  }

  Status Optimize(grappler::Cluster* cluster,
                  const grappler::GrapplerItem& item,
                  GraphDef* optimized_graph) override {
    *optimized_graph = item.graph;
    Report report;
    const Status status = RunPasses(options_, optimized_graph, &report);
    if (!status.ok()) {
      report.skipped.push_back(absl::StrCat("all passes: ", status.message()));
    }
    PublishReport(std::move(report));
    return status;
  }

 private:
  Options options_;
};

}  // namespace

REGISTER_GRAPH_OPTIMIZER_AS(IntuneRewritesOptimizer, kOptimizerName);

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
