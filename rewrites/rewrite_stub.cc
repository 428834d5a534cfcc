#include "rewrites/rewrite.h"
#include "tensorflow/core/grappler/grappler_item.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h"
namespace tensorflow {
namespace intune {
namespace rewrites {
namespace {
thread_local Report* current = nullptr;
class Optimizer : public grappler::CustomGraphOptimizer {
 public:
  std::string name() const override { return kOptimizerName; }
  bool UsesFunctionLibrary() const override { return false; }
  Status Init(const RewriterConfig_CustomGraphOptimizer* config) override { return OkStatus(); }
  Status Optimize(grappler::Cluster*, const grappler::GrapplerItem& item, GraphDef* out) override {
    *out = item.graph;
    Report scratch;
    return RunPasses(Options(), out, current ? current : &scratch);
  }
};
REGISTER_GRAPH_OPTIMIZER_AS(Optimizer, kOptimizerName);
}  // namespace
ScopedReport::ScopedReport(Report* r) { current = r; }
ScopedReport::~ScopedReport() { current = nullptr; }
Status RunPasses(const Options&, GraphDef* graph, Report* report) {
  std::map<std::string, std::string> strip;
  for (const auto& n : graph->node())
    if (n.op() == "IntuneOptionsDataset" || n.op() == kRootOp) strip[n.name()] = n.input(0);
  for (auto& n : *graph->mutable_node())
    for (auto& in : *n.mutable_input()) {
      std::string name = in.substr(0, in.find(':'));
      while (strip.count(name)) { in = strip[name]; name = in.substr(0, in.find(':')); }
    }
  if (!strip.empty()) { report->structure_changed = true; report->changes.push_back("declarations removed"); }
  report->fingerprint = "stub";
  return OkStatus();
}
RewriterConfig MakeRewriterConfig(const Options&) {
  RewriterConfig c;
  c.add_optimizers(kOptimizerName);
  c.set_meta_optimizer_iterations(RewriterConfig::ONE);
  c.set_fail_on_optimizer_errors(true);
  c.add_custom_optimizers()->set_name(kOptimizerName);
  return c;
}
}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
