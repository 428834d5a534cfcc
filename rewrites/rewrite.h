// The InTune graph rewrites: passes over a dataset GraphDef that prepare a
// pipeline for tuning. IntuneDataset runs them on its input through
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
#include <map>
#include <string>
#include <vector>

#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/platform/status.h"
#include "tensorflow/core/protobuf/rewriter_config.pb.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

inline constexpr char kOptimizerName[] = "intune_rewrites";
inline constexpr char kRootOp[] = "IntuneDataset";
// The option, carried in the graph (intune_tf/cc/kernels/options_dataset_op.cc).
inline constexpr char kIntuneOptionsOp[] = "IntuneOptionsDataset";

struct Options {
  bool include_fixed = false;
  bool insert_prefetch = true;
  bool untrack_inner = true;
  int64_t interleave_buffer = 0;  // 0: keep TF's
};

struct Report {
  // Node name -> the user's fixed value made tunable.
  std::map<std::string, int64_t> fixed;
  // One line per pass that could not apply, and why: "<pass>: <error>".
  std::vector<std::string> skipped;
  // Datasets added whose iterators change the keys of iterator checkpoints
  // (prefetches inserted). Roots, options and untracked wrappers are
  // transparent to checkpoints and do not count.
  bool structure_changed = false;
  // Warm-start fingerprint of the graph BEFORE the passes (GraphFingerprint
  // in passes.h).
  std::string fingerprint;
};

// All passes, in order: strip_roots, make_tunable, insert_prefetch (if
// asked), untrack_inner (if asked), raise_interleave_buffers (if > 0),
// disable_tf_autotune. A pass that fails (bad graph) is skipped and recorded
// in report->skipped, and the graph is kept as it was before that pass; the
// others still run. Returns OK unless the graph is unusable (null, or two
// nodes with one name), in which case nothing is changed.
Status RunPasses(const Options& options, GraphDef* graph, Report* report);

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
