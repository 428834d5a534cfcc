// Pass raise_interleave_buffers: deeper output buffers for parallel
// interleaves of records, which the budget guard bounds: what the
// interleave's function returns is an IntuneUntrackedDataset (untrack_inner)
// given the interleave's `buffer_group`, and an IntuneBufferReleaseDataset
// goes above the interleave (intune_tf/cc/kernels/bounded_buffers.h).
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rewrites/graph_utils.h"
#include "rewrites/passes.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/statusor.h"

namespace tensorflow {
namespace intune {
namespace rewrites {
namespace {

inline constexpr char kInterleaveOp[] = "ParallelInterleaveDatasetV4";
// Data inputs of ParallelInterleaveDatasetV4, counted from the end:
// (input, captured..., cycle_length, block_length, buffer_output_elements,
//  prefetch_input_elements, num_parallel_calls).
inline constexpr int kCycleLength = -5;
inline constexpr int kBlockLength = -4;
inline constexpr int kBufferOutputElements = -3;
inline constexpr int kNumParallelCalls = -1;

// Whether every component of the node's elements is a scalar.
bool ScalarElements(const NodeDef& node) {
  const auto shapes = node.attr().find(kOutputShapes);
  if (shapes == node.attr().end() || shapes->second.list().shape().empty()) {
    return false;
  }
  for (const TensorShapeProto& shape : shapes->second.list().shape()) {
    if (shape.unknown_rank() || shape.dim_size() > 0) return false;
  }
  return true;
}

// TF's per-input output buffer when it is left on AUTOTUNE, which
// Dataset.interleave always does: 2 * block_length + 1.
std::optional<int64_t> TfDefaultBuffer(int64_t block_length) {
  if (block_length > (std::numeric_limits<int64_t>::max() - 1) / 2 ||
      block_length < std::numeric_limits<int64_t>::min() / 2) {
    return std::nullopt;
  }
  return 2 * block_length + 1;
}

// The IntuneUntrackedDataset that the function of `interleave` returns, if
// it has no buffer group yet.
NodeDef* UngroupedWrapper(const NodeDef& interleave, GraphDef* graph) {
  const auto f = interleave.attr().find(kFunctionAttr);
  if (f == interleave.attr().end()) return nullptr;
  for (FunctionDef& function : *graph->mutable_library()->mutable_function()) {
    if (function.signature().name() != f->second.func().name()) continue;
    const std::string* returned = ReturnedDataset(&function);
    if (returned == nullptr) return nullptr;
    for (NodeDef& node : *function.mutable_node_def()) {
      if (node.name() != InputName(*returned)) continue;
      if (node.op() != kUntrackedOp) return nullptr;
      const auto group = node.attr().find(kBufferGroupAttr);
      if (group != node.attr().end() && !group->second.s().empty()) {
        return nullptr;
      }
      return &node;
    }
  }
  return nullptr;
}

}  // namespace

Status RaiseInterleaveBuffers(int64_t elements, GraphDef* graph) {
  const auto nodes = NodesByName(graph);
  NodeNames names(*graph);
  // Data uses of each node: (consumer index, index into its inputs).
  std::unordered_map<std::string, std::vector<std::pair<int, int>>> consumers;
  for (int n = 0; n < graph->node_size(); ++n) {
    const NodeDef& node = graph->node(n);
    for (int i = 0; i < node.input_size(); ++i) {
      if (IsControlInput(node.input(i))) continue;
      consumers[InputName(node.input(i))].emplace_back(n, i);
    }
  }
  // Const value of a data input counted from the end.
  auto input_value =
      [&nodes](const NodeDef& node, const std::vector<int>& inputs,
               int offset) -> StatusOr<std::optional<int64_t>> {
    const auto input =
        nodes.find(InputName(node.input(inputs[inputs.size() + offset])));
    if (input == nodes.end()) {
      return errors::InvalidArgument("input ", -offset, " from the end of ",
                                     node.name(), " is not in the graph");
    }
    return ConstInt(*input->second);
  };
  const int size = graph->node_size();
  for (int i = 0; i < size; ++i) {
    NodeDef* node = graph->mutable_node(i);
    if (node->op() != kInterleaveOp || !ScalarElements(*node)) continue;
    const std::vector<int> inputs = DataInputs(*node);
    if (inputs.size() < -kCycleLength) {
      return errors::InvalidArgument(node->name(), " has ", inputs.size(),
                                     " data inputs");
    }
    TF_ASSIGN_OR_RETURN(const std::optional<int64_t> block,
                        input_value(*node, inputs, kBlockLength));
    TF_ASSIGN_OR_RETURN(const std::optional<int64_t> buffer,
                        input_value(*node, inputs, kBufferOutputElements));
    if (!block.has_value() || !buffer.has_value() ||
        buffer != TfDefaultBuffer(*block) || *buffer >= elements) {
      continue;
    }
    // The guard holds an input only while a worker thread is left for every
    // other input of the cycle: the interleave runs cycle_length workers
    // (AUTOTUNE gives it fewer at first, and TF starts no more once its
    // input is exhausted). An interleave given fewer keeps TF's buffers.
    TF_ASSIGN_OR_RETURN(const std::optional<int64_t> cycle,
                        input_value(*node, inputs, kCycleLength));
    TF_ASSIGN_OR_RETURN(const std::optional<int64_t> calls,
                        input_value(*node, inputs, kNumParallelCalls));
    if (!cycle.has_value() || *cycle <= 0 || !calls.has_value() ||
        (*calls != kAutotune && *calls != *cycle)) {
      continue;
    }
    NodeDef* wrapper = UngroupedWrapper(*node, graph);
    if (wrapper == nullptr) continue;
    const std::string group = node->name();
    (*wrapper->mutable_attr())[kBufferGroupAttr].set_s(group);

    NodeDef release;
    release.set_name(names.Unique(absl::StrCat(group, "/intune_release")));
    release.set_op(kBufferReleaseOp);
    release.add_input(group);
    TF_RETURN_IF_ERROR(CopyAttr(kOutputTypes, *node, &release));
    TF_RETURN_IF_ERROR(CopyAttr(kOutputShapes, *node, &release));
    (*release.mutable_attr())[kBufferGroupAttr].set_s(group);
    (*release.mutable_attr())[kRecordsPerInputAttr].set_i(elements);
    const std::string deeper = names.Unique(
        absl::StrCat(group, "/intune_buffer_output_elements"));
    node->set_input(inputs[inputs.size() + kBufferOutputElements], deeper);
    const std::string workers =
        names.Unique(absl::StrCat(group, "/intune_num_parallel_calls"));
    node->set_input(inputs[inputs.size() + kNumParallelCalls], workers);
    for (const auto& [consumer, index] : consumers[group]) {
      graph->mutable_node(consumer)->set_input(index, release.name());
    }
    AddConst(deeper, elements, graph);
    AddConst(workers, *cycle, graph);
    *graph->add_node() = std::move(release);
  }
  return OkStatus();
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
