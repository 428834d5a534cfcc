// Helpers of the rewrite passes over a dataset GraphDef (plain proto
// manipulation: TF's grappler/optimizers/data/graph_utils is not exported by
// its shared libraries).
#ifndef INTUNE_TF_REWRITES_GRAPH_UTILS_H_
#define INTUNE_TF_REWRITES_GRAPH_UTILS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/strings/string_view.h"
#include "intune_tf/cc/op_names.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/platform/status.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

inline constexpr int64_t kAutotune = -1;
inline constexpr char kPrefetchOp[] = "PrefetchDataset";
// A shuffle that reads its input by index (random access).
inline constexpr char kGlobalShuffleOp[] = "GlobalShuffleDataset";
// A test op that checks, when its iterator is made, the ops of the stages
// below it (`assert_prev`).
inline constexpr char kAssertPrevOp[] = "AssertPrevDataset";
// The attribute of a dataset op naming its function.
inline constexpr char kFunctionAttr[] = "f";
inline constexpr char kOutputTypes[] = "output_types";
inline constexpr char kOutputShapes[] = "output_shapes";
inline constexpr char kIdentityOp[] = "Identity";
inline constexpr char kLegacyAutotune[] = "legacy_autotune";
inline constexpr char kBufferSizeMin[] = "buffer_size_min";

// Which data input (counted from the end, control inputs excluded) holds the
// knob of a stage whose parallelism or buffer size can be a knob, or 0 when
// `op` is not such a stage:
//   ParallelMapDatasetV2(input, captured..., num_parallel_calls)
//   ParallelInterleaveDatasetV2/V3/V4(input, captured..., cycle_length,
//       block_length, [buffer_output_elements, prefetch_input_elements,]
//       num_parallel_calls)
//   ParallelBatchDataset(input, batch_size, num_parallel_calls, drop_remainder)
//   MapAndBatchDataset(input, captured..., batch_size, num_parallel_calls,
//       drop_remainder)
//   PrefetchDataset(input, buffer_size)
int KnobInputOffset(absl::string_view op);

// A knob stage other than PrefetchDataset.
bool IsParallelStage(absl::string_view op);

// The Identity that Grappler's data::GetGrapplerItem appends as the graph's
// fetch node ("Sink", or "Sink/_<n>" if taken).
bool IsGrapplerSink(const NodeDef& node);

// An Identity that data::GetGrapplerItem appends to a function's outputs
// ("FakeSink<i>", or "FakeSink<i>/_<n>"); RemoveFakeSinks maps the function's
// ret back to its input afterwards.
bool IsFakeSink(const NodeDef& node);

bool IsControlInput(absl::string_view reference);

// "node:0", "node:handle:0", "^node" -> "node".
std::string InputName(absl::string_view reference);

// Indices into node.input() of the data (non-control) inputs.
std::vector<int> DataInputs(const NodeDef& node);

// Index into node.input() of a stage's knob input, if it is a stage with
// enough inputs.
std::optional<int> KnobInputIndex(const NodeDef& node);

// The scalar integer held by a Const node, if it is one.
std::optional<int64_t> ConstInt(const NodeDef& node);

void SetBool(absl::string_view attr, bool value, NodeDef* node);

// Makes a PrefetchDataset a buffer knob of the performance autotuner:
// legacy_autotune=false, and buffer_size_min at least 1. The legacy autotuner
// starts a buffer at max(1, buffer_size_min); the performance one starts it at
// buffer_size_min, and a buffer of 0 lets the consumer read the input itself,
// next to the prefetch thread. Under a global shuffle with warm start that
// thread reads without the shuffle's index mapper, so two readers would
// share the input's element counters (elements repeated and dropped).
void MakeBufferKnob(NodeDef* prefetch);

// Copies `attr` of `from` into `to`; an error if `from` has no such attr.
Status CopyAttr(absl::string_view attr, const NodeDef& from, NodeDef* to);

// The nodes of a graph by name (the last one of a name wins).
std::unordered_map<std::string, NodeDef*> NodesByName(GraphDef* graph);
std::unordered_map<std::string, NodeDef*> NodesByName(FunctionDef* function);

// The reference to the dataset a single-output function returns: its ret,
// or the input of the FakeSink Identity the ret points at; null if the
// function has no ret for its output.
std::string* ReturnedDataset(FunctionDef* function);

// Node names of a graph, to make new ones unique.
class NodeNames {
 public:
  explicit NodeNames(const GraphDef& graph);

  // `base`, or `base`_1, `base`_2, ... whichever is free first; the name is
  // then taken.
  std::string Unique(absl::string_view base);

 private:
  std::unordered_set<std::string> names_;
};

// TF's OptionsDataset, and its attribute that holds a data::Options.
inline constexpr char kTfOptionsOp[] = "OptionsDataset";
inline constexpr char kSerializedOptionsAttr[] = "serialized_options";

// Whether some OptionsDataset of the graph sets options.deterministic (or
// experimental_deterministic) to false: a stage left at "default" is then
// free to give its elements in any order.
bool OptionsDropOrder(const GraphDef& graph);

// Appends a scalar int64 Const node.
NodeDef* AddConst(const std::string& name, int64_t value, GraphDef* graph);

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_REWRITES_GRAPH_UTILS_H_
