// STUB (lead's local copy until the passes branch lands)
#ifndef REWRITES_REWRITE_H_
#define REWRITES_REWRITE_H_
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
struct Options {
  bool include_fixed = false;
  bool insert_prefetch = true;
  bool untrack_inner = true;
  int64_t interleave_buffer = 0;
};
struct Report {
  std::map<std::string, int64_t> fixed;
  std::vector<std::string> skipped;
  bool structure_changed = false;
  std::vector<std::string> changes;
  std::string fingerprint;
};
Status RunPasses(const Options& options, GraphDef* graph, Report* report);
RewriterConfig MakeRewriterConfig(const Options& options);
class ScopedReport { public: explicit ScopedReport(Report* report); ~ScopedReport(); };
}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
#endif
