// Pass strip_roots: IntuneRootDataset (under either name) and
// IntuneOptionsDataset nodes out of the graph.
#include <string>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "rewrites/graph_utils.h"
#include "rewrites/passes.h"
#include "rewrites/rewrite.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

namespace {

bool IsRootOrOptions(const NodeDef& node) {
  return node.op() == kRootOp || node.op() == kLegacyRootOp ||
         node.op() == kIntuneOptionsOp;
}

}  // namespace

Status StripRoots(GraphDef* graph) {
  std::unordered_map<std::string, const NodeDef*> roots;
  for (const NodeDef& node : graph->node()) {
    if (IsRootOrOptions(node)) roots[node.name()] = &node;
  }
  if (roots.empty()) return OkStatus();

  // What each root's consumers read instead: its input 0, through nested
  // roots.
  std::unordered_map<std::string, std::string> source;
  for (const auto& [name, root] : roots) {
    const NodeDef* node = root;
    for (size_t hops = 0;; ++hops) {
      if (hops == roots.size()) {
        return errors::InvalidArgument("a cycle of ", kRootOp,
                                       " nodes through ", name);
      }
      if (node->input_size() == 0 || IsControlInput(node->input(0))) {
        return errors::InvalidArgument(kRootOp, " node ", node->name(),
                                       " has no input dataset");
      }
      const auto inner = roots.find(InputName(node->input(0)));
      if (inner == roots.end()) break;
      node = inner->second;
    }
    source[name] = node->input(0);
  }

  for (NodeDef& node : *graph->mutable_node()) {
    if (roots.count(node.name()) > 0) continue;
    for (std::string& input : *node.mutable_input()) {
      const auto it = source.find(InputName(input));
      if (it == source.end()) continue;
      input = IsControlInput(input) ? absl::StrCat("^", InputName(it->second))
                                    : it->second;
    }
  }

  auto& nodes = *graph->mutable_node();
  int kept = 0;
  for (int i = 0; i < nodes.size(); ++i) {
    if (IsRootOrOptions(nodes.Get(i))) continue;
    if (i != kept) nodes.SwapElements(i, kept);
    ++kept;
  }
  nodes.DeleteSubrange(kept, nodes.size() - kept);
  return OkStatus();
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
