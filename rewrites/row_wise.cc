// The row-wise proof of a map's function, and the `shuffle -> batch -> maps`
// chain it is run on (row_wise.h).
#include "rewrites/row_wise.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "intune_tf/cc/graph_walk.h"
#include "rewrites/graph_utils.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/dataset_options.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_def.pb.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"
#include "tensorflow/core/framework/types.pb.h"

namespace tensorflow {
namespace intune {
namespace rewrites {
// Named, not anonymous: the kernel library is built in unity units, where
// the other files' anonymous helpers (`Fixed`, `IsRandomOp`) would clash.
namespace row_wise_proof {

using Kind = RowWiseArg::Kind;
using Fact = RowWiseArg;

inline constexpr int kMaxDepth = 8;

// How strongly a refusal explains why the map is not row-wise: when a
// function holds several, the strongest is told (a boolean_mask also reads
// the batch's size, but the mask is what changes its rows).
enum Priority : int {
  kUnknownOp = 1,   // an op not on the list, or used where it is not proven
  kMixesRows = 2,   // a reduction over the batch, a gather, a sparse output
  kDropsRows = 3,   // a mask: how many rows come out depends on the values
  kNotPure = 4,     // random, stateful, a variable, py_function
};

struct Refusal {
  int priority = 0;
  std::string function;
  std::string node;
  std::string op;
  std::string reason;
};

// Ops whose output is their one input's, element by element (same shape).
const absl::flat_hash_set<std::string>& ElementWiseUnary() {
  static const auto* ops = new absl::flat_hash_set<std::string>{
      "Identity", "Snapshot", "StopGradient", "PreventGradient", "Cast",
      "EnsureShape", "Abs", "Neg", "Sign", "Square", "Sqrt", "Rsqrt",
      "Reciprocal", "Inv", "Exp", "Expm1", "Log", "Log1p", "Sin", "Cos",
      "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Tanh", "Asinh",
      "Acosh", "Atanh", "Sigmoid", "Relu", "Relu6", "Elu", "Selu",
      "Softplus", "Softsign", "Floor", "Ceil", "Round", "Rint", "IsNan",
      "IsInf", "IsFinite", "LogicalNot", "Invert", "Erf", "Erfc", "Lgamma",
      "Digamma", "ZerosLike", "OnesLike", "Real", "Imag", "Conj",
      "ComplexAbs", "Bucketize", "StringToHashBucketFast",
      "StringToHashBucketStrong", "StringToHashBucket", "StringToNumber",
      "AsString", "StringLower", "StringUpper", "StringStrip",
      "StaticRegexReplace", "StaticRegexFullMatch", "StringLength"};
  return *ops;
}

// Ops that combine their inputs element by element, with broadcasting.
const absl::flat_hash_set<std::string>& ElementWiseBroadcast() {
  static const auto* ops = new absl::flat_hash_set<std::string>{
      "Add", "AddV2", "Sub", "Mul", "MulNoNan", "Div", "DivNoNan",
      "RealDiv", "FloorDiv", "FloorMod", "TruncateDiv", "TruncateMod", "Mod",
      "Maximum", "Minimum", "Pow", "SquaredDifference", "Atan2", "Xdivy",
      "Xlogy", "Equal", "NotEqual", "Less", "LessEqual", "Greater",
      "GreaterEqual", "ApproximateEqual", "LogicalAnd", "LogicalOr",
      "BitwiseAnd", "BitwiseOr", "BitwiseXor", "LeftShift", "RightShift",
      "SelectV2", "ClipByValue", "StringJoin", "Substr"};
  return *ops;
}

// Reductions over the axes of their second input.
bool IsReduction(absl::string_view op) {
  return op == "Sum" || op == "Mean" || op == "Max" || op == "Min" ||
         op == "Prod" || op == "All" || op == "Any" || op == "EuclideanNorm";
}

// Stateful ops whose results still depend only on their inputs, checked
// apart: lookups (of an immutable table) and calls (their bodies).
bool StatefulAllowed(absl::string_view op) {
  return op == "LookupTableFindV2" || op == "LookupTableFind" ||
         op == "StatefulPartitionedCall" || op == "PartitionedCall";
}

bool IsCallOp(absl::string_view op) {
  return op == "PartitionedCall" || op == "StatefulPartitionedCall";
}

bool IsRandom(absl::string_view op) {
  return absl::StrContains(op, "Random") || absl::StrContains(op, "random") ||
         absl::StrContains(op, "Multinomial") ||
         absl::StrContains(op, "Shuffle") ||
         absl::StrContains(op, "SeedGenerator") ||
         absl::StrContains(op, "TruncatedNormal");
}

bool ReadsVariable(absl::string_view op) {
  return op == "ReadVariableOp" || op == "VarHandleOp" ||
         op == "ResourceGather" || op == "ResourceGatherNd" ||
         op == "VariableV2" || op == "Variable" ||
         op == "VarIsInitializedOp" || op == "_ReadVariablesOp" ||
         op == "DestroyResourceOp";
}

bool IsPyFunction(absl::string_view op) {
  return op == "PyFunc" || op == "PyFuncStateless" || op == "EagerPyFunc";
}

// Tables that never change once made (and initialized).
bool IsImmutableTable(absl::string_view op) {
  return op == "HashTableV2" || op == "HashTable" ||
         op == "AnonymousHashTable";
}

bool IsMutableTable(absl::string_view op) {
  return absl::StrContains(op, "Mutable") && absl::StrContains(op, "Table");
}

// Which output of a node a function body's reference names: "node:out:i"
// (`out` an output argument of its op), "node:i" or "node".
struct Reference {
  std::string node;
  std::string out;
  int index = 0;
};

Reference ParseReference(const std::string& reference) {
  const std::vector<std::string> parts = absl::StrSplit(reference, ':');
  Reference r;
  r.node = parts[0];
  if (parts.size() == 2) {
    r.index = std::atoi(parts[1].c_str());
  } else if (parts.size() >= 3) {
    r.out = parts[1];
    r.index = std::atoi(parts[2].c_str());
  }
  return r;
}

// The integers a Const's value holds, and its shape.
bool ConstValue(const NodeDef& node, std::vector<int64_t>* shape,
                std::vector<int64_t>* ints, bool* ints_known) {
  *ints_known = false;
  const auto value = node.attr().find("value");
  if (value == node.attr().end()) return false;
  Tensor tensor;
  if (!tensor.FromProto(value->second.tensor())) return false;
  shape->clear();
  for (int d = 0; d < tensor.dims(); ++d) shape->push_back(tensor.dim_size(d));
  ints->clear();
  if (tensor.dtype() == DT_INT32) {
    for (int64_t i = 0; i < tensor.NumElements(); ++i) {
      ints->push_back(tensor.flat<int32>()(i));
    }
    *ints_known = true;
  } else if (tensor.dtype() == DT_INT64) {
    for (int64_t i = 0; i < tensor.NumElements(); ++i) {
      ints->push_back(tensor.flat<int64_t>()(i));
    }
    *ints_known = true;
  }
  return true;
}

// A shape attribute's dims, when its rank is known.
bool ShapeDims(const TensorShapeProto& proto, std::vector<int64_t>* dims) {
  if (proto.unknown_rank()) return false;
  dims->clear();
  for (const auto& dim : proto.dim()) dims->push_back(dim.size());
  return true;
}

Fact Rows(int rank) {
  Fact fact;
  fact.kind = Kind::kRows;
  fact.rank = rank;
  return fact;
}

Fact Batch() {
  Fact fact;
  fact.kind = Kind::kBatch;
  return fact;
}

Fact Fixed() { return Fact(); }

Fact FixedShape(std::vector<int64_t> shape) {
  Fact fact;
  fact.shape_known = true;
  fact.rank = static_cast<int>(shape.size());
  fact.shape = std::move(shape);
  return fact;
}

class Prover {
 public:
  explicit Prover(const FunctionDefLibrary& library) {
    for (const FunctionDef& f : library.function()) {
      functions_[f.signature().name()] = &f;
    }
  }

  // The facts of `name`'s outputs when called with `args`; refusals are
  // added to `refusals_`.
  std::vector<Fact> Call(const std::string& name,
                         const std::vector<Fact>& args, int depth) {
    const auto found = functions_.find(name);
    if (found == functions_.end() || depth > kMaxDepth) {
      Refuse(kUnknownOp, name, name, name,
             found == functions_.end() ? "is not in the library"
                                       : "calls functions nested too deep");
      return {};
    }
    Body body(this, *found->second, args, depth);
    return body.Returns();
  }

  bool Refused() const { return !refusals_.empty(); }

  // The strongest refusal; the first of those when several are as strong.
  const Refusal& Strongest() const {
    const Refusal* best = &refusals_.front();
    for (const Refusal& r : refusals_) {
      if (r.priority > best->priority) best = &r;
    }
    return *best;
  }

  void Refuse(int priority, const std::string& function,
              const std::string& node, const std::string& op,
              std::string reason) {
    refusals_.push_back({priority, function, node, op, std::move(reason)});
  }

  const FunctionDef* Function(const std::string& name) const {
    const auto found = functions_.find(name);
    return found == functions_.end() ? nullptr : found->second;
  }

  // Why `node` is not pure, or empty; with its priority.
  // Calls are checked where they are followed; a StatelessIf's branches
  // here, through `PureFunction`.
  std::string Impurity(const NodeDef& node, int depth, int* priority) {
    *priority = kNotPure;
    const std::string& op = node.op();
    if (Function(op) != nullptr || IsCallOp(op)) return "";
    if (op == "StatelessIf") {
      for (const std::string& branch : AttrFunctions(node)) {
        PureFunction(branch, depth + 1);
      }
      return "";
    }
    // Functions run by other ops (a stateful cond's branches, a nested
    // dataset's functions) are not followed.
    if (!AttrFunctions(node).empty()) return "runs functions not followed";
    if (IsPyFunction(op)) return "is a py_function";
    if (IsRandom(op)) return "is random";
    if (ReadsVariable(op)) return "reads a variable";
    if (StatefulAllowed(op) || op == "Assert") return "";
    const OpDef* op_def = nullptr;
    if (!OpRegistry::Global()->LookUpOpDef(op, &op_def).ok() ||
        op_def == nullptr) {
      return "is an unknown op";
    }
    return op_def->is_stateful() ? "is stateful" : "";
  }

  // Refuses every op of `name`, and of the functions it calls, that is not
  // pure; an assert or a table lookup there too.
  void PureFunction(const std::string& name, int depth) {
    const FunctionDef* f = Function(name);
    if (f == nullptr || depth > kMaxDepth) {
      Refuse(kNotPure, name, name, name,
             f == nullptr ? "is not in the library"
                          : "calls functions nested too deep");
      return;
    }
    for (const NodeDef& node : f->node_def()) {
      const std::string& op = node.op();
      std::string callee = Function(op) != nullptr ? op : "";
      if (IsCallOp(op)) {
        const auto attr = node.attr().find(kFunctionAttr);
        if (attr != node.attr().end()) callee = attr->second.func().name();
      }
      if (!callee.empty()) {
        PureFunction(callee, depth + 1);
        continue;
      }
      int priority = 0;
      std::string why = Impurity(node, depth, &priority);
      if (why.empty() && (StatefulAllowed(op) || op == "Assert")) {
        why = "is stateful";
      }
      if (!why.empty()) Refuse(priority, name, node.name(), op, why);
    }
  }

 private:
  // One function body's analysis.
  class Body {
   public:
    Body(Prover* prover, const FunctionDef& function,
         const std::vector<Fact>& args, int depth)
        : prover_(prover), function_(function), depth_(depth) {
      const auto& inputs = function.signature().input_arg();
      for (int i = 0; i < inputs.size(); ++i) {
        args_[inputs[i].name()] =
            i < static_cast<int>(args.size()) ? args[i] : Batch();
      }
      for (const NodeDef& node : function.node_def()) {
        nodes_[node.name()] = &node;
      }
    }

    std::vector<Fact> Returns() {
      // Every node first, used or not: an op that is not pure changes the
      // map wherever it is.
      for (const NodeDef& node : function_.node_def()) CheckPure(node);
      // An assert runs whether or not an output needs it.
      for (const NodeDef& node : function_.node_def()) {
        if (node.op() == "Assert") Outputs(node);
      }
      std::vector<Fact> returns;
      for (const auto& out : function_.signature().output_arg()) {
        const auto ret = function_.ret().find(out.name());
        if (ret == function_.ret().end()) {
          returns.push_back(Batch());
          continue;
        }
        returns.push_back(Resolve(ret->second));
      }
      // Calls not on the way to an output still run: their bodies too.
      for (const NodeDef& node : function_.node_def()) {
        if (prover_->Function(node.op()) != nullptr || IsCallOp(node.op())) {
          Outputs(node);
        }
      }
      return returns;
    }

   private:
    const std::string& Name() const { return function_.signature().name(); }

    void Refuse(int priority, const NodeDef& node, std::string reason) {
      prover_->Refuse(priority, Name(), node.name(), node.op(),
                      std::move(reason));
    }

    // Calls are followed when used; an assert's condition is checked in
    // `Returns`, a lookup's table where it is applied.
    void CheckPure(const NodeDef& node) {
      int priority = 0;
      std::string why = prover_->Impurity(node, depth_, &priority);
      if (!why.empty()) Refuse(priority, node, std::move(why));
    }

    // The fact of a reference of this body.
    Fact Resolve(const std::string& reference) {
      if (IsControlInput(reference)) return Fixed();
      const Reference r = ParseReference(reference);
      const auto arg = args_.find(r.node);
      if (r.out.empty() && r.index == 0 && arg != args_.end()) {
        return arg->second;
      }
      const auto node = nodes_.find(r.node);
      if (node == nodes_.end()) return Batch();
      const std::vector<Fact>& outputs = Outputs(*node->second);
      const int index = FlatIndex(*node->second, r.out, r.index);
      if (index < 0 || index >= static_cast<int>(outputs.size())) {
        return Batch();
      }
      return outputs[index];
    }

    // The index among all outputs of `node` of output `index` of its
    // output argument `out` (empty: counted over all outputs); -1 unknown.
    int FlatIndex(const NodeDef& node, const std::string& out, int index) {
      if (out.empty()) return index;
      if (const FunctionDef* f = prover_->Function(node.op())) {
        const auto& outs = f->signature().output_arg();
        for (int i = 0; i < outs.size(); ++i) {
          if (outs[i].name() == out) return i + index;
        }
        return -1;
      }
      const OpDef* op_def = nullptr;
      if (!OpRegistry::Global()->LookUpOpDef(node.op(), &op_def).ok()) {
        return -1;
      }
      int offset = 0;
      for (const auto& arg : op_def->output_arg()) {
        if (arg.name() == out) return offset + index;
        offset += ArgSize(node, arg);
      }
      return -1;
    }

    static int ArgSize(const NodeDef& node, const OpDef::ArgDef& arg) {
      if (!arg.number_attr().empty()) {
        const auto attr = node.attr().find(arg.number_attr());
        return attr == node.attr().end() ? 1
                                         : static_cast<int>(attr->second.i());
      }
      if (!arg.type_list_attr().empty()) {
        const auto attr = node.attr().find(arg.type_list_attr());
        return attr == node.attr().end() ? 1 : attr->second.list().type_size();
      }
      return 1;
    }

    // How many outputs `node` has; -1 when its op is unknown.
    int NumOutputs(const NodeDef& node) {
      if (const FunctionDef* f = prover_->Function(node.op())) {
        return f->signature().output_arg_size();
      }
      const OpDef* op_def = nullptr;
      if (!OpRegistry::Global()->LookUpOpDef(node.op(), &op_def).ok()) {
        return -1;
      }
      int n = 0;
      for (const auto& arg : op_def->output_arg()) n += ArgSize(node, arg);
      return n;
    }

    const std::vector<Fact>& Outputs(const NodeDef& node) {
      const auto memo = outputs_.find(node.name());
      if (memo != outputs_.end()) return memo->second;
      int n = NumOutputs(node);
      if (n < 0) n = 1;
      outputs_[node.name()] = std::vector<Fact>(n, Batch());  // a cycle
      std::vector<Fact> inputs;
      for (const std::string& input : node.input()) {
        if (!IsControlInput(input)) inputs.push_back(Resolve(input));
      }
      std::vector<Fact> outputs = Apply(node, inputs, n);
      outputs.resize(n, Batch());
      outputs_[node.name()] = std::move(outputs);
      return outputs_[node.name()];
    }

    // The facts of `node`'s `n` outputs from its inputs'.
    std::vector<Fact> Apply(const NodeDef& node,
                            const std::vector<Fact>& inputs, int n) {
      const std::string& op = node.op();
      const FunctionDef* called = prover_->Function(op);
      std::string callee;
      if (called != nullptr) {
        callee = op;
      } else if (IsCallOp(op)) {
        const auto f = node.attr().find(kFunctionAttr);
        if (f != node.attr().end()) callee = f->second.func().name();
      }
      if (!callee.empty()) return prover_->Call(callee, inputs, depth_ + 1);

      std::vector<Fact> special;
      if (Special(node, inputs, n, &special)) return special;
      bool any_rows = false;
      bool any_batch = false;
      for (const Fact& fact : inputs) {
        any_rows |= fact.kind == Kind::kRows;
        // What only `Special` knows is the batch's anywhere else.
        any_batch |= fact.kind != Kind::kRows && fact.kind != Kind::kFixed;
      }
      // A mask reads rows by their values: told first, even when its input
      // is already refused (boolean_mask reshapes the mask by the batch's
      // size first).
      if (op == "Where" && (any_rows || any_batch)) {
        Refuse(kDropsRows, node,
               "keeps a number of rows that depends on their values "
               "(a mask)");
        return std::vector<Fact>(n, Batch());
      }
      if (op == "LookupTableFindV2" || op == "LookupTableFind") {
        const std::string table =
            inputs.empty() ? "" : inputs[0].resource_op;
        if (!IsImmutableTable(table)) {
          Refuse(kNotPure, node,
                 IsMutableTable(table)
                     ? absl::StrCat("looks up a table that can change (",
                                    table, ")")
                     : std::string("looks up a table not known to be "
                                   "immutable"));
          return std::vector<Fact>(n, Batch());
        }
      }
      if (any_batch) return std::vector<Fact>(n, Batch());
      if (!any_rows) return FixedOutputs(node, inputs, n);
      std::string why;
      int priority = kUnknownOp;
      std::vector<Fact> out = RowOutputs(node, inputs, n, &why, &priority);
      if (!why.empty()) {
        Refuse(priority, node, std::move(why));
        return std::vector<Fact>(n, Batch());
      }
      return out;
    }

    static Fact SplitPart(const std::string& split, int part) {
      Fact fact;
      fact.kind = Kind::kSplit;
      fact.split = split;
      fact.split_part = part;
      return fact;
    }

    static bool IsPart(const Fact& fact, int part) {
      return fact.kind == Kind::kSplit && fact.split_part == part;
    }

    static bool IntsAre(const Fact& fact, const std::vector<int64_t>& ints) {
      std::vector<int64_t> got;
      return Ints(fact, &got) && got == ints;
    }

    // The asserts, the StatelessIf and the string split padded to a fixed
    // width (`tf.strings.split(lines).to_tensor(shape=[None, k])`, and its
    // `row_lengths()`), whose facts the other ops do not know: true when
    // `node` is one of them, its outputs' facts in `*out`.
    bool Special(const NodeDef& node, const std::vector<Fact>& inputs,
                 int n, std::vector<Fact>* out) {
      const std::string& op = node.op();
      if (op == "Assert") {
        if (inputs.empty() || (inputs[0].kind != Kind::kEveryRow &&
                               inputs[0].kind != Kind::kFixed)) {
          Refuse(kMixesRows, node,
                 "asserts a condition on the batch, not a check that every "
                 "row passes");
        }
        *out = std::vector<Fact>(n, Batch());
        return true;
      }
      if (op == "StatelessIf") {  // its branches were checked to be pure
        *out = std::vector<Fact>(n, Batch());
        return true;
      }
      if (op == "StringSplitV2" && n == 3 && inputs.size() == 2 &&
          inputs[0].kind == Kind::kRows && inputs[0].rank == 1 &&
          inputs[1].kind == Kind::kFixed) {
        *out = {SplitPart(node.name(), kSplitIndices),
                SplitPart(node.name(), kSplitValues),
                SplitPart(node.name(), kSplitShape)};
        return true;
      }
      bool any_special = false;
      for (const Fact& fact : inputs) {
        any_special |= fact.kind == Kind::kAnyRow ||
                       fact.kind == Kind::kEveryRow ||
                       fact.kind == Kind::kSplit;
      }
      if (!any_special) return false;
      *out = std::vector<Fact>(n, Batch());
      const Fact& first = inputs[0];
      if (n != 1) return true;
      if ((op == "Identity" || op == "Snapshot") && inputs.size() == 1) {
        (*out)[0] = first;
      } else if (op == "LogicalNot" && first.kind != Kind::kSplit) {
        (*out)[0] = first;
        (*out)[0].kind = first.kind == Kind::kAnyRow ? Kind::kEveryRow
                                                     : Kind::kAnyRow;
      } else if (op == "Cast" && (IsPart(first, kSplitRowIds) ||
                                  IsPart(first, kSplitRows))) {
        (*out)[0] = first;  // integers cast to integers
      } else if (op == "Reshape" && inputs.size() == 2 &&
                 IsPart(first, kSplitRowIds) && IntsAre(inputs[1], {-1})) {
        (*out)[0] = first;
      } else if (op == "StridedSlice" && inputs.size() == 4 &&
                 OthersFixed(inputs, 1)) {
        const SliceMasks m = Masks(node);
        const bool plain = m.ellipsis == 0 && m.new_axis == 0;
        // indices[:, 0]: each value's row.
        if (IsPart(first, kSplitIndices) && plain && m.begin == 1 &&
            m.end == 1 && m.shrink == 2 && IntsAre(inputs[1], {0, 0}) &&
            IntsAre(inputs[2], {0, 1}) && IntsAre(inputs[3], {1, 1})) {
          (*out)[0] = SplitPart(first.split, kSplitRowIds);
        }
        // shape[0]: how many rows.
        if (IsPart(first, kSplitShape) && plain && m.begin == 0 &&
            m.end == 0 && m.shrink == 1 && IntsAre(inputs[1], {0}) &&
            IntsAre(inputs[2], {1}) && IntsAre(inputs[3], {1})) {
          (*out)[0] = SplitPart(first.split, kSplitRows);
        }
      } else if (op == "Maximum" && inputs.size() == 2) {
        for (const Fact& fact : inputs) {
          if (IsPart(fact, kSplitRows)) {
            (*out)[0] = SplitPart(fact.split, kSplitAtLeastRows);
          }
        }
      } else if (op == "Minimum" && inputs.size() == 2) {
        // min(rows, max(rows, x)) is rows.
        for (int i = 0; i < 2; ++i) {
          if (IsPart(inputs[i], kSplitRows) &&
              IsPart(inputs[1 - i], kSplitAtLeastRows) &&
              inputs[i].split == inputs[1 - i].split) {
            (*out)[0] = inputs[i];
          }
        }
      } else if (op == "DenseBincount" && inputs.size() == 3) {
        // bincount(row ids, size=rows): each row's number of values.
        bool binary = false;
        const auto attr = node.attr().find("binary_output");
        if (attr != node.attr().end()) binary = attr->second.b();
        if (!binary && IsPart(first, kSplitRowIds) &&
            IsPart(inputs[1], kSplitRows) &&
            first.split == inputs[1].split &&
            inputs[2].kind == Kind::kFixed && inputs[2].shape_known &&
            inputs[2].shape == std::vector<int64_t>{0}) {
          (*out)[0] = Rows(1);
        }
      } else if (op == "RaggedTensorToTensor" && inputs.size() == 5) {
        // Each row's values, padded or cut to a fixed width.
        const auto types = node.attr().find("row_partition_types");
        const bool value_rowids =
            types != node.attr().end() &&
            types->second.list().s_size() == 2 &&
            types->second.list().s(0) == "FIRST_DIM_SIZE" &&
            types->second.list().s(1) == "VALUE_ROWIDS";
        std::vector<int64_t> shape;
        if (value_rowids && Ints(first, &shape) && shape.size() == 2 &&
            shape[0] == -1 && shape[1] >= 0 && IsPart(inputs[1], kSplitValues) &&
            inputs[2].kind == Kind::kFixed && inputs[2].rank == 0 &&
            IsPart(inputs[3], kSplitRows) && IsPart(inputs[4], kSplitRowIds) &&
            inputs[1].split == inputs[3].split &&
            inputs[1].split == inputs[4].split) {
          (*out)[0] = Rows(2);
        }
      }
      return true;
    }

    // Outputs of a node none of whose inputs depends on the batch: the same
    // for every batch (the shape is kept where it is plain to see).
    std::vector<Fact> FixedOutputs(const NodeDef& node,
                                   const std::vector<Fact>& inputs, int n) {
      std::vector<Fact> out(n, Fixed());
      const std::string& op = node.op();
      if (op == "Const" && n == 1) {
        std::vector<int64_t> shape;
        std::vector<int64_t> ints;
        bool ints_known = false;
        if (ConstValue(node, &shape, &ints, &ints_known)) {
          out[0] = FixedShape(shape);
          out[0].ints = std::move(ints);
          out[0].ints_known = ints_known;
        }
      } else if (n == 1 && op == "Range") {
        out[0].rank = 1;  // a vector, whatever its length
      } else if (n == 1 && inputs.size() == 1 &&
                 (op == "Identity" || op == "Snapshot")) {
        out[0] = inputs[0];
      } else if (n == 1 && inputs.size() == 1 && op == "Cast") {
        out[0] = inputs[0];
        out[0].resource_op.clear();
      } else if (n == static_cast<int>(inputs.size()) && op == "IdentityN") {
        out = inputs;
      } else if (n == 1 && inputs.size() == 1 &&
                 ElementWiseUnary().contains(op) && inputs[0].shape_known) {
        out[0] = FixedShape(inputs[0].shape);
      } else if (n == 1 && ElementWiseBroadcast().contains(op)) {
        std::vector<int64_t> shape;
        if (BroadcastShape(inputs, &shape)) out[0] = FixedShape(shape);
      }
      return out;
    }

    // The shape that broadcasting gives `inputs`, when all are known.
    static bool BroadcastShape(const std::vector<Fact>& inputs,
                               std::vector<int64_t>* shape) {
      shape->clear();
      for (const Fact& fact : inputs) {
        if (!fact.shape_known) return false;
        if (fact.shape.size() > shape->size()) {
          shape->insert(shape->begin(), fact.shape.size() - shape->size(), 1);
        }
        const size_t offset = shape->size() - fact.shape.size();
        for (size_t d = 0; d < fact.shape.size(); ++d) {
          int64_t& to = (*shape)[offset + d];
          if (to == 1) {
            to = fact.shape[d];
          } else if (fact.shape[d] != 1 && fact.shape[d] != to) {
            return false;
          }
        }
      }
      return true;
    }

    // The integers of a Fixed input that holds them (a Const's).
    static bool Ints(const Fact& fact, std::vector<int64_t>* ints) {
      if (fact.kind != Kind::kFixed || !fact.ints_known) return false;
      *ints = fact.ints;
      return true;
    }

    // An axis of a tensor of rank `rank` (-1: unknown) counted from 0; -1
    // when it cannot be known.
    static int64_t Axis(int64_t axis, int rank) {
      if (axis >= 0) return axis;
      if (rank < 0) return -1;
      return axis + rank;
    }

    static bool IntAttr(const NodeDef& node, const std::string& name,
                        int64_t* value) {
      const auto attr = node.attr().find(name);
      if (attr == node.attr().end()) return false;
      *value = attr->second.i();
      return true;
    }

    // A StridedSlice's masks.
    struct SliceMasks {
      int64_t begin = 0;
      int64_t end = 0;
      int64_t ellipsis = 0;
      int64_t new_axis = 0;
      int64_t shrink = 0;
    };

    static SliceMasks Masks(const NodeDef& node) {
      SliceMasks m;
      IntAttr(node, "begin_mask", &m.begin);
      IntAttr(node, "end_mask", &m.end);
      IntAttr(node, "ellipsis_mask", &m.ellipsis);
      IntAttr(node, "new_axis_mask", &m.new_axis);
      IntAttr(node, "shrink_axis_mask", &m.shrink);
      return m;
    }

    // The outputs of `node`, some of whose inputs are rows (and none
    // refused); `*why` set when it is not proven row-wise.
    std::vector<Fact> RowOutputs(const NodeDef& node,
                                 const std::vector<Fact>& inputs, int n,
                                 std::string* why, int* priority) {
      const std::string& op = node.op();
      const Fact& first = inputs[0];
      if (ElementWiseUnary().contains(op) && inputs.size() == 1 && n == 1) {
        return {Rows(first.rank)};
      }
      if (op == "IdentityN" && n == static_cast<int>(inputs.size())) {
        return inputs;
      }
      if (ElementWiseBroadcast().contains(op) && n == 1) {
        int rank = -1;
        *why = Broadcast(inputs, &rank);
        return {Rows(rank)};
      }
      if (op == "ParseExampleV2" || op == "ParseExample") {
        return ParseExample(node, inputs, n, why, priority);
      }
      if (op == "DecodeCSV") {
        if (first.kind != Kind::kRows || !OthersFixed(inputs, 1)) {
          *why = "decodes records that are not the batch's rows";
          return {};
        }
        return std::vector<Fact>(n, Rows(first.rank));
      }
      if (op == "OneHot") {
        int64_t axis = -1;
        IntAttr(node, "axis", &axis);
        if (first.kind != Kind::kRows || !OthersFixed(inputs, 1)) {
          *why = "takes its depth or values from the rows";
          return {};
        }
        if (axis == 0 || axis < -1) {
          *why = "puts its one-hot axis before the batch axis";
          *priority = kMixesRows;
          return {};
        }
        return {Rows(first.rank < 0 ? -1 : first.rank + 1)};
      }
      if (op == "LookupTableFindV2" || op == "LookupTableFind") {
        // The table was checked; hash tables hold scalar values.
        if (inputs.size() != 3 || inputs[1].kind != Kind::kRows ||
            inputs[2].kind != Kind::kFixed || inputs[2].rank != 0) {
          *why = "looks up keys that are not the batch's rows, or with a "
                 "default that is not a scalar";
          return {};
        }
        return {Rows(inputs[1].rank)};
      }
      if (op == "ExpandDims" && inputs.size() == 2) {
        std::vector<int64_t> axis;
        if (first.kind != Kind::kRows || !Ints(inputs[1], &axis) ||
            axis.size() != 1) {
          *why = "adds an axis not known";
          return {};
        }
        const int64_t at = axis[0] < 0 && first.rank >= 0
                               ? axis[0] + first.rank + 1
                               : axis[0];
        if (at < 1) {
          *why = "adds an axis before the batch axis";
          *priority = kMixesRows;
          return {};
        }
        return {Rows(first.rank < 0 ? -1 : first.rank + 1)};
      }
      if (op == "Squeeze") {
        const auto dims = node.attr().find("squeeze_dims");
        if (dims == node.attr().end() || dims->second.list().i_size() == 0) {
          *why = "squeezes every axis of size 1, the batch axis of a "
                 "batch of one row too";
          *priority = kMixesRows;
          return {};
        }
        for (const int64_t dim : dims->second.list().i()) {
          if (Axis(dim, first.rank) < 1) {
            *why = "squeezes the batch axis";
            *priority = kMixesRows;
            return {};
          }
        }
        return {Rows(first.rank < 0 ? -1
                                    : first.rank -
                                          dims->second.list().i_size())};
      }
      if (IsReduction(op) || op == "ArgMax" || op == "ArgMin") {
        std::vector<int64_t> axes;
        if (first.kind != Kind::kRows || inputs.size() != 2 ||
            !Ints(inputs[1], &axes)) {
          *why = "reduces over axes not known";
          return {};
        }
        std::unordered_set<int64_t> resolved;
        for (const int64_t axis : axes) {
          const int64_t a = Axis(axis, first.rank);
          if (a < 0) {
            *why = "reduces over an axis not known";
            return {};
          }
          resolved.insert(a);
        }
        if (resolved.count(0) > 0) {
          // Whether some row, or every row, passes a check: fit for an
          // assert.
          if ((op == "Any" || op == "All") && first.rank > 0 &&
              static_cast<int>(resolved.size()) == first.rank &&
              *std::max_element(resolved.begin(), resolved.end()) <
                  first.rank) {
            Fact fact;
            fact.kind = op == "Any" ? Kind::kAnyRow : Kind::kEveryRow;
            fact.rank = 0;
            return {fact};
          }
          *why = "reduces over the batch axis";
          *priority = kMixesRows;
          return {};
        }
        bool keep_dims = false;
        const auto keep = node.attr().find("keep_dims");
        if (keep != node.attr().end()) keep_dims = keep->second.b();
        if (op == "ArgMax" || op == "ArgMin") {
          keep_dims = false;
          if (axes.size() != 1) {
            *why = "reduces over axes not known";
            return {};
          }
        }
        const int rank =
            first.rank < 0 || keep_dims
                ? first.rank
                : first.rank - static_cast<int>(resolved.size());
        if (rank == 0) {
          *why = "reduces every axis";
          *priority = kMixesRows;
          return {};
        }
        return {Rows(rank)};
      }
      if (op == "ConcatV2" && inputs.size() >= 2) {
        std::vector<int64_t> axis;
        const Fact& last = inputs.back();
        if (!Ints(last, &axis) || axis.size() != 1 || first.rank < 0) {
          *why = "concatenates along an axis not known";
          return {};
        }
        for (size_t i = 0; i + 1 < inputs.size(); ++i) {
          if (inputs[i].kind != Kind::kRows ||
              inputs[i].rank != first.rank) {
            *why = "concatenates the rows with a tensor that is not per row";
            *priority = kMixesRows;
            return {};
          }
        }
        if (Axis(axis[0], first.rank) < 1) {
          *why = "concatenates along the batch axis";
          *priority = kMixesRows;
          return {};
        }
        return {Rows(first.rank)};
      }
      if (op == "Pack") {
        int64_t axis = 0;
        IntAttr(node, "axis", &axis);
        for (const Fact& fact : inputs) {
          if (fact.kind != Kind::kRows || fact.rank != first.rank ||
              fact.rank < 0) {
            *why = "stacks the rows with a tensor that is not per row";
            *priority = kMixesRows;
            return {};
          }
        }
        if (Axis(axis, first.rank + 1) < 1) {
          *why = "stacks along the batch axis";
          *priority = kMixesRows;
          return {};
        }
        return {Rows(first.rank + 1)};
      }
      if (op == "Unpack") {
        int64_t axis = 0;
        IntAttr(node, "axis", &axis);
        if (first.rank < 0 || Axis(axis, first.rank) < 1) {
          *why = "unstacks along the batch axis";
          *priority = kMixesRows;
          return {};
        }
        return std::vector<Fact>(n, Rows(first.rank - 1));
      }
      if (op == "StridedSlice" && inputs.size() == 4) {
        return StridedSlice(node, inputs, why);
      }
      if (op == "GatherV2" && inputs.size() == 3) {
        int64_t batch_dims = 0;
        IntAttr(node, "batch_dims", &batch_dims);
        const Fact& params = first;
        const Fact& indices = inputs[1];
        std::vector<int64_t> axis;
        if (batch_dims == 0 && params.rank > 0 && indices.rank >= 0 &&
            Ints(inputs[2], &axis) && axis.size() == 1) {
          const int64_t a = Axis(axis[0], params.rank);
          const int rank = params.rank + indices.rank - 1;
          // table[ids]: a fixed table looked up by each row's ids.
          if (params.kind == Kind::kFixed && indices.kind == Kind::kRows &&
              a == 0 && indices.rank > 0) {
            return {Rows(rank)};
          }
          // rows[:, ids]: fixed positions within each row.
          if (params.kind == Kind::kRows && indices.kind == Kind::kFixed &&
              a >= 1) {
            return {Rows(rank)};
          }
        }
      }
      if (op == "DecodePaddedRaw" && inputs.size() == 2 &&
          first.kind == Kind::kRows && first.rank >= 0 &&
          inputs[1].kind == Kind::kFixed) {
        return {Rows(first.rank + 1)};
      }
      if (op == "GatherV2" || op == "Gather" || op == "GatherNd" ||
          op == "ResourceGather") {
        *why = "gathers by index across the rows";
        *priority = kMixesRows;
        return {};
      }
      if (op == "Shape" || op == "ShapeN" || op == "Size") {
        *why = "reads the batch's size";
        return {};
      }
      if (op == "SparseTensorDenseMatMul" || absl::StartsWith(op, "Sparse") ||
          absl::StartsWith(op, "Ragged") || op == "StringSplit" ||
          op == "StringSplitV2") {
        *why = "gives a sparse or ragged output";
        *priority = kMixesRows;
        return {};
      }
      *why = "is not known to be row-wise";
      return {};
    }

    // Whether inputs from `from` on are all kFixed.
    static bool OthersFixed(const std::vector<Fact>& inputs, size_t from) {
      for (size_t i = from; i < inputs.size(); ++i) {
        if (inputs[i].kind != Kind::kFixed) return false;
      }
      return true;
    }

    // Why element-wise `inputs` (rows among them) may mix rows when
    // broadcast, or empty; `*rank` the result's rank.
    static std::string Broadcast(const std::vector<Fact>& inputs, int* rank) {
      *rank = -1;
      for (const Fact& fact : inputs) {
        if (fact.kind != Kind::kRows) continue;
        if (fact.rank < 1) return "combines rows of a rank not known";
        if (*rank >= 0 && fact.rank != *rank) {
          return "combines rows of different ranks, which broadcasting "
                 "aligns across the batch axis";
        }
        *rank = fact.rank;
      }
      for (const Fact& fact : inputs) {
        if (fact.kind == Kind::kRows) continue;
        if (fact.rank >= 0 && fact.rank < *rank) continue;
        if (fact.shape_known && fact.rank == *rank && fact.shape[0] == 1) {
          continue;
        }
        if (!fact.shape_known && fact.rank < 0) {
          return "broadcasts a tensor of a shape not known against the rows";
        }
        return "broadcasts a tensor against the batch axis";
      }
      return "";
    }

    std::vector<Fact> ParseExample(const NodeDef& node,
                                   const std::vector<Fact>& inputs, int n,
                                   std::string* why, int* priority) {
      const bool v2 = node.op() == "ParseExampleV2";
      int64_t sparse = 0;
      IntAttr(node, v2 ? "num_sparse" : "Nsparse", &sparse);
      const auto ragged = node.attr().find("ragged_value_types");
      const bool any_ragged =
          ragged != node.attr().end() && ragged->second.list().type_size() > 0;
      if (sparse > 0 || any_ragged) {
        *why = sparse > 0 ? "gives a sparse output (a variable-length "
                            "feature)"
                          : "gives a ragged output";
        *priority = kMixesRows;
        return {};
      }
      if (inputs[0].kind != Kind::kRows || inputs[0].rank != 1) {
        *why = "parses records that are not a vector of the batch's rows";
        return {};
      }
      for (size_t i = 1; i < inputs.size(); ++i) {
        // `names` (input 1) may be one per row; keys and defaults are fixed.
        if (inputs[i].kind == Kind::kFixed) continue;
        if (i == 1 && inputs[i].kind == Kind::kRows) continue;
        *why = "takes its keys or defaults from the rows";
        return {};
      }
      std::vector<Fact> out;
      const auto shapes = node.attr().find("dense_shapes");
      if (shapes == node.attr().end() ||
          shapes->second.list().shape_size() != n) {
        *why = "has dense shapes not known";
        return {};
      }
      for (const TensorShapeProto& shape : shapes->second.list().shape()) {
        std::vector<int64_t> dims;
        if (!ShapeDims(shape, &dims) ||
            std::any_of(dims.begin(), dims.end(),
                        [](int64_t d) { return d < 0; })) {
          *why = "pads a variable-length feature to the batch's longest row";
          *priority = kMixesRows;
          return {};
        }
        out.push_back(Rows(1 + static_cast<int>(dims.size())));
      }
      return out;
    }

    // x[:, ...]: the batch axis whole, no ellipsis or new axis.
    static std::vector<Fact> StridedSlice(const NodeDef& node,
                                          const std::vector<Fact>& inputs,
                                          std::string* why) {
      const Fact& x = inputs[0];
      std::vector<int64_t> strides;
      const SliceMasks m = Masks(node);
      const int64_t shrink = m.shrink;
      if (x.kind != Kind::kRows || !OthersFixed(inputs, 1) ||
          !Ints(inputs[3], &strides) || strides.empty() || strides[0] != 1 ||
          (m.begin & 1) == 0 || (m.end & 1) == 0 || m.ellipsis != 0 ||
          m.new_axis != 0 || (shrink & 1) != 0 || x.rank < 0) {
        *why = "slices the batch axis, or in a way not known to keep it";
        return {};
      }
      int shrunk = 0;
      for (int64_t bits = shrink; bits != 0; bits >>= 1) shrunk += bits & 1;
      return {Rows(x.rank - shrunk)};
    }

    Prover* const prover_;
    const FunctionDef& function_;
    const int depth_;
    std::unordered_map<std::string, Fact> args_;
    std::unordered_map<std::string, const NodeDef*> nodes_;
    std::unordered_map<std::string, std::vector<Fact>> outputs_;
  };

  std::unordered_map<std::string, const FunctionDef*> functions_;
  std::vector<Refusal> refusals_;
};

bool IsMap(absl::string_view op) {
  return op == "MapDataset" || op == "ParallelMapDataset" ||
         op == "ParallelMapDatasetV2";
}

bool IsBatch(absl::string_view op) {
  return op == "BatchDataset" || op == "BatchDatasetV2" ||
         op == "ParallelBatchDataset";
}

bool IsShuffleOp(absl::string_view op) {
  return op == "ShuffleDataset" || op == "ShuffleDatasetV2" ||
         op == "ShuffleDatasetV3";
}


// The producer of a top-level reference, through Identity.
const NodeDef* Producer(
    const std::unordered_map<std::string, const NodeDef*>& nodes,
    const std::string& reference) {
  std::unordered_set<std::string> seen;
  auto found = nodes.find(InputName(reference));
  while (found != nodes.end() && found->second->op() == "Identity" &&
         found->second->input_size() > 0 &&
         seen.insert(found->first).second) {
    found = nodes.find(InputName(found->second->input(0)));
  }
  return found == nodes.end() ? nullptr : found->second;
}

// The first data input of a dataset node, or null.
const NodeDef* DatasetInput(
    const std::unordered_map<std::string, const NodeDef*>& nodes,
    const NodeDef& node) {
  const std::vector<int> inputs = DataInputs(node);
  if (inputs.empty()) return nullptr;
  const auto found = nodes.find(InputName(node.input(inputs[0])));
  return found == nodes.end() ? nullptr : found->second;
}

RowWiseProof Refused(const std::string& function, const std::string& node,
                     const std::string& op, std::string reason) {
  RowWiseProof proof;
  proof.ok = false;
  proof.function = function;
  proof.node = node;
  proof.op = op;
  proof.reason = std::move(reason);
  return proof;
}

}  // namespace row_wise_proof

std::string RowWiseProof::Describe() const {
  if (ok) return "";
  std::string where;
  if (!function.empty() && function != node) {
    where = absl::StrCat(" in ", function);
  }
  return absl::StrCat(node, " (", op, ")", where, " ", reason);
}

RowWiseProof ProveRowWise(const FunctionDefLibrary& library,
                          const std::string& function,
                          const std::vector<RowWiseArg>& args) {
  row_wise_proof::Prover prover(library);
  const FunctionDef* f = prover.Function(function);
  if (f == nullptr) {
    return row_wise_proof::Refused(function, function, function,
                                   "is not in the library");
  }
  const std::vector<row_wise_proof::Fact> returns =
      prover.Call(function, args, 0);
  if (prover.Refused()) {
    const row_wise_proof::Refusal& r = prover.Strongest();
    return row_wise_proof::Refused(r.function, r.node, r.op, r.reason);
  }
  const auto& outs = f->signature().output_arg();
  for (int i = 0; i < outs.size() && i < static_cast<int>(returns.size());
       ++i) {
    if (returns[i].kind == row_wise_proof::Kind::kRows) continue;
    const auto ret = f->ret().find(outs[i].name());
    std::string node = ret == f->ret().end()
                           ? outs[i].name()
                           : row_wise_proof::ParseReference(ret->second).node;
    // The node that made it, through Identity.
    std::string op = "argument";
    std::unordered_set<std::string> seen;
    for (bool again = true; again && seen.insert(node).second;) {
      again = false;
      for (const NodeDef& n : f->node_def()) {
        if (n.name() != node) continue;
        op = n.op();
        if ((op == "Identity" || op == "Snapshot") && n.input_size() > 0 &&
            !IsControlInput(n.input(0))) {
          node = row_wise_proof::ParseReference(n.input(0)).node;
          op = "argument";
          again = true;
        }
        break;
      }
    }
    return row_wise_proof::Refused(
        function, node, op,
        op == "StatelessIf"
            ? "runs functions whose outputs are not followed (a cond may "
              "only make an assert's message)"
            : "gives an output without a row per input row");
  }
  if (returns.empty()) {
    return row_wise_proof::Refused(function, function, function,
                                   "gives no output");
  }
  return RowWiseProof();
}

RowWiseProof ProveMapRowWise(const GraphDef& graph, const NodeDef& map,
                             const NodeDef& batch) {
  const auto deterministic = map.attr().find("deterministic");
  if (deterministic != map.attr().end()) {
    const std::string& value = deterministic->second.s();
    if (value == "false" ||
        (value == "default" && OptionsDropOrder(graph))) {
      return row_wise_proof::Refused(
          "", map.name(), map.op(),
          value == "false" ? "has deterministic=False: its batches may come "
                             "in another order"
                           : "follows options.deterministic=False: its "
                             "batches may come in another order");
    }
  }
  const auto f = map.attr().find(kFunctionAttr);
  if (f == map.attr().end()) {
    return row_wise_proof::Refused("", map.name(), map.op(),
                                   "names no function");
  }
  const std::string& name = f->second.func().name();
  const FunctionDef* function = nullptr;
  for (const FunctionDef& candidate : graph.library().function()) {
    if (candidate.signature().name() == name) function = &candidate;
  }
  if (function == nullptr) {
    return row_wise_proof::Refused("", map.name(), map.op(),
                   absl::StrCat("calls ", name, ", not in the library"));
  }
  const auto captured = map.attr().find("Targuments");
  const int num_captured =
      captured == map.attr().end() ? 0 : captured->second.list().type_size();
  const int components =
      function->signature().input_arg_size() - num_captured;
  const auto shapes = batch.attr().find(kOutputShapes);
  if (shapes == batch.attr().end() ||
      shapes->second.list().shape_size() != components || components < 1) {
    return row_wise_proof::Refused("", map.name(), map.op(),
                   "reads batches whose components are not known");
  }
  std::unordered_map<std::string, const NodeDef*> nodes;
  for (const NodeDef& node : graph.node()) nodes[node.name()] = &node;
  std::vector<RowWiseArg> args;
  for (const TensorShapeProto& shape : shapes->second.list().shape()) {
    std::vector<int64_t> dims;
    args.push_back(
        row_wise_proof::Rows(row_wise_proof::ShapeDims(shape, &dims)
                                 ? static_cast<int>(dims.size())
                                 : -1));
  }
  // The captured inputs: the map's data inputs after its dataset.
  const std::vector<int> inputs = DataInputs(map);
  for (int i = 0; i < num_captured; ++i) {
    RowWiseArg arg;
    if (static_cast<size_t>(i + 1) < inputs.size()) {
      const NodeDef* producer =
          row_wise_proof::Producer(nodes, map.input(inputs[i + 1]));
      if (producer != nullptr) {
        arg.resource_op = producer->op();
        std::vector<int64_t> shape;
        std::vector<int64_t> ints;
        bool ints_known = false;
        const auto attr = producer->attr().find("shape");
        if (producer->op() == "Const" &&
            row_wise_proof::ConstValue(*producer, &shape, &ints, &ints_known)) {
          arg = row_wise_proof::FixedShape(shape);
          arg.ints = std::move(ints);
          arg.ints_known = ints_known;
        } else if (producer->op() == "Placeholder" &&
                   attr != producer->attr().end() &&
                   row_wise_proof::ShapeDims(attr->second.shape(), &shape) &&
                   std::none_of(shape.begin(), shape.end(),
                                [](int64_t d) { return d < 0; })) {
          arg = row_wise_proof::FixedShape(shape);
          arg.resource_op = producer->op();
        }
      }
    }
    args.push_back(std::move(arg));
  }
  return ProveRowWise(graph.library(), name, args);
}

std::string RowWiseChain::Describe() const {
  if (!found) return "";
  const std::string after =
      absl::StrCat("after shuffle ", shuffle, " and batch ", batch);
  if (refused.ok) {
    return absl::StrCat(maps.size() == 1 ? "the map " : "the maps ", after,
                        maps.size() == 1 ? " is" : " are", " row-wise (",
                        absl::StrJoin(maps, ", "),
                        "): a candidate for a row store");
  }
  std::string proven;
  if (row_wise > 0) {
    const std::vector<std::string> below(maps.begin(),
                                         maps.begin() + row_wise);
    proven = absl::StrCat(" (", absl::StrJoin(below, ", "),
                          row_wise == 1 ? " below it is" : " below it are",
                          ")");
  }
  return absl::StrCat("the map ", refused_map, " (", refused_map_op, ") ",
                      after, " is not row-wise", proven, ": ",
                      refused.Describe());
}

bool IsPassThrough(absl::string_view op) {
  return op == "OptionsDataset" || op == "ModelDataset" ||
         op == kPrefetchOp || op == "MaxIntraOpParallelismDataset" ||
         op == "PrivateThreadPoolDataset" || op == "AssertCardinalityDataset" ||
         op == kUntrackedOp || op == kBufferReleaseOp || op == kCacheOp;
}

RowWiseChain FindRowWiseChain(const GraphDef& graph,
                              const std::string& output) {
  RowWiseChain chain;
  std::unordered_map<std::string, const NodeDef*> nodes;
  for (const NodeDef& node : graph.node()) nodes[node.name()] = &node;
  // The path from the output down each dataset's first input.
  std::vector<const NodeDef*> path;
  std::unordered_set<std::string> seen;
  const auto start = nodes.find(output);
  for (const NodeDef* node = start == nodes.end() ? nullptr : start->second;
       node != nullptr && seen.insert(node->name()).second;
       node = row_wise_proof::DatasetInput(nodes, *node)) {
    path.push_back(node);
  }
  for (size_t b = 0; b < path.size(); ++b) {
    if (!row_wise_proof::IsBatch(path[b]->op())) continue;
    size_t s = b + 1;
    while (s < path.size() && IsPassThrough(path[s]->op())) ++s;
    if (s >= path.size() || !row_wise_proof::IsShuffleOp(path[s]->op())) {
      continue;
    }
    // The maps above the batch, from it up.
    std::vector<const NodeDef*> maps;
    for (size_t m = b; m-- > 0;) {
      if (row_wise_proof::IsMap(path[m]->op())) {
        maps.push_back(path[m]);
      } else if (!IsPassThrough(path[m]->op())) {
        break;
      }
    }
    if (maps.empty()) return chain;
    chain.found = true;
    chain.shuffle = path[s]->name();
    chain.batch = path[b]->name();
    for (const NodeDef* map : maps) chain.maps.push_back(map->name());
    for (const NodeDef* map : maps) {
      // Each map's batches are the previous map's outputs, row-wise: their
      // shapes are the previous map's.
      const NodeDef* input = chain.row_wise == 0 ? path[b] : maps[
          chain.row_wise - 1];
      RowWiseProof proof = ProveMapRowWise(graph, *map, *input);
      if (!proof.ok) {
        chain.refused_map = map->name();
        chain.refused_map_op = map->op();
        chain.refused = std::move(proof);
        return chain;
      }
      ++chain.row_wise;
    }
    return chain;
  }
  return chain;
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
