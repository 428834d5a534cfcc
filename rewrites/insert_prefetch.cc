// Pass insert_prefetch: a prefetch (a memory knob) after every parallel
// stage.
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rewrites/graph_utils.h"
#include "rewrites/passes.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

Status InsertPrefetch(GraphDef* graph, bool* structure_changed) {
  // Data uses of each node: (consumer, index into its inputs).
  std::unordered_map<std::string, std::vector<std::pair<NodeDef*, int>>>
      consumers;
  for (NodeDef& node : *graph->mutable_node()) {
    for (int i = 0; i < node.input_size(); ++i) {
      if (IsControlInput(node.input(i))) continue;
      consumers[InputName(node.input(i))].emplace_back(&node, i);
    }
  }
  NodeNames names(*graph);
  const int size = graph->node_size();
  for (int i = 0; i < size; ++i) {
    const NodeDef& producer = graph->node(i);
    if (!IsParallelStage(producer.op())) continue;
    const auto uses = consumers.find(producer.name());
    if (uses == consumers.end()) continue;
    // A bounded interleave's release op (raise_interleave_buffers) passes
    // its elements through: what counts is what reads them from it.
    bool all_prefetch = true;
    for (const auto& [consumer, unused] : uses->second) {
      if (consumer->op() != kBufferReleaseOp) {
        all_prefetch &= consumer->op() == kPrefetchOp;
        continue;
      }
      const auto above = consumers.find(consumer->name());
      if (above == consumers.end()) all_prefetch = false;
      for (const auto& [reader, unused_index] : above->second) {
        all_prefetch &= reader->op() == kPrefetchOp;
      }
    }
    if (all_prefetch) continue;

    const std::string buffer =
        names.Unique(absl::StrCat(producer.name(), "/intune_buffer"));
    const std::string prefetch_name =
        names.Unique(absl::StrCat(producer.name(), "/intune_prefetch"));
    NodeDef prefetch;
    prefetch.set_name(prefetch_name);
    prefetch.set_op(kPrefetchOp);
    prefetch.add_input(producer.name());
    prefetch.add_input(buffer);
    TF_RETURN_IF_ERROR(CopyAttr(kOutputTypes, producer, &prefetch));
    TF_RETURN_IF_ERROR(CopyAttr(kOutputShapes, producer, &prefetch));
    MakeBufferKnob(&prefetch);
    AddConst(buffer, kAutotune, graph);
    *graph->add_node() = std::move(prefetch);
    for (const auto& [consumer, index] : uses->second) {
      if (consumer->op() != kPrefetchOp) {
        consumer->set_input(index, prefetch_name);
      }
    }
    *structure_changed = true;
  }
  return OkStatus();
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
