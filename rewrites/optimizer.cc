// The Grappler custom optimizer kOptimizerName: RunPasses inside
// data::RewriteDataset.
#include "rewrites/optimizer.h"

#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "intune_tf/cc/tf_cc_symbols.h"
#include "tensorflow/core/data/rewrite_utils.h"
#include "tensorflow/core/grappler/grappler_item.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

void OptionsToParameters(const Options& options, ParameterMap* parameters) {
  (*parameters)[kTune].set_b(options.tune);
  (*parameters)[kIncludeFixed].set_b(options.include_fixed);
  (*parameters)[kInsertPrefetch].set_b(options.insert_prefetch);
  (*parameters)[kInnerStats].set_b(options.inner_stats);
  (*parameters)[kInterleaveBuffer].set_i(options.interleave_buffer);
  (*parameters)[kCache].set_b(options.cache);
  auto* names = (*parameters)[kTfOptimizations].mutable_list();
  for (const std::string& name : options.tf_optimizations) names->add_s(name);
  auto* configs = (*parameters)[kTfOptimizationConfigs].mutable_list();
  for (const std::string& config : options.tf_optimization_configs) {
    configs->add_s(config);
  }
}

Status OptionsFromParameters(const ParameterMap& parameters, Options* options) {
  for (const auto& [name, value] : parameters) {
    const bool is_bool = value.value_case() == AttrValue::kB;
    if (name == kTune && is_bool) {
      options->tune = value.b();
    } else if (name == kIncludeFixed && is_bool) {
      options->include_fixed = value.b();
    } else if (name == kInsertPrefetch && is_bool) {
      options->insert_prefetch = value.b();
    } else if (name == kInnerStats && is_bool) {
      options->inner_stats = value.b();
    } else if (name == kCache && is_bool) {
      options->cache = value.b();
    } else if (name == kInterleaveBuffer &&
               value.value_case() == AttrValue::kI) {
      options->interleave_buffer = value.i();
    } else if (name == kTfOptimizations &&
               value.value_case() == AttrValue::kList) {
      options->tf_optimizations.assign(value.list().s().begin(),
                                       value.list().s().end());
    } else if (name == kTfOptimizationConfigs &&
               value.value_case() == AttrValue::kList) {
      options->tf_optimization_configs.assign(value.list().s().begin(),
                                              value.list().s().end());
    } else {
      return errors::InvalidArgument(kOptimizerName, ": unknown parameter ",
                                     name, " or wrong type: ",
                                     value.ShortDebugString());
    }
  }
  return OkStatus();
}

namespace {

// TF's tf_data_meta_optimizer, configured as FinalizeDataset configures it,
// on `graph` (the item's graph at that point of the passes).
Status RunTfOptimizations(const Options& options,
                          const grappler::GrapplerItem& item,
                          grappler::Cluster* cluster, GraphDef* graph) {
  absl::flat_hash_set<tstring> names(options.tf_optimizations.begin(),
                                     options.tf_optimizations.end());
  absl::flat_hash_set<tstring> configs(options.tf_optimization_configs.begin(),
                                       options.tf_optimization_configs.end());
  TF_ASSIGN_OR_RETURN(const CreateRewriterConfigFn create_rewriter_config,
                      FindCreateRewriterConfig());
  const RewriterConfig config = create_rewriter_config(names, configs);
  if (config.custom_optimizers_size() != 1) {
    return errors::Internal("unexpected RewriterConfig for TF's optimizers");
  }
  std::unique_ptr<grappler::CustomGraphOptimizer> optimizer =
      grappler::CustomGraphOptimizerRegistry::CreateByNameOrNull(
          config.custom_optimizers(0).name());
  if (optimizer == nullptr) {
    return errors::NotFound("TF's optimizer ",
                            config.custom_optimizers(0).name(),
                            " is not registered");
  }
  TF_RETURN_IF_ERROR(optimizer->Init(&config.custom_optimizers(0)));
  grappler::GrapplerItem tf_item = item.WithGraph(GraphDef(*graph));
  GraphDef optimized;
  TF_RETURN_IF_ERROR(optimizer->Optimize(cluster, tf_item, &optimized));
  graph->Swap(&optimized);
  return OkStatus();
}

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
    const Status status = RunPasses(
        options_, optimized_graph, &report, [&](GraphDef* graph) {
          return RunTfOptimizations(options_, item, cluster, graph);
        });
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
