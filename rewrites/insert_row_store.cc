// The pass insert_row_store (passes.h): the maps of a row-wise
// `shuffle -> batch -> maps` chain above the cache, wrapped so that a batch
// whose rows were stored in an earlier epoch is gathered instead of computed.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "intune_tf/cc/graph_walk.h"
#include "intune_tf/cc/op_names.h"
#include "rewrites/graph_utils.h"
#include "rewrites/passes.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"
#include "tensorflow/core/lib/strings/proto_serialization.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/hash.h"

namespace tensorflow {
namespace intune {
namespace rewrites {
namespace {

inline constexpr char kIfOp[] = "If";
inline constexpr char kPlaceholderOp[] = "Placeholder";
inline constexpr char kCapturedTypesAttr[] = "Targuments";
inline constexpr char kPositionsArg[] = "positions";

bool IsParallelMap(absl::string_view op) {
  return op == "ParallelMapDataset" || op == "ParallelMapDatasetV2";
}

NodeDef* FirstInput(std::unordered_map<std::string, NodeDef*>& nodes,
                    const NodeDef& node) {
  const std::vector<int> inputs = DataInputs(node);
  if (inputs.empty()) return nullptr;
  const auto it = nodes.find(InputName(node.input(inputs[0])));
  return it == nodes.end() ? nullptr : it->second;
}

// The nodes from `top`'s input down to `bottom` (excluded), if every one
// passes its input's elements through (IsPassThrough, row_wise.h): they
// carry the positions as one more component; false when another stage is
// on the way.
bool PathDown(std::unordered_map<std::string, NodeDef*>& nodes, NodeDef* top,
              const std::string& bottom, std::vector<NodeDef*>* path) {
  std::unordered_set<std::string> seen;
  for (NodeDef* node = FirstInput(nodes, *top); node != nullptr;
       node = FirstInput(nodes, *node)) {
    if (node->name() == bottom) return true;
    if (!IsPassThrough(node->op()) || !seen.insert(node->name()).second) {
      return false;
    }
    path->push_back(node);
  }
  return false;
}

// Puts a scalar int64 (`batch_dim` < -1), or a vector of `batch_dim` (-1:
// unknown), before the node's output types and shapes.
Status AddPositions(int64_t batch_dim, NodeDef* node) {
  auto* attrs = node->mutable_attr();
  if (!attrs->contains(kOutputTypes) || !attrs->contains(kOutputShapes)) {
    return errors::InvalidArgument(node->name(), " (", node->op(),
                                   ") has no output types or shapes");
  }
  auto* types = (*attrs)[kOutputTypes].mutable_list()->mutable_type();
  types->Add(DT_INT64);
  std::rotate(types->rbegin(), types->rbegin() + 1, types->rend());
  auto* shapes = (*attrs)[kOutputShapes].mutable_list()->mutable_shape();
  TensorShapeProto shape;
  if (batch_dim >= -1) shape.add_dim()->set_size(batch_dim);
  *shapes->Add() = shape;
  std::rotate(shapes->rbegin(), shapes->rbegin() + 1, shapes->rend());
  return OkStatus();
}

// Dim 0 of the first output of a batch, -1 when not known.
int64_t BatchRows(const NodeDef& batch) {
  const auto it = batch.attr().find(kOutputShapes);
  if (it == batch.attr().end() || it->second.list().shape_size() == 0) {
    return -1;
  }
  const TensorShapeProto& shape = it->second.list().shape(0);
  if (shape.unknown_rank() || shape.dim_size() == 0) return -1;
  return shape.dim(0).size();
}

// A map of the chain, as the fused function calls it.
struct Map {
  NodeDef* node = nullptr;
  const FunctionDef* function = nullptr;
  // Its captured inputs (references) and their types.
  std::vector<std::string> captured;
  std::vector<DataType> captured_types;
  // Its data inputs after the captured ones (a parallel map's
  // num_parallel_calls), and its control inputs.
  std::vector<std::string> trailing;
  std::vector<std::string> control;
};

// Reads `node` as a map of the chain; empty when it cannot be wrapped, else
// why not.
std::string ReadMap(const std::unordered_map<std::string, NodeDef*>& nodes,
                    const std::unordered_map<std::string, const FunctionDef*>&
                        functions,
                    NodeDef* node, Map* map) {
  map->node = node;
  const auto f = node->attr().find(kFunctionAttr);
  if (f == node->attr().end()) return "it names no function";
  const auto function = functions.find(f->second.func().name());
  if (function == functions.end()) return "its function is not in the library";
  map->function = function->second;
  const auto types = node->attr().find(kCapturedTypesAttr);
  const int num_captured =
      types == node->attr().end() ? 0 : types->second.list().type_size();
  std::vector<std::string> data;
  for (const std::string& input : node->input()) {
    if (IsControlInput(input)) {
      map->control.push_back(input);
    } else {
      data.push_back(input);
    }
  }
  const int trailing = IsParallelMap(node->op()) ? 1 : 0;
  if (static_cast<int>(data.size()) != 1 + num_captured + trailing) {
    return "its inputs are not those of a map";
  }
  for (int i = 0; i < num_captured; ++i) {
    const std::string& input = data[1 + i];
    map->captured.push_back(input);
    map->captured_types.push_back(types->second.list().type(i));
    // A tensor passed by reference: its value is not in the graph, and so
    // not in the store's key.
    std::unordered_set<std::string> seen;
    auto producer = nodes.find(InputName(input));
    while (producer != nodes.end() && producer->second->op() == kIdentityOp &&
           producer->second->input_size() > 0 &&
           seen.insert(producer->first).second) {
      producer = nodes.find(InputName(producer->second->input(0)));
    }
    if (producer == nodes.end() || producer->second->op() == kPlaceholderOp) {
      return absl::StrCat("it captures ", input,
                          ", a tensor passed by reference");
    }
  }
  for (size_t i = 1 + num_captured; i < data.size(); ++i) {
    map->trailing.push_back(data[i]);
  }
  return "";
}

bool DenseTypes(const NodeDef& node) {
  const auto it = node.attr().find(kOutputTypes);
  if (it == node.attr().end()) return false;
  for (const int type : it->second.list().type()) {
    if (type == DT_VARIANT || type == DT_RESOURCE) return false;
  }
  return it->second.list().type_size() > 0;
}

// The store's key: a hash of the maps' functions (and those they call) and
// of the nodes they capture.
std::string StoreKey(const GraphDef& graph, const std::vector<Map>& maps,
                     const std::unordered_map<std::string, NodeDef*>& nodes) {
  std::unordered_map<std::string, const FunctionDef*> functions;
  for (const FunctionDef& f : graph.library().function()) {
    functions[f.signature().name()] = &f;
  }
  uint64_t h = Hash64("intune_row_store");
  std::vector<std::string> pending;
  std::unordered_set<std::string> seen;
  for (const Map& map : maps) {
    pending.push_back(map.function->signature().name());
    for (const std::string& input : map.captured) {
      const auto node = nodes.find(InputName(input));
      std::string bytes;
      if (node != nodes.end()) {
        SerializeToStringDeterministic(*node->second, &bytes);
      }
      h = Hash64Combine(h, Hash64(bytes));
    }
  }
  while (!pending.empty()) {
    const std::string name = pending.back();
    pending.pop_back();
    const auto function = functions.find(name);
    if (function == functions.end() || !seen.insert(name).second) continue;
    std::string bytes;
    SerializeToStringDeterministic(*function->second, &bytes);
    h = Hash64Combine(h, Hash64(bytes));
    for (const NodeDef& node : function->second->node_def()) {
      if (functions.count(node.op()) > 0) pending.push_back(node.op());
      for (std::string& called : AttrFunctions(node)) {
        pending.push_back(std::move(called));
      }
    }
  }
  return absl::StrCat(absl::Hex(h, absl::kZeroPad16));
}

void SetTypes(const std::vector<DataType>& types, AttrValue* value) {
  value->mutable_list()->clear_type();
  for (const DataType type : types) value->mutable_list()->add_type(type);
}

std::vector<DataType> OutputTypes(const NodeDef& node) {
  std::vector<DataType> types;
  for (const int type : node.attr().at(kOutputTypes).list().type()) {
    types.push_back(static_cast<DataType>(type));
  }
  return types;
}

// The functions of the wrapped map: F(positions, x..., captured...) =
// If(Has(positions), Gather(positions), Put(positions, fr(...f1(x)...))).
class Wrapper {
 public:
  Wrapper(const GraphDef& graph, std::vector<Map> maps, std::string key)
      : maps_(std::move(maps)), key_(std::move(key)) {
    for (const FunctionDef& f : graph.library().function()) {
      names_.insert(f.signature().name());
    }
    const OpDef& first = maps_[0].function->signature();
    const int components =
        first.input_arg_size() - static_cast<int>(maps_[0].captured.size());
    args_.push_back({kPositionsArg, DT_INT64});
    for (int i = 0; i < components; ++i) {
      args_.push_back({absl::StrCat("x", i), first.input_arg(i).type()});
    }
    for (size_t m = 0; m < maps_.size(); ++m) {
      for (size_t i = 0; i < maps_[m].captured.size(); ++i) {
        args_.push_back(
            {absl::StrCat("c", m, "_", i), maps_[m].captured_types[i]});
      }
    }
    const NodeDef& last = *maps_.back().node;
    out_types_ = OutputTypes(last);
    for (const TensorShapeProto& shape :
         last.attr().at(kOutputShapes).list().shape()) {
      TensorShapeProto row = shape;
      if (!row.unknown_rank() && row.dim_size() > 0) {
        row.mutable_dim()->erase(row.mutable_dim()->begin());
      }
      row_shapes_.push_back(row);
      out_shapes_.push_back(shape);
    }
  }

  // Adds the three functions to `library`; returns the name of the one the
  // map calls.
  std::string AddTo(FunctionDefLibrary* library) {
    const std::string base = maps_[0].function->signature().name();
    const std::string gather = Unique(absl::StrCat(base, "_intune_gather"));
    const std::string compute = Unique(absl::StrCat(base, "_intune_compute"));
    const std::string wrapped = Unique(absl::StrCat(base, "_intune_rows"));
    *library->add_function() = Gather(gather);
    *library->add_function() = Compute(compute);
    *library->add_function() = Wrapped(wrapped, gather, compute);
    return wrapped;
  }

  const std::vector<DataType>& out_types() const { return out_types_; }
  const std::vector<TensorShapeProto>& out_shapes() const {
    return out_shapes_;
  }

 private:
  struct Arg {
    std::string name;
    DataType type;
  };

  std::string Unique(const std::string& base) {
    std::string name = base;
    for (int i = 1; names_.count(name) > 0; ++i) {
      name = absl::StrCat(base, "_", i);
    }
    names_.insert(name);
    return name;
  }

  // A function of args_, returning out_types_ from `returns`.
  FunctionDef Signed(const std::string& name,
                     const std::vector<std::string>& returns) const {
    FunctionDef f;
    OpDef* signature = f.mutable_signature();
    signature->set_name(name);
    signature->set_is_stateful(true);
    for (const Arg& arg : args_) {
      OpDef::ArgDef* def = signature->add_input_arg();
      def->set_name(arg.name);
      def->set_type(arg.type);
    }
    for (size_t i = 0; i < out_types_.size(); ++i) {
      OpDef::ArgDef* def = signature->add_output_arg();
      def->set_name(absl::StrCat("out", i));
      def->set_type(out_types_[i]);
      (*f.mutable_ret())[def->name()] = returns[i];
    }
    return f;
  }

  void SetKeyAndTypes(NodeDef* node, bool with_types) const {
    (*node->mutable_attr())[kRowStoreKeyAttr].set_s(key_);
    if (with_types) {
      SetTypes(out_types_, &(*node->mutable_attr())[kRowStoreTypesAttr]);
    }
  }

  std::vector<std::string> Outputs(const std::string& node,
                                   const std::string& arg) const {
    std::vector<std::string> refs;
    for (size_t i = 0; i < out_types_.size(); ++i) {
      refs.push_back(absl::StrCat(node, ":", arg, ":", i));
    }
    return refs;
  }

  FunctionDef Gather(const std::string& name) const {
    FunctionDef f = Signed(name, Outputs("gather", "rows"));
    NodeDef* gather = f.add_node_def();
    gather->set_name("gather");
    gather->set_op(kRowStoreGatherOp);
    gather->add_input(kPositionsArg);
    SetKeyAndTypes(gather, /*with_types=*/true);
    auto* shapes =
        (*gather->mutable_attr())[kRowStoreShapesAttr].mutable_list();
    for (const TensorShapeProto& shape : row_shapes_) *shapes->add_shape() = shape;
    return f;
  }

  // Calls the maps' functions in turn, then stores the rows.
  FunctionDef Compute(const std::string& name) const {
    FunctionDef f = Signed(name, Outputs("put", "passed"));
    std::vector<std::string> values;
    const int components =
        maps_[0].function->signature().input_arg_size() -
        static_cast<int>(maps_[0].captured.size());
    for (int i = 0; i < components; ++i) values.push_back(absl::StrCat("x", i));
    for (size_t m = 0; m < maps_.size(); ++m) {
      const OpDef& signature = maps_[m].function->signature();
      NodeDef* call = f.add_node_def();
      call->set_name(absl::StrCat("call", m));
      call->set_op(signature.name());
      for (const std::string& value : values) call->add_input(value);
      for (size_t i = 0; i < maps_[m].captured.size(); ++i) {
        call->add_input(absl::StrCat("c", m, "_", i));
      }
      values.clear();
      for (const OpDef::ArgDef& out : signature.output_arg()) {
        values.push_back(absl::StrCat(call->name(), ":", out.name(), ":0"));
      }
    }
    NodeDef* put = f.add_node_def();
    put->set_name("put");
    put->set_op(kRowStorePutOp);
    put->add_input(kPositionsArg);
    for (const std::string& value : values) put->add_input(value);
    // After every call has ended, its side effects (an Assert) included:
    // the rows of a batch that raises are never stored.
    for (size_t m = 0; m < maps_.size(); ++m) {
      put->add_input(absl::StrCat("^call", m));
    }
    SetKeyAndTypes(put, /*with_types=*/true);
    return f;
  }

  FunctionDef Wrapped(const std::string& name, const std::string& gather,
                      const std::string& compute) const {
    FunctionDef f = Signed(name, Outputs("if", "output"));
    NodeDef* has = f.add_node_def();
    has->set_name("has");
    has->set_op(kRowStoreHasOp);
    has->add_input(kPositionsArg);
    SetKeyAndTypes(has, /*with_types=*/false);
    NodeDef* branch = f.add_node_def();
    branch->set_name("if");
    branch->set_op(kIfOp);
    branch->add_input("has:stored:0");
    std::vector<DataType> in_types;
    for (const Arg& arg : args_) {
      branch->add_input(arg.name);
      in_types.push_back(arg.type);
    }
    auto& attrs = *branch->mutable_attr();
    attrs["Tcond"].set_type(DT_BOOL);
    SetTypes(in_types, &attrs["Tin"]);
    SetTypes(out_types_, &attrs["Tout"]);
    attrs["then_branch"].mutable_func()->set_name(gather);
    attrs["else_branch"].mutable_func()->set_name(compute);
    auto* shapes = attrs["output_shapes"].mutable_list();
    for (const TensorShapeProto& shape : out_shapes_) *shapes->add_shape() = shape;
    return f;
  }

  const std::vector<Map> maps_;
  const std::string key_;
  std::unordered_set<std::string> names_;
  std::vector<Arg> args_;
  std::vector<DataType> out_types_;
  std::vector<TensorShapeProto> row_shapes_;
  std::vector<TensorShapeProto> out_shapes_;
};

}  // namespace

Status InsertRowStore(GraphDef* graph, const CachePoint& point,
                      const std::string& cache, std::string* told) {
  told->clear();
  const RowWiseChain& chain = point.row_wise;
  if (!chain.found || chain.row_wise == 0) return OkStatus();
  if (!point.unordered.empty()) {
    *told = "no row store: the rows below the shuffle change order";
    return OkStatus();
  }
  auto nodes = NodesByName(graph);
  const auto shuffle = nodes.find(chain.shuffle);
  const auto batch = nodes.find(chain.batch);
  if (shuffle == nodes.end() || batch == nodes.end()) {
    return errors::Internal("the chain's shuffle or batch is not in the graph");
  }
  // Unbatched: from the shuffle down to the cache, and the shuffle; batched:
  // the batch and what is between it and the first map.
  std::vector<NodeDef*> unbatched = {shuffle->second};
  if (!PathDown(nodes, shuffle->second, cache, &unbatched)) {
    *told = absl::StrCat("no row store: the shuffle ", chain.shuffle,
                         " does not read the cache");
    return OkStatus();
  }
  if (!PathDown(nodes, batch->second, chain.shuffle, &unbatched)) {
    return errors::Internal("the chain's batch does not read its shuffle");
  }
  std::unordered_map<std::string, const FunctionDef*> functions;
  for (const FunctionDef& f : graph->library().function()) {
    functions[f.signature().name()] = &f;
  }
  // The maps wrapped: the row-wise ones from the batch up, each reading the
  // one before, whose last one gives dense rows.
  std::vector<Map> maps;
  std::string refused;
  for (int i = 0; i < chain.row_wise; ++i) {
    const auto node = nodes.find(chain.maps[i]);
    if (node == nodes.end()) break;
    if (i > 0 && FirstInput(nodes, *node->second) != maps.back().node) break;
    Map map;
    refused = ReadMap(nodes, functions, node->second, &map);
    if (!refused.empty()) {
      refused = absl::StrCat(chain.maps[i], ": ", refused);
      break;
    }
    maps.push_back(std::move(map));
  }
  while (!maps.empty() && !DenseTypes(*maps.back().node)) maps.pop_back();
  if (maps.empty()) {
    *told = refused.empty()
                ? "no row store: the map's outputs are not dense tensors"
                : absl::StrCat("no row store: ", refused);
    return OkStatus();
  }
  std::vector<NodeDef*> batched = {batch->second};
  if (!PathDown(nodes, maps[0].node, chain.batch, &batched)) {
    return errors::Internal("the chain's first map does not read its batch");
  }
  const auto cache_node = nodes.find(cache);
  if (cache_node == nodes.end()) {
    return errors::Internal("cache ", cache, " is not in the graph");
  }

  const std::string key = StoreKey(*graph, maps, nodes);
  Wrapper wrapper(*graph, maps, key);
  const std::string function = wrapper.AddTo(graph->mutable_library());
  (*cache_node->second->mutable_attr())[kCacheRowStoreAttr].set_s(key);
  TF_RETURN_IF_ERROR(AddPositions(-2, cache_node->second));
  for (NodeDef* node : unbatched) TF_RETURN_IF_ERROR(AddPositions(-2, node));
  const int64_t batch_dim = BatchRows(*batch->second);
  for (NodeDef* node : batched) {
    TF_RETURN_IF_ERROR(AddPositions(batch_dim, node));
  }

  // The first map runs the wrapper, with every map's captured inputs; the
  // others go, and their consumers read it.
  NodeDef* first = maps[0].node;
  const std::string input = first->input(DataInputs(*first)[0]);
  std::vector<std::string> inputs = {input};
  std::vector<DataType> captured_types;
  std::vector<std::string> control;
  for (const Map& map : maps) {
    inputs.insert(inputs.end(), map.captured.begin(), map.captured.end());
    captured_types.insert(captured_types.end(), map.captured_types.begin(),
                          map.captured_types.end());
    control.insert(control.end(), map.control.begin(), map.control.end());
  }
  inputs.insert(inputs.end(), maps[0].trailing.begin(), maps[0].trailing.end());
  inputs.insert(inputs.end(), control.begin(), control.end());
  first->clear_input();
  for (const std::string& in : inputs) first->add_input(in);
  auto& attrs = *first->mutable_attr();
  attrs[kFunctionAttr].mutable_func()->set_name(function);
  attrs[kFunctionAttr].mutable_func()->clear_attr();
  SetTypes(captured_types, &attrs[kCapturedTypesAttr]);
  SetTypes(wrapper.out_types(), &attrs[kOutputTypes]);
  auto* shapes = attrs[kOutputShapes].mutable_list();
  shapes->clear_shape();
  for (const TensorShapeProto& shape : wrapper.out_shapes()) {
    *shapes->add_shape() = shape;
  }
  const std::string first_name = first->name();
  std::vector<std::string> names;
  for (const Map& map : maps) names.push_back(map.node->name());
  if (maps.size() > 1) {
    std::unordered_set<std::string> gone;
    for (size_t m = 1; m < maps.size(); ++m) gone.insert(maps[m].node->name());
    const std::string last = maps.back().node->name();
    for (NodeDef& node : *graph->mutable_node()) {
      for (std::string& in : *node.mutable_input()) {
        if (InputName(in) != last) continue;
        in = IsControlInput(in) ? absl::StrCat("^", first_name) : first_name;
      }
    }
    auto* all = graph->mutable_node();
    all->erase(std::remove_if(all->begin(), all->end(),
                              [&gone](const NodeDef& node) {
                                return gone.count(node.name()) > 0;
                              }),
               all->end());
  }
  *told = absl::StrCat(
      "a row store keeps the rows of ", absl::StrJoin(names, ", "),
      maps.size() > 1 ? absl::StrCat(" (run as one map, ", first_name, ")")
                      : "",
      " from the first epoch on");
  return OkStatus();
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
