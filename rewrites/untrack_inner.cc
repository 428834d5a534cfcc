// Pass untrack_inner: the per-element datasets of interleaves run without
// the model.
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "intune_tf/cc/graph_walk.h"
#include "rewrites/graph_utils.h"
#include "rewrites/passes.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace rewrites {
namespace {

using Library = std::unordered_map<std::string, FunctionDef*>;

inline constexpr char kWrapperName[] = "intune_untracked";
inline constexpr char kWrapperOutput[] = ":handle:0";

// Ops that build one dataset per input element with their function `f`.
bool IsPerElementOp(absl::string_view op) {
  return op == "InterleaveDataset" || op == "FlatMapDataset" ||
         op == "ParallelInterleaveDataset" ||
         op == "ParallelInterleaveDatasetV2" ||
         op == "ParallelInterleaveDatasetV3" ||
         op == "ParallelInterleaveDatasetV4" ||
         op == "LegacyParallelInterleaveDatasetV2";
}

bool IsBufferingOp(absl::string_view op) {
  return KnobInputOffset(op) != 0 || absl::StartsWith(op, "Parallel") ||
         absl::StartsWith(op, "Legacy") || absl::StrContains(op, "Prefetch");
}

std::vector<std::string> CalledFunctions(const FunctionDef& function) {
  std::vector<std::string> names;
  for (const NodeDef& node : function.node_def()) {
    for (std::string& name : AttrFunctions(node)) {
      names.push_back(std::move(name));
    }
  }
  return names;
}

// Whether function `name`, or a function it calls, has a stage that holds
// elements.
bool HasBufferingStage(const std::string& name, const Library& library,
                       std::unordered_set<std::string>* seen) {
  const auto function = library.find(name);
  if (!seen->insert(name).second || function == library.end()) return false;
  for (const NodeDef& node : function->second->node_def()) {
    if (IsBufferingOp(node.op())) return true;
  }
  for (const std::string& called : CalledFunctions(*function->second)) {
    if (HasBufferingStage(called, library, seen)) return true;
  }
  return false;
}

std::string NodeOf(absl::string_view reference) {
  return std::string(reference.substr(0, reference.find(':')));
}

// Wraps what `function` returns in an IntuneUntrackedDataset with the
// element spec of `outer`, unless it already returns one.
Status Wrap(const NodeDef& outer, FunctionDef* function,
            bool* structure_changed) {
  std::string* returned = ReturnedDataset(function);
  if (returned == nullptr) {
    return errors::InvalidArgument("function ", function->signature().name(),
                                   " has no ret for its output");
  }
  const auto nodes = NodesByName(function);
  const auto current = nodes.find(NodeOf(*returned));
  if (current != nodes.end() && current->second->op() == kUntrackedOp) {
    return OkStatus();
  }

  std::string name = kWrapperName;
  for (int i = 1; nodes.count(name) > 0; ++i) {
    name = absl::StrCat(kWrapperName, "_", i);
  }
  NodeDef wrapper;
  wrapper.set_name(name);
  wrapper.set_op(kUntrackedOp);
  wrapper.add_input(*returned);
  TF_RETURN_IF_ERROR(CopyAttr(kOutputTypes, outer, &wrapper));
  TF_RETURN_IF_ERROR(CopyAttr(kOutputShapes, outer, &wrapper));
  *returned = absl::StrCat(name, kWrapperOutput);
  *function->add_node_def() = std::move(wrapper);
  *structure_changed = true;
  return OkStatus();
}

}  // namespace

Status UntrackInner(GraphDef* graph, bool* structure_changed) {
  if (graph->library().function_size() == 0) return OkStatus();
  Library library;
  for (FunctionDef& function : *graph->mutable_library()->mutable_function()) {
    library[function.signature().name()] = &function;
  }
  std::unordered_set<std::string> done;
  for (const NodeDef& node : graph->node()) {
    if (!IsPerElementOp(node.op())) continue;
    const auto f = node.attr().find(kFunctionAttr);
    if (f == node.attr().end()) continue;
    const std::string& name = f->second.func().name();
    const auto function = library.find(name);
    std::unordered_set<std::string> seen;
    if (done.count(name) > 0 || function == library.end() ||
        function->second->signature().output_arg_size() != 1 ||
        HasBufferingStage(name, library, &seen)) {
      continue;
    }
    done.insert(name);
    TF_RETURN_IF_ERROR(Wrap(node, function->second, structure_changed));
  }
  return OkStatus();
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
