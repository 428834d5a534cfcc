#include "rewrites/graph_utils.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/dataset_options.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/types.pb.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace rewrites {
namespace {

inline constexpr char kConstOp[] = "Const";
inline constexpr char kSink[] = "Sink";
inline constexpr char kFakeSink[] = "FakeSink";
// SetUnique{Graph,Function}NodeName's suffix when a name is taken.
inline constexpr char kUniqueSuffix[] = "/_";

}  // namespace

int KnobInputOffset(absl::string_view op) {
  if (op == "ParallelMapDatasetV2" || op == "ParallelInterleaveDatasetV2" ||
      op == "ParallelInterleaveDatasetV3" ||
      op == "ParallelInterleaveDatasetV4" || op == kPrefetchOp) {
    return -1;
  }
  if (op == "ParallelBatchDataset" || op == "MapAndBatchDataset") return -2;
  return 0;
}

bool IsParallelStage(absl::string_view op) {
  return KnobInputOffset(op) != 0 && op != kPrefetchOp;
}

bool IsGrapplerSink(const NodeDef& node) {
  return node.op() == kIdentityOp &&
         (node.name() == kSink ||
          absl::StartsWith(node.name(), absl::StrCat(kSink, kUniqueSuffix)));
}

bool IsFakeSink(const NodeDef& node) {
  return node.op() == kIdentityOp && node.input_size() == 1 &&
         absl::StartsWith(node.name(), kFakeSink);
}

bool IsControlInput(absl::string_view reference) {
  return absl::StartsWith(reference, "^");
}

std::string InputName(absl::string_view reference) {
  while (absl::StartsWith(reference, "^")) reference.remove_prefix(1);
  return std::string(reference.substr(0, reference.find(':')));
}

std::vector<int> DataInputs(const NodeDef& node) {
  std::vector<int> indices;
  for (int i = 0; i < node.input_size(); ++i) {
    if (!IsControlInput(node.input(i))) indices.push_back(i);
  }
  return indices;
}

std::optional<int> KnobInputIndex(const NodeDef& node) {
  const int offset = KnobInputOffset(node.op());
  if (offset == 0) return std::nullopt;
  const std::vector<int> indices = DataInputs(node);
  const int size = indices.size();
  if (size < -offset + 1) return std::nullopt;
  return indices[size + offset];
}

std::optional<int64_t> ConstInt(const NodeDef& node) {
  if (node.op() != kConstOp) return std::nullopt;
  const auto value = node.attr().find("value");
  if (value == node.attr().end()) return std::nullopt;
  const TensorProto& tensor = value->second.tensor();
  if (tensor.tensor_shape().dim_size() > 0) return std::nullopt;
  if (tensor.int64_val_size() > 0) return tensor.int64_val(0);
  if (tensor.int_val_size() > 0) return tensor.int_val(0);
  const std::string& content = tensor.tensor_content();
  if (content.empty()) return 0;
  if (content.size() > sizeof(int64_t)) return std::nullopt;
  // Little-endian, signed, of any width up to 8 bytes.
  uint64_t bits = 0;
  for (size_t i = 0; i < content.size(); ++i) {
    bits |= static_cast<uint64_t>(static_cast<unsigned char>(content[i]))
            << (8 * i);
  }
  const int unused = 64 - 8 * content.size();
  return static_cast<int64_t>(bits << unused) >> unused;
}

void SetBool(absl::string_view attr, bool value, NodeDef* node) {
  (*node->mutable_attr())[std::string(attr)].set_b(value);
}

void MakeBufferKnob(NodeDef* prefetch) {
  SetBool(kLegacyAutotune, false, prefetch);
  AttrValue& min = (*prefetch->mutable_attr())[kBufferSizeMin];
  if (min.value_case() != AttrValue::kI || min.i() < 1) min.set_i(1);
}

Status CopyAttr(absl::string_view attr, const NodeDef& from, NodeDef* to) {
  const auto it = from.attr().find(std::string(attr));
  if (it == from.attr().end()) {
    return errors::InvalidArgument("node ", from.name(), " (", from.op(),
                                   ") has no attr ", attr);
  }
  (*to->mutable_attr())[std::string(attr)] = it->second;
  return OkStatus();
}

std::unordered_map<std::string, NodeDef*> NodesByName(GraphDef* graph) {
  std::unordered_map<std::string, NodeDef*> nodes;
  for (NodeDef& node : *graph->mutable_node()) nodes[node.name()] = &node;
  return nodes;
}

std::unordered_map<std::string, NodeDef*> NodesByName(FunctionDef* function) {
  std::unordered_map<std::string, NodeDef*> nodes;
  for (NodeDef& node : *function->mutable_node_def()) {
    nodes[node.name()] = &node;
  }
  return nodes;
}

std::string* ReturnedDataset(FunctionDef* function) {
  if (function->signature().output_arg_size() != 1) return nullptr;
  const std::string& out = function->signature().output_arg(0).name();
  auto ret = function->mutable_ret()->find(out);
  if (ret == function->mutable_ret()->end()) return nullptr;
  std::string* returned = &ret->second;
  for (NodeDef& node : *function->mutable_node_def()) {
    if (node.name() == InputName(*returned) && IsFakeSink(node)) {
      return node.mutable_input(0);
    }
  }
  return returned;
}

NodeNames::NodeNames(const GraphDef& graph) {
  for (const NodeDef& node : graph.node()) names_.insert(node.name());
}

std::string NodeNames::Unique(absl::string_view base) {
  std::string candidate(base);
  for (int i = 1; names_.count(candidate) > 0; ++i) {
    candidate = absl::StrCat(base, "_", i);
  }
  names_.insert(candidate);
  return candidate;
}

NodeDef* AddConst(const std::string& name, int64_t value, GraphDef* graph) {
  NodeDef* node = graph->add_node();
  node->set_name(name);
  node->set_op(kConstOp);
  auto& attr = *node->mutable_attr();
  attr["dtype"].set_type(DT_INT64);
  TensorProto* tensor = attr["value"].mutable_tensor();
  tensor->set_dtype(DT_INT64);
  tensor->mutable_tensor_shape();
  tensor->add_int64_val(value);
  return node;
}

bool OptionsDropOrder(const GraphDef& graph) {
  for (const NodeDef& node : graph.node()) {
    if (node.op() != kTfOptionsOp) continue;
    const auto attr = node.attr().find(kSerializedOptionsAttr);
    if (attr == node.attr().end()) continue;
    data::Options options;
    if (!options.ParseFromString(attr->second.s())) continue;
    if (options.optional_deterministic_case() ==
            data::Options::kDeterministic &&
        !options.deterministic()) {
      return true;
    }
  }
  return false;
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
