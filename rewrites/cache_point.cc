// Where a pipeline stops changing between epochs (FindCachePoint, passes.h),
// and the pass insert_cache, which puts an IntuneCacheDataset there.
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "intune_tf/cc/graph_walk.h"
#include "rewrites/graph_utils.h"
#include "rewrites/passes.h"
#include "rewrites/row_wise.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/dataset_options.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_def.pb.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace rewrites {
namespace {

inline constexpr char kRetvalOp[] = "_Retval";
inline constexpr char kReshuffleAttr[] = "reshuffle_each_iteration";
// The attributes by which a parallel stage gives up its order: `deterministic`
// ("true", "false" or "default", which follows options.deterministic) and the
// older `sloppy` (options.deterministic: OptionsDropOrder, graph_utils.h).
inline constexpr char kDeterministicAttr[] = "deterministic";
inline constexpr char kSloppyAttr[] = "sloppy";

// Dataset ops whose elements are a function of their inputs (and of their
// functions, checked apart): the same every epoch when those are. Sources
// read files, which the cache checks at each epoch.
const absl::flat_hash_set<std::string>& PureDatasetOps() {
  static const auto* ops = new absl::flat_hash_set<std::string>{
      "TensorDataset", "TensorSliceDataset", "SparseTensorSliceDataset",
      "RangeDataset", "TFRecordDataset", "TFRecordDatasetV2",
      "TextLineDataset", "FixedLengthRecordDataset",
      "FixedLengthRecordDatasetV2", "MapDataset", "ParallelMapDataset",
      "ParallelMapDatasetV2", "FilterDataset", "ParallelFilterDataset",
      "BatchDataset", "BatchDatasetV2", "ParallelBatchDataset",
      "PaddedBatchDataset", "PaddedBatchDatasetV2", "MapAndBatchDataset",
      "FlatMapDataset", "InterleaveDataset", "ParallelInterleaveDatasetV2",
      "ParallelInterleaveDatasetV3", "ParallelInterleaveDatasetV4",
      "LegacyParallelInterleaveDatasetV2", "PrefetchDataset", "TakeDataset",
      "SkipDataset", "ZipDataset", "ConcatenateDataset", "OptionsDataset",
      "ModelDataset", "MaxIntraOpParallelismDataset",
      "PrivateThreadPoolDataset", "UnbatchDataset", "ScanDataset",
      "AssertCardinalityDataset", "AssertNextDataset", "IgnoreErrorsDataset",
      "WindowDataset", "UniqueDataset", "DenseToSparseBatchDataset",
      kUntrackedOp, kBufferReleaseOp};
  return *ops;
}

// Sources whose work is too little to be worth a cache's bytes.
bool IsCheapSource(absl::string_view op) {
  return op == "TensorDataset" || op == "TensorSliceDataset" ||
         op == "SparseTensorSliceDataset" || op == "RangeDataset";
}

// Pass-throughs that do no work of their own.
bool IsWrapper(absl::string_view op) {
  return op == "OptionsDataset" || op == "ModelDataset" ||
         op == kPrefetchOp || op == "MaxIntraOpParallelismDataset" ||
         op == "PrivateThreadPoolDataset" || op == "TakeDataset" ||
         op == "SkipDataset" || op == "AssertCardinalityDataset" ||
         op == "AssertNextDataset" || op == kUntrackedOp ||
         op == kBufferReleaseOp;
}

bool IsDatasetOp(absl::string_view op) {
  return absl::StrContains(op, "Dataset");
}

bool IsShuffle(absl::string_view op) {
  return op == "ShuffleDataset" || op == "ShuffleDatasetV2" ||
         op == "ShuffleDatasetV3";
}

bool IsUserCache(absl::string_view op) {
  return op == "CacheDataset" || op == "CacheDatasetV2" ||
         op == "SnapshotDataset" || op == "SnapshotDatasetV2" ||
         op == kCacheOp;
}

// Random number ops, seeded or not, stateful or stateless: a stateless op
// with a seed from the element or the epoch changes between epochs.
bool IsRandomOp(absl::string_view op) {
  return absl::StrContains(op, "Random") || absl::StrContains(op, "random") ||
         absl::StrContains(op, "Multinomial") ||
         absl::StrContains(op, "Shuffle") ||
         absl::StrContains(op, "SeedGenerator") ||
         absl::StrContains(op, "ParameterizedTruncatedNormal") ||
         absl::StrContains(op, "TruncatedNormal");
}

bool IsCall(absl::string_view op) {
  return op == "PartitionedCall" || op == "StatefulPartitionedCall";
}

bool IsPyFunction(absl::string_view op) {
  return op == "PyFunc" || op == "PyFuncStateless" || op == "EagerPyFunc";
}

// Ops that read the file (or files) their first input names.
bool ReadsNamedFile(absl::string_view op) {
  return op == "ReadFile" || op == "TFRecordDataset" ||
         op == "TFRecordDatasetV2" || op == "TextLineDataset" ||
         op == "FixedLengthRecordDataset" || op == "FixedLengthRecordDatasetV2";
}

// Dataset ops whose elements are elements of their dataset inputs (all of
// those inputs when `all_inputs`, else the first), unchanged in value.
bool KeepsElements(absl::string_view op, bool* all_inputs) {
  *all_inputs = op == "ZipDataset" || op == "ConcatenateDataset";
  return *all_inputs || IsShuffle(op) || IsWrapper(op) ||
         op == "RepeatDataset" || op == "BatchDataset" ||
         op == "BatchDatasetV2" || op == "PaddedBatchDataset" ||
         op == "PaddedBatchDatasetV2" || op == "UnbatchDataset" ||
         op == "FilterDataset" || op == "ParallelFilterDataset" ||
         op == "ShardDataset";
}

// Dataset ops that call a function on each element of their first input,
// with the captured arguments from their second input on: the function's
// arguments are the element's components, then those.
bool MapsElements(absl::string_view op) {
  return op == "MapDataset" || op == "ParallelMapDataset" ||
         op == "ParallelMapDatasetV2" || op == "FilterDataset" ||
         op == "ParallelFilterDataset" || op == "FlatMapDataset" ||
         op == "InterleaveDataset" || op == "ParallelInterleaveDatasetV2" ||
         op == "ParallelInterleaveDatasetV3" ||
         op == "ParallelInterleaveDatasetV4" ||
         op == "LegacyParallelInterleaveDatasetV2" ||
         op == "MapAndBatchDataset";
}

// Whether the file names that ops read are strings the cache's check of
// files sees (cache_dataset_op.cc: the string constants of the graph and of
// its functions, and the tensors it holds): a name is seen when it is such
// a string, passed unchanged, and not when it is computed as the pipeline
// runs (`tf.strings.join` into `ReadFile`), whose file the check cannot
// know.
class FileNames {
 public:
  explicit FileNames(const GraphDef& graph) {
    for (const NodeDef& node : graph.node()) nodes_[node.name()] = &node;
    for (const FunctionDef& f : graph.library().function()) {
      functions_[f.signature().name()] = &f;
    }
    ForEachNode(graph, [this](const NodeDef& node, const FunctionDef* f) {
      AddCaller(node, f);
    });
  }

  // Empty when `node` (of `function`, null for the graph) reads no file or
  // reads files whose names are seen; else why not.
  std::string Reason(const NodeDef& node, const FunctionDef* function) {
    if (!ReadsNamedFile(node.op()) || node.input_size() == 0) return "";
    if (Seen(node.input(0), function)) return "";
    return absl::StrCat(node.name(), " (", node.op(),
                        ") reads a file named as the pipeline runs, which "
                        "the cache cannot check for changes");
  }

 private:
  struct Caller {
    const NodeDef* node;
    const FunctionDef* function;
  };

  void AddCaller(const NodeDef& node, const FunctionDef* function) {
    if (!node.op().empty()) callers_[node.op()].push_back({&node, function});
    for (const std::string& called : AttrFunctions(node)) {
      callers_[called].push_back({&node, function});
    }
  }

  // The node `reference` names in `function` (null: the graph), or null;
  // `arg` is set to the function argument's index when it names one.
  const NodeDef* Resolve(const std::string& reference,
                         const FunctionDef* function, int* arg) const {
    *arg = -1;
    if (function == nullptr) {
      const auto it = nodes_.find(InputName(reference));
      return it == nodes_.end() ? nullptr : it->second;
    }
    const std::string name = reference.substr(0, reference.find(':'));
    const auto& args = function->signature().input_arg();
    for (int i = 0; i < args.size(); ++i) {
      if (args[i].name() == name) {
        *arg = i;
        return nullptr;
      }
    }
    for (const NodeDef& node : function->node_def()) {
      if (node.name() == name) return &node;
    }
    return nullptr;
  }

  // Whether the string tensor `reference` of `function` is one the check
  // sees.
  bool Seen(const std::string& reference, const FunctionDef* function) {
    if (IsControlInput(reference)) return false;
    int arg = -1;
    const NodeDef* node = Resolve(reference, function, &arg);
    if (arg >= 0) return ArgSeen(function->signature().name(), arg);
    if (node == nullptr) return false;
    const std::string& op = node->op();
    if (op == "Const" || op == "Placeholder") return true;
    // Ops that give strings of their first input, rearranged (`TFRecordDataset`
    // reshapes its file names), or of all their inputs but the axis.
    if (SelectsStrings(op) && node->input_size() > 0) {
      return Seen(node->input(0), function);
    }
    if (op == "Pack" || op == "ConcatV2") {
      std::vector<std::string> inputs;
      for (const std::string& input : node->input()) {
        if (!IsControlInput(input)) inputs.push_back(input);
      }
      if (op == "ConcatV2" && !inputs.empty()) inputs.pop_back();
      for (const std::string& input : inputs) {
        if (!Seen(input, function)) return false;
      }
      return !inputs.empty();
    }
    return false;
  }

  static bool SelectsStrings(absl::string_view op) {
    return op == "Identity" || op == "Snapshot" || op == "Reshape" ||
           op == "ExpandDims" || op == "Squeeze" || op == "GatherV2" ||
           op == "Gather" || op == "StridedSlice" || op == "Slice" ||
           op == "Tile" || op == "Transpose" || op == "ReverseV2";
  }

  // Whether every string of the elements of dataset `reference` is seen.
  bool ElementsSeen(const std::string& reference, const FunctionDef* function) {
    if (IsControlInput(reference)) return false;
    int arg = -1;
    const NodeDef* node = Resolve(reference, function, &arg);
    if (node == nullptr) return false;
    const std::string& op = node->op();
    if (op == "TensorDataset" || op == "TensorSliceDataset") {
      for (const std::string& input : node->input()) {
        if (!IsControlInput(input) && !Seen(input, function)) return false;
      }
      return true;
    }
    bool all_inputs = false;
    if (!KeepsElements(op, &all_inputs) || node->input_size() == 0) {
      return false;
    }
    if (!all_inputs) return ElementsSeen(node->input(0), function);
    for (const std::string& input : node->input()) {
      if (IsControlInput(input)) continue;
      if (!ElementsSeen(input, function)) return false;
    }
    return true;
  }

  // Whether argument `index` of function `name` is seen at every call.
  bool ArgSeen(const std::string& name, int index) {
    const std::string key = absl::StrCat(name, "#", index);
    const auto memo = args_.find(key);
    if (memo != args_.end()) return memo->second;
    args_[key] = false;  // a recursive call sees nothing more
    const auto callers = callers_.find(name);
    const auto function = functions_.find(name);
    bool seen = callers != callers_.end() && function != functions_.end();
    for (size_t c = 0; seen && c < callers->second.size(); ++c) {
      const Caller& caller = callers->second[c];
      const NodeDef& node = *caller.node;
      std::vector<std::string> inputs;
      for (const std::string& input : node.input()) {
        if (!IsControlInput(input)) inputs.push_back(input);
      }
      if (node.op() == name || IsCall(node.op())) {
        seen = index < static_cast<int>(inputs.size()) &&
               Seen(inputs[index], caller.function);
      } else if (MapsElements(node.op()) && !inputs.empty()) {
        const auto captured = node.attr().find("Targuments");
        const int num_captured =
            captured == node.attr().end() ? 0
                                          : captured->second.list().type_size();
        const int components =
            function->second->signature().input_arg_size() - num_captured;
        if (index < components) {
          seen = ElementsSeen(inputs[0], caller.function);
        } else {
          const int at = 1 + index - components;
          seen = at < static_cast<int>(inputs.size()) &&
                 Seen(inputs[at], caller.function);
        }
      } else {
        seen = false;
      }
    }
    args_[key] = seen;
    return seen;
  }

  std::unordered_map<std::string, const NodeDef*> nodes_;
  std::unordered_map<std::string, const FunctionDef*> functions_;
  std::unordered_map<std::string, std::vector<Caller>> callers_;
  std::unordered_map<std::string, bool> args_;
};

class Purity {
 public:
  explicit Purity(const GraphDef& graph) : file_names_(graph) {
    for (const NodeDef& node : graph.node()) nodes_[node.name()] = &node;
    for (const FunctionDef& f : graph.library().function()) {
      functions_[f.signature().name()] = &f;
    }
  }

  const NodeDef* Node(const std::string& name) const {
    const auto it = nodes_.find(name);
    return it == nodes_.end() ? nullptr : it->second;
  }

  // Empty when the node of the top-level graph, and everything it reads,
  // give the same values every epoch; else why not.
  std::string NodeReason(const std::string& name) {
    const auto memo = node_reasons_.find(name);
    if (memo != node_reasons_.end()) return memo->second;
    node_reasons_[name] = "";  // a cycle adds nothing new
    const NodeDef* node = Node(name);
    std::string reason =
        node == nullptr ? absl::StrCat("unknown input ", name) : OpReason(*node);
    if (reason.empty() && node != nullptr) {
      reason = file_names_.Reason(*node, nullptr);
    }
    if (reason.empty()) {
      for (const std::string& input : node->input()) {
        reason = NodeReason(InputName(input));
        if (!reason.empty()) break;
      }
    }
    node_reasons_[name] = reason;
    return reason;
  }

  // Empty when `node` itself (not its inputs) is pure: its op, attributes
  // and the functions it calls. `in_function`: a node of a function's body.
  std::string OpReason(const NodeDef& node, bool in_function = false) {
    const std::string& op = node.op();
    const std::string where = absl::StrCat(node.name(), " (", op, ")");
    if (IsShuffle(op)) {
      const auto reshuffle = node.attr().find(kReshuffleAttr);
      if (reshuffle == node.attr().end() || reshuffle->second.b()) {
        return absl::StrCat(where, " reshuffles each epoch");
      }
      return absl::StrCat(where, " shuffles with a seed of its own");
    }
    if (IsUserCache(op)) return absl::StrCat(where, " is a cache");
    // In the pipeline the cache goes below a repeat, so that each
    // repetition reads it. Inside a function (an interleave's
    // `from_tensors(i).repeat()` zipped with a file's lines) a repeat gives
    // the same elements each time the function's dataset is made.
    if (op == "RepeatDataset") {
      if (in_function) return "";
      return absl::StrCat(where, " repeats: the cache goes below it");
    }
    const auto function = functions_.find(op);
    if (function != functions_.end()) {
      const std::string reason = FunctionReason(op);
      if (!reason.empty()) return absl::StrCat(where, ": ", reason);
    } else if (IsDatasetOp(op)) {
      if (!PureDatasetOps().contains(op)) {
        return absl::StrCat(where, " is not known to repeat each epoch");
      }
    }
    for (const std::string& name : AttrFunctions(node)) {
      const std::string reason = FunctionReason(name);
      if (!reason.empty()) {
        return absl::StrCat(where, " calls ", name, ": ", reason);
      }
    }
    // A call is as pure as what it calls (checked above), whether or not
    // TF made it a StatefulPartitionedCall.
    if (function == functions_.end() && !IsDatasetOp(op) && !IsCall(op)) {
      const std::string reason = PlainOpReason(op);
      if (!reason.empty()) return absl::StrCat(where, " ", reason);
    }
    return "";
  }

 private:
  // A non-dataset op of the registry (or not).
  static std::string PlainOpReason(const std::string& op) {
    if (IsPyFunction(op)) return "is a py_function";
    if (IsRandomOp(op)) return "is random";
    const OpDef* op_def = nullptr;
    if (!OpRegistry::Global()->LookUpOpDef(op, &op_def).ok() ||
        op_def == nullptr) {
      return "is an unknown op";
    }
    if (op_def->is_stateful()) return "is stateful";
    return "";
  }

  std::string FunctionReason(const std::string& name) {
    const auto memo = function_reasons_.find(name);
    if (memo != function_reasons_.end()) return memo->second;
    function_reasons_[name] = "";  // recursion adds nothing new
    const auto function = functions_.find(name);
    std::string reason;
    if (function == functions_.end()) {
      reason = absl::StrCat("function ", name, " is not in the library");
    } else {
      for (const NodeDef& node : function->second->node_def()) {
        reason = OpReason(node, /*in_function=*/true);
        if (reason.empty()) reason = file_names_.Reason(node, function->second);
        if (!reason.empty()) break;
      }
    }
    function_reasons_[name] = reason;
    return reason;
  }

  std::unordered_map<std::string, const NodeDef*> nodes_;
  std::unordered_map<std::string, const FunctionDef*> functions_;
  std::unordered_map<std::string, std::string> node_reasons_;
  std::unordered_map<std::string, std::string> function_reasons_;
  FileNames file_names_;
};

// The node whose output is the pipeline's: read by the graph's _Retval or
// Grappler's Sink, else the one dataset node that no node reads.
const NodeDef* OutputNode(const GraphDef& graph, const Purity& purity) {
  std::unordered_set<std::string> read;
  for (const NodeDef& node : graph.node()) {
    if (node.op() == kRetvalOp || IsGrapplerSink(node)) {
      for (const int i : DataInputs(node)) {
        return purity.Node(InputName(node.input(i)));
      }
    }
    for (const std::string& input : node.input()) read.insert(InputName(input));
  }
  const NodeDef* output = nullptr;
  for (const NodeDef& node : graph.node()) {
    if (!IsDatasetOp(node.op()) || read.count(node.name()) > 0) continue;
    if (output != nullptr) return nullptr;
    output = &node;
  }
  return output;
}

bool HoldsUserCache(const GraphDef& graph) {
  return AnyNode(graph, [](const NodeDef& node, const FunctionDef*) {
    return IsUserCache(node.op());
  });
}

// Whether the pipeline below `name` does work worth caching: more than
// in-memory sources under pass-throughs.
bool DoesWork(const Purity& purity, const std::string& name,
              std::unordered_set<std::string>* seen) {
  if (!seen->insert(name).second) return false;
  const NodeDef* node = purity.Node(name);
  if (node == nullptr || !IsDatasetOp(node->op())) return false;
  if (IsCheapSource(node->op())) return false;
  if (!IsWrapper(node->op())) return true;
  for (const int i : DataInputs(*node)) {
    if (DoesWork(purity, InputName(node->input(i)), seen)) return true;
  }
  return false;
}

// Why `node` itself may give its elements in another order each epoch, or
// empty: a `deterministic` of "false" (or "default" when `options_unordered`)
// or a true `sloppy`.
std::string NodeOrderReason(const NodeDef& node, bool options_unordered) {
  const std::string where = absl::StrCat(node.name(), " (", node.op(), ")");
  const auto deterministic = node.attr().find(kDeterministicAttr);
  if (deterministic != node.attr().end()) {
    const std::string& value = deterministic->second.s();
    if (value == "false") return absl::StrCat(where, " has deterministic=False");
    if (value == "default" && options_unordered) {
      return absl::StrCat(where, " follows options.deterministic=False");
    }
  }
  const auto sloppy = node.attr().find(kSloppyAttr);
  if (sloppy != node.attr().end() && sloppy->second.b()) {
    return absl::StrCat(where, " is sloppy");
  }
  return "";
}

// Why the elements of `name` (a node of the top-level graph), from it down
// through every input and every function called on the way, may come in
// another order each epoch; empty when their order is fixed.
std::string OrderReason(const GraphDef& graph, const std::string& name) {
  const bool options_unordered = OptionsDropOrder(graph);
  std::unordered_map<std::string, const NodeDef*> nodes;
  for (const NodeDef& node : graph.node()) nodes[node.name()] = &node;
  std::unordered_map<std::string, const FunctionDef*> functions;
  for (const FunctionDef& f : graph.library().function()) {
    functions[f.signature().name()] = &f;
  }
  std::unordered_set<std::string> seen_nodes;
  std::unordered_set<std::string> seen_functions;
  std::vector<std::string> pending_nodes = {name};
  std::vector<std::string> pending_functions;
  // A node's own order, then the functions it names (by op or attribute).
  const auto visit = [&](const NodeDef& node) -> std::string {
    std::string reason = NodeOrderReason(node, options_unordered);
    if (!reason.empty()) return reason;
    if (functions.count(node.op()) > 0) pending_functions.push_back(node.op());
    for (std::string& called : AttrFunctions(node)) {
      pending_functions.push_back(std::move(called));
    }
    return "";
  };
  while (!pending_nodes.empty() || !pending_functions.empty()) {
    if (!pending_nodes.empty()) {
      const std::string current = pending_nodes.back();
      pending_nodes.pop_back();
      if (!seen_nodes.insert(current).second) continue;
      const auto node = nodes.find(current);
      if (node == nodes.end()) continue;
      const std::string reason = visit(*node->second);
      if (!reason.empty()) return reason;
      for (const std::string& input : node->second->input()) {
        pending_nodes.push_back(InputName(input));
      }
      continue;
    }
    const std::string current = pending_functions.back();
    pending_functions.pop_back();
    if (!seen_functions.insert(current).second) continue;
    const auto function = functions.find(current);
    if (function == functions.end()) continue;
    for (const NodeDef& node : function->second->node_def()) {
      const std::string reason = visit(node);
      if (!reason.empty()) return reason;
    }
  }
  return "";
}

// No cache point, for `reason`.
CachePoint NoPoint(std::string reason) {
  CachePoint point;
  point.decision = CacheDecision::Declined("", std::move(reason));
  return point;
}

// FindCachePoint but for the row-wise chain above the point.
CachePoint PointOf(const GraphDef& graph) {
  if (HoldsUserCache(graph)) return NoPoint("the pipeline has its own cache");
  // A global shuffle reads its input by index (random access), which the
  // cache does not serve.
  if (HoldsOp(graph, kGlobalShuffleOp)) {
    return NoPoint("a global shuffle reads the pipeline by index");
  }
  if (HoldsOp(graph, kAssertPrevOp)) {
    return NoPoint("an assert_prev checks the stages below it");
  }
  Purity purity(graph);
  const NodeDef* node = OutputNode(graph, purity);
  if (node == nullptr) return NoPoint("no single output dataset");
  // Down the pipeline from its output, through each dataset's first input,
  // to the first dataset that repeats each epoch.
  std::string stop;
  std::unordered_set<std::string> passed;
  while (true) {
    if (!passed.insert(node->name()).second) {
      return NoPoint(absl::StrCat("the pipeline's inputs make a cycle at ",
                                 node->name()));
    }
    const std::string reason = purity.NodeReason(node->name());
    if (reason.empty()) break;
    stop = purity.OpReason(*node);
    if (stop.empty()) stop = reason;
    const std::vector<int> inputs = DataInputs(*node);
    const NodeDef* input =
        inputs.empty() ? nullptr : purity.Node(InputName(node->input(inputs[0])));
    if (input == nullptr || !IsDatasetOp(input->op())) {
      return NoPoint(absl::StrCat("nothing repeats each epoch: ", stop));
    }
    node = input;
  }
  // Below pass-throughs at the top (a prefetch, options): the cache goes
  // right above the last stage that works.
  std::unordered_set<std::string> seen;
  if (!DoesWork(purity, node->name(), &seen)) {
    return NoPoint(absl::StrCat("nothing to save below ", node->name()));
  }
  passed.clear();
  while (IsWrapper(node->op()) && passed.insert(node->name()).second) {
    const std::vector<int> inputs = DataInputs(*node);
    if (inputs.empty()) break;
    const NodeDef* input = purity.Node(InputName(node->input(inputs[0])));
    seen.clear();
    if (input == nullptr || !DoesWork(purity, input->name(), &seen)) break;
    node = input;
  }
  CachePoint point;
  point.unordered = OrderReason(graph, node->name());
  std::string reason = stop.empty() ? "the whole pipeline repeats each epoch"
                                    : absl::StrCat("above it: ", stop);
  if (!point.unordered.empty()) {
    absl::StrAppend(&reason, "; only whole epochs are served: ",
                    point.unordered);
  }
  point.decision = CacheDecision::Placed(node->name(), std::move(reason));
  return point;
}

}  // namespace

CachePoint FindCachePoint(const GraphDef& graph) {
  CachePoint point = PointOf(graph);
  Purity purity(graph);
  const NodeDef* output = OutputNode(graph, purity);
  if (output == nullptr) return point;
  point.row_wise = FindRowWiseChain(graph, output->name());
  if (point.row_wise.found) {
    absl::StrAppend(&point.decision.reason, "; ",
                    point.row_wise.Describe());
  }
  return point;
}

Status InsertCache(GraphDef* graph, CachePoint* point, bool* structure_changed) {
  *point = FindCachePoint(*graph);
  if (!point->decision.placed()) return OkStatus();
  const std::string& node_name = point->decision.point;
  const auto nodes = NodesByName(graph);
  const auto producer = nodes.find(node_name);
  if (producer == nodes.end()) {
    return errors::Internal("cache point ", node_name, " is not in the graph");
  }
  NodeNames names(*graph);
  NodeDef cache;
  cache.set_name(names.Unique(absl::StrCat(node_name, "/intune_cache")));
  cache.set_op(kCacheOp);
  cache.add_input(node_name);
  TF_RETURN_IF_ERROR(CopyAttr(kOutputTypes, *producer->second, &cache));
  TF_RETURN_IF_ERROR(CopyAttr(kOutputShapes, *producer->second, &cache));
  (*cache.mutable_attr())[kCachePointAttr].set_s(node_name);
  if (!point->unordered.empty()) {
    (*cache.mutable_attr())[kCacheUnorderedAttr].set_s(point->unordered);
  }
  for (NodeDef& node : *graph->mutable_node()) {
    for (std::string& input : *node.mutable_input()) {
      if (IsControlInput(input) || InputName(input) != node_name) continue;
      input = cache.name();
    }
  }
  point->cache_node = cache.name();
  *graph->add_node() = std::move(cache);
  *structure_changed = true;
  return OkStatus();
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
