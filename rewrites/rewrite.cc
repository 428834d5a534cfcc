// RunPasses, MakeRewriterConfig and ScopedReport (rewrite.h).
#include "rewrites/rewrite.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <unordered_set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "intune_tf/cc/graph_walk.h"
#include "rewrites/graph_utils.h"
#include "rewrites/optimizer.h"
#include "rewrites/passes.h"
#include "tensorflow/core/data/dataset_utils.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace rewrites {
namespace {

thread_local Report* current_report = nullptr;

using Fixed = std::map<std::string, int64_t>;
// A pass over `graph`; sets *structure_changed and adds to *fixed.
using Pass = std::function<Status(GraphDef* graph, bool* structure_changed,
                                  Fixed* fixed)>;

// Runs `pass` on a copy of `graph`, which replaces the graph only if the
// pass succeeds.
void RunPass(const char* name, const Pass& pass, GraphDef* graph,
             Report* report) {
  GraphDef copy = *graph;
  bool structure_changed = false;
  Fixed fixed;
  const Status status = pass(&copy, &structure_changed, &fixed);
  if (!status.ok()) {
    report->skipped.push_back(absl::StrCat(name, ": ", status.message()));
    return;
  }
  graph->Swap(&copy);
  report->structure_changed |= structure_changed;
  report->fixed.insert(fixed.begin(), fixed.end());
}

Status CheckUsable(const GraphDef& graph) {
  std::unordered_set<std::string> names;
  for (const NodeDef& node : graph.node()) {
    if (!names.insert(node.name()).second) {
      return errors::InvalidArgument("two nodes are named ", node.name());
    }
  }
  return OkStatus();
}

}  // namespace

Status RunPasses(const Options& options, GraphDef* graph, Report* report,
                 const TfOptimizer& tf_optimizer) {
  if (graph == nullptr || report == nullptr) {
    return errors::InvalidArgument("RunPasses needs a graph and a report");
  }
  *report = Report();
  TF_RETURN_IF_ERROR(CheckUsable(*graph));
  report->fingerprint = GraphFingerprint(*graph);
  report->global_shuffle = HoldsOp(*graph, kGlobalShuffleOp);
  RunPass(
      "strip_roots",
      [](GraphDef* g, bool*, Fixed*) { return StripRoots(g); },
      graph, report);
  if (!options.tune) return OkStatus();
  if (!options.tf_optimizations.empty() && tf_optimizer != nullptr) {
    RunPass(
        "tf_optimizations",
        // TF's inject_prefetch adds a prefetch, as it does without InTune.
        [&tf_optimizer](GraphDef* g, bool*, Fixed*) { return tf_optimizer(g); },
        graph, report);
  }
  RunPass(
      "make_tunable",
      [&options](GraphDef* g, bool*, Fixed* fixed) {
        return MakeTunable(options.include_fixed, g, fixed);
      },
      graph, report);
  if (options.cache) {
    CachePoint point;
    RunPass(
        "insert_cache",
        // Not a change of structure: the cache's iterator keeps its
        // parent's prefix, and its input's keys are those without it.
        [report, &point](GraphDef* g, bool*, Fixed*) {
          bool inserted = false;
          const Status status = InsertCache(g, &point, &inserted);
          report->cache = point.decision;
          return status;
        },
        graph, report);
    if (report->cache.placed()) {
      RunPass(
          "insert_row_store",
          // A change of structure: the shuffle's elements carry positions.
          [report, &point](GraphDef* g, bool* changed, Fixed*) {
            std::string told;
            TF_RETURN_IF_ERROR(
                InsertRowStore(g, point, point.cache_node, &told));
            if (absl::StartsWith(told, "a row store")) *changed = true;
            if (!told.empty()) {
              absl::StrAppend(&report->cache.reason, "; ", told);
            }
            return OkStatus();
          },
          graph, report);
    }
  }
  if (options.insert_prefetch) {
    RunPass(
        "insert_prefetch",
        [](GraphDef* g, bool* changed, Fixed*) {
          return InsertPrefetch(g, changed);
        },
        graph, report);
  }
  if (!options.inner_stats) {
    RunPass(
        "untrack_inner",
        // Not a change of structure: the wrapper is transparent to
        // iterator checkpoints.
        [](GraphDef* g, bool*, Fixed*) {
          bool wrapped = false;
          return UntrackInner(g, &wrapped);
        },
        graph, report);
  }
  if (options.interleave_buffer > 0) {
    RunPass(
        "raise_interleave_buffers",
        [&options](GraphDef* g, bool*, Fixed*) {
          return RaiseInterleaveBuffers(options.interleave_buffer, g);
        },
        graph, report);
  }
  RunPass(
      "disable_tf_autotune",
      [](GraphDef* g, bool*, Fixed*) { return DisableTfAutotune(g); }, graph,
      report);
  return OkStatus();
}

void SelectTfOptimizations(const data::Options& input_options,
                           Options* options) {
  options->tf_optimizations.clear();
  options->tf_optimization_configs.clear();
  if (!data::ShouldUseAutotuning(input_options)) return;
  absl::flat_hash_set<tstring> enabled, disabled, by_default;
  data::GetOptimizations(input_options, &enabled, &disabled, &by_default);
  // As FinalizeDataset: it assumes a ModelDataset, which InTune replaces.
  disabled.insert("enable_gradient_descent");
  const absl::flat_hash_set<tstring> configs =
      data::CreateGraphRewriteConfigs(input_options);
  for (const tstring& tconfig : configs) {
    const std::string config(tconfig);
    const std::string name = config.substr(0, config.find(':'));
    const bool asked = enabled.contains(name) || by_default.contains(name);
    if (!asked || disabled.contains(name) ||
        !absl::EndsWith(config, ":autotune:true")) {
      continue;
    }
    options->tf_optimizations.push_back(name);
    options->tf_optimization_configs.push_back(config);
  }
  // Sets iterate in no fixed order; the meta optimizer runs its list in
  // order, so sort for one graph per pipeline.
  std::sort(options->tf_optimizations.begin(), options->tf_optimizations.end());
  std::sort(options->tf_optimization_configs.begin(),
            options->tf_optimization_configs.end());
}

RewriterConfig MakeRewriterConfig(const Options& options) {
  RewriterConfig config;
  config.add_optimizers(kOptimizerName);
  config.set_meta_optimizer_iterations(RewriterConfig::ONE);
  config.set_fail_on_optimizer_errors(false);
  config.set_min_graph_nodes(-1);
  RewriterConfig::CustomGraphOptimizer* custom = config.add_custom_optimizers();
  custom->set_name(kOptimizerName);
  OptionsToParameters(options, custom->mutable_parameter_map());
  return config;
}

ScopedReport::ScopedReport(Report* report) : previous_(current_report) {
  current_report = report;
}

ScopedReport::~ScopedReport() { current_report = previous_; }

void PublishReport(Report report) {
  if (current_report != nullptr) *current_report = std::move(report);
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
