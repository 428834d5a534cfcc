// The InTune graph rewrites: passes over a dataset GraphDef that prepare a
// pipeline for tuning. IntuneRootDataset runs them on its input through
// data::RewriteDataset, as the Grappler custom optimizer kOptimizerName:
//
//   Report report;
//   {
//     ScopedReport scoped(&report);
//     TF_RETURN_IF_ERROR(data::RewriteDataset(
//         ctx, input, [options] { return MakeRewriterConfig(options); },
//         /*record_fingerprint=*/false, &rewritten));
//   }
#ifndef INTUNE_TF_REWRITES_REWRITE_H_
#define INTUNE_TF_REWRITES_REWRITE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "intune_tf/cc/cache_decision.h"
#include "intune_tf/cc/op_names.h"
#include "intune_tf/cc/settings_fields.h"
#include "tensorflow/core/framework/dataset_options.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/platform/status.h"
#include "tensorflow/core/protobuf/rewriter_config.pb.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

inline constexpr char kOptimizerName[] = "intune_rewrites";
// The root's op names (kRootOp, kLegacyRootOp) and the option's
// (kIntuneOptionsOp) are in intune_tf/cc/op_names.h.

struct Options {
  // False where the option is off: only strip_roots runs, so that the
  // pipeline is the user's exactly (a declaration left on top would hide
  // the user's last prefetch from TF's inject_prefetch).
  bool tune = true;
  // The option's defaults, from the settings list (settings_fields.h).
  bool include_fixed = SettingValues().include_fixed;
  bool insert_prefetch = SettingValues().insert_prefetch;
  bool inner_stats = SettingValues().inner_stats;  // false: untrack_inner
  int64_t interleave_buffer = SettingValues().interleave_buffer;  // 0: TF's
  bool cache = SettingValues().cache;  // insert_cache
  // TF's own static optimizations that apply only with autotune on, and
  // their configs ("<optimizer>:autotune:true"), as TFOptimizationsFor
  // selects them; run by TF's tf_data_meta_optimizer right after
  // strip_roots. Empty: none.
  std::vector<std::string> tf_optimizations;
  std::vector<std::string> tf_optimization_configs;
};

struct Report {
  // Node name -> the user's fixed value made tunable.
  std::map<std::string, int64_t> fixed;
  // One line per pass that could not apply, and why: "<pass>: <error>".
  std::vector<std::string> skipped;
  // Datasets added whose iterators change the keys of iterator checkpoints
  // (prefetches inserted, positions carried for a row store). Roots, options and untracked wrappers are
  // transparent to checkpoints and do not count.
  bool structure_changed = false;
  // Warm-start fingerprint of the graph BEFORE the passes (GraphFingerprint
  // in passes.h).
  std::string fingerprint;
  // The graph (or a function in it) holds a GlobalShuffleDataset. TF's warm
  // start (Options.experimental_warm_start) starts prefetch and parallel-map
  // threads in Initialize, with a context that lacks the shuffle's index
  // mapper, so they read in order (TF's TODO b/325112575); the root then
  // makes its input iterators without warm start.
  bool global_shuffle = false;
  // Where insert_cache put InTune's cache and why there, or why nowhere
  // (FindCachePoint in passes.h); off when the pass did not run.
  CacheDecision cache;
};

// Runs TF's data optimizations named in Options::tf_optimizations on a graph.
using TfOptimizer = std::function<Status(GraphDef* graph)>;

// All passes, in order: strip_roots, TF's optimizations (if any, through
// `tf_optimizer`), make_tunable, insert_cache and insert_row_store (if
// asked), insert_prefetch (if
// asked), untrack_inner (unless inner_stats), raise_interleave_buffers (if > 0),
// disable_tf_autotune; only strip_roots unless `options.tune`. A pass that fails (bad graph) is skipped and recorded
// in report->skipped, and the graph is kept as it was before that pass; the
// others still run. Returns OK unless the graph is unusable (null, or two
// nodes with one name), in which case nothing is changed.
Status RunPasses(const Options& options, GraphDef* graph, Report* report,
                 const TfOptimizer& tf_optimizer = nullptr);

// TF's FinalizeDataset applies its static optimizations with the options of
// the dataset it finalizes, and IntuneRootDataset's options turn TF's autotuner
// off: the optimizations that run only with autotune on (inject_prefetch,
// map_parallelization and those a user enables, e.g. filter_parallelization)
// do nothing there. Fills options->tf_optimizations (and their configs) with
// those that TF would have run on a pipeline with `input_options`, so that
// under InTune the pipeline has the structure it has on plain TF (same
// iterator checkpoint keys, same parallel stages).
void SelectTfOptimizations(const data::Options& input_options,
                           Options* options);

// A RewriterConfig for data::RewriteDataset that runs RunPasses (as the
// Grappler custom optimizer kOptimizerName registered by this library,
// options in its parameter_map) and nothing else, ONE iteration,
// fail_on_optimizer_errors false, on graphs of any size (min_graph_nodes -1:
// Grappler's default skips graphs of fewer than 4 nodes).
RewriterConfig MakeRewriterConfig(const Options& options);

// While alive, the optimizer running on this thread writes its Report into
// *report (a thread_local). Grappler runs custom optimizers on the calling
// thread inside RewriteDataset: RewriteDataset -> ApplyRewrites ->
// RunMetaOptimizer -> MetaOptimizer::OptimizeConsumeItem -> OptimizeGraph ->
// RunOptimizer -> Optimize are plain calls (tensorflow/core/data/
// rewrite_utils.cc, grappler/optimizers/meta_optimizer.cc); checked on TF
// 2.16 and 2.21 with a kernel that calls RewriteDataset under a
// ScopedReport. Scopes nest: the innermost one receives the report.
class ScopedReport {
 public:
  explicit ScopedReport(Report* report);
  ~ScopedReport();
  ScopedReport(const ScopedReport&) = delete;
  ScopedReport& operator=(const ScopedReport&) = delete;

 private:
  Report* const previous_;
};

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_REWRITES_REWRITE_H_
