// The walk over every node of a dataset GraphDef: its top level, then the
// body of each function of its library. The rewrites (rewrites/) and the
// cache's kernel (kernels/cache_dataset_op.cc) read graphs through it.
#ifndef INTUNE_TF_CC_GRAPH_WALK_H_
#define INTUNE_TF_CC_GRAPH_WALK_H_

#include <functional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"

namespace tensorflow {
namespace intune {

// A node of a graph and the function whose body holds it (null: the graph's
// top level).
using NodeVisitor =
    std::function<void(const NodeDef& node, const FunctionDef* function)>;
using NodeMatcher =
    std::function<bool(const NodeDef& node, const FunctionDef* function)>;

// Calls `visit` on each node of `graph`'s top level, in order, then on each
// node of each function of its library, in order.
void ForEachNode(const GraphDef& graph, const NodeVisitor& visit);

// Whether `match` holds for some node of `graph`, top level or function
// body, in the order of ForEachNode; stops at the first.
bool AnyNode(const GraphDef& graph, const NodeMatcher& match);

// Whether some node of `graph`, top level or function body, runs `op`.
bool HoldsOp(const GraphDef& graph, const std::string& op);

// The functions that `node`'s attributes name (an attribute holding a
// function, or a list of them: a dataset op's `f`, a call's callee). A node
// whose op is itself a library function is not counted: only the library
// knows that.
std::vector<std::string> AttrFunctions(const NodeDef& node);

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_GRAPH_WALK_H_
