// Pass raise_interleave_buffers: deeper output buffers for parallel
// interleaves of records.
#include <limits>
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
inline constexpr int kBlockLength = -4;
inline constexpr int kBufferOutputElements = -3;

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

}  // namespace

Status RaiseInterleaveBuffers(int64_t elements, GraphDef* graph) {
  const auto nodes = NodesByName(graph);
  NodeNames names(*graph);
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
    if (inputs.size() < -kBlockLength) {
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
    const NodeDef* deeper = AddConst(
        names.Unique(
            absl::StrCat(node->name(), "/intune_buffer_output_elements")),
        elements, graph);
    node->set_input(inputs[inputs.size() + kBufferOutputElements],
                    deeper->name());
  }
  return OkStatus();
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
