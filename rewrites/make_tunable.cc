// Pass make_tunable: pipeline stages become knobs.
#include <optional>
#include <string>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "rewrites/graph_utils.h"
#include "rewrites/passes.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

Status MakeTunable(bool include_fixed, GraphDef* graph,
                   std::map<std::string, int64_t>* fixed) {
  const auto by_name = NodesByName(graph);
  NodeNames names(*graph);
  // An interleave whose buffers the guard bounds (raise_interleave_buffers,
  // read by a release op) keeps its cycle_length workers.
  std::unordered_set<std::string> bounded;
  for (const NodeDef& node : graph->node()) {
    if (node.op() == kBufferReleaseOp && node.input_size() > 0) {
      bounded.insert(InputName(node.input(0)));
    }
  }
  const int size = graph->node_size();
  for (int i = 0; i < size; ++i) {
    NodeDef* node = graph->mutable_node(i);
    const std::optional<int> index = KnobInputIndex(*node);
    if (!index.has_value() || bounded.count(node->name()) > 0) continue;
    const auto input = by_name.find(InputName(node->input(*index)));
    if (input == by_name.end()) continue;
    const std::optional<int64_t> value = ConstInt(*input->second);
    if (!value.has_value()) continue;
    if (*value != kAutotune) {
      if (!include_fixed || *value <= 0) continue;
      const NodeDef* autotune = AddConst(
          names.Unique(absl::StrCat(node->name(), "/intune_autotune")),
          kAutotune, graph);
      node->set_input(*index, autotune->name());
      (*fixed)[node->name()] = *value;
    }
    if (node->op() == kPrefetchOp) MakeBufferKnob(node);
  }
  return OkStatus();
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
