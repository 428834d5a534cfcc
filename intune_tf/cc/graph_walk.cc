#include "intune_tf/cc/graph_walk.h"

#include "tensorflow/core/framework/attr_value.pb.h"

namespace tensorflow {
namespace intune {

void ForEachNode(const GraphDef& graph, const NodeVisitor& visit) {
  AnyNode(graph, [&visit](const NodeDef& node, const FunctionDef* function) {
    visit(node, function);
    return false;
  });
}

bool AnyNode(const GraphDef& graph, const NodeMatcher& match) {
  for (const NodeDef& node : graph.node()) {
    if (match(node, nullptr)) return true;
  }
  for (const FunctionDef& function : graph.library().function()) {
    for (const NodeDef& node : function.node_def()) {
      if (match(node, &function)) return true;
    }
  }
  return false;
}

bool HoldsOp(const GraphDef& graph, const std::string& op) {
  return AnyNode(graph, [&op](const NodeDef& node, const FunctionDef*) {
    return node.op() == op;
  });
}

std::vector<std::string> AttrFunctions(const NodeDef& node) {
  std::vector<std::string> names;
  for (const auto& [unused, attr] : node.attr()) {
    if (attr.has_func()) names.push_back(attr.func().name());
    for (const NameAttrList& f : attr.list().func()) names.push_back(f.name());
  }
  return names;
}

}  // namespace intune
}  // namespace tensorflow
