// Whether a map over batches is row-wise and deterministic: row i of each of
// its outputs depends only on row i of its inputs, and each output has as
// many rows as its input. Proven from the ops of the map's function against
// a list of ops known to be row-wise; anything else is refused, naming the
// op. FindCachePoint (passes.h) reports, for a `shuffle -> batch -> maps`
// chain above its point, whether the chain's maps are row-wise. Nothing
// here changes a graph.
#ifndef INTUNE_TF_REWRITES_ROW_WISE_H_
#define INTUNE_TF_REWRITES_ROW_WISE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

// What the proof concluded: `ok`, or the node that fails it (in `function`,
// the map's function or one it calls), its op and why.
struct RowWiseProof {
  bool ok = true;
  std::string function;
  std::string node;
  std::string op;
  std::string reason;

  // "<node> (<op>) in <function> <reason>"; empty when ok.
  std::string Describe() const;
};

// What is known of an argument of a function the proof reads.
struct RowWiseArg {
  enum class Kind {
    kRows,   // a component of the batch: its axis 0 holds the rows
    kFixed,  // the same for every row and every batch (a captured tensor)
    kBatch,  // depends on the batch, not row by row (refused already)
    // Known only inside a function:
    kAnyRow,    // a scalar: whether a per-row predicate holds for some row
    kEveryRow,  // a scalar: whether it holds for every row
    kSplit,     // a part of `StringSplitV2` over the rows (`split_part`)
  };
  Kind kind = Kind::kFixed;
  // Its rank, -1 when not known.
  int rank = -1;
  // kFixed: its shape, when known (`shape_known`).
  bool shape_known = false;
  std::vector<int64_t> shape;
  // kFixed integers: their values, when known (`ints_known`), for axes.
  bool ints_known = false;
  std::vector<int64_t> ints;
  // kFixed resources: the op that made the resource in the graph (after
  // Identity), e.g. "HashTableV2"; empty when not known.
  std::string resource_op;
  // kSplit: the StringSplitV2 node, and which part of its result:
  // kSplitIndices, kSplitValues, kSplitShape (its outputs), kSplitRowIds
  // (indices[:, 0]), kSplitRows (shape[0]), kSplitAtLeastRows (a maximum of
  // kSplitRows and anything).
  std::string split;
  int split_part = 0;
};

inline constexpr int kSplitIndices = 0;
inline constexpr int kSplitValues = 1;
inline constexpr int kSplitShape = 2;
inline constexpr int kSplitRowIds = 3;
inline constexpr int kSplitRows = 4;
inline constexpr int kSplitAtLeastRows = 5;

// Proves that `function` of `library`, called with `args`, gives each of
// its outputs row by row. Refuses random ops, stateful ops (but lookups of
// immutable tables, and asserts that every row passes a check), variables,
// py_function, ops not on the list, ops of the list used where they would
// mix rows (a reduction over axis 0, a broadcast against a tensor of as
// many or more axes, an axis put before the batch's), sparse or ragged
// outputs (a string split padded to a fixed width is row-wise), and outputs
// without a row per input row. Calls (PartitionedCall,
// StatefulPartitionedCall, a library function as an op) are followed, up
// to 8 deep; a StatelessIf's branches only for purity: its outputs are the
// batch's, fit only for an assert's message.
RowWiseProof ProveRowWise(const FunctionDefLibrary& library,
                          const std::string& function,
                          const std::vector<RowWiseArg>& args);

// The proof for `map` (MapDataset, ParallelMapDataset(V2)) of the top-level
// `graph`, over the batches of its input `batch` (a node of `graph` whose
// output_shapes give the components' ranks). The map's captured inputs are
// kFixed, with the shapes of their Const or Placeholder and the op of the
// resources they hold. A parallel map with deterministic=false is refused
// (its batches may come in another order).
RowWiseProof ProveMapRowWise(const GraphDef& graph, const NodeDef& map,
                             const NodeDef& batch);

// A `shuffle -> batch -> maps` chain of the top-level graph: from the
// output, down each dataset's first input, the first batch
// (BatchDataset(V2), ParallelBatchDataset) read from a shuffle, and the
// maps right above it, pass-throughs (prefetch, options, ...) skipped.
struct RowWiseChain {
  bool found = false;
  std::string shuffle;
  std::string batch;
  // The maps, from the batch up.
  std::vector<std::string> maps;
  // How many of `maps`, from the first, are proven row-wise; all of them
  // when `refused.ok`.
  int row_wise = 0;
  // The first map that fails, and its proof.
  std::string refused_map;
  std::string refused_map_op;
  RowWiseProof refused;

  bool ok() const { return found && refused.ok; }
  // What the cache's reason says of the chain; empty when not found:
  // "the maps after shuffle S and batch B are row-wise (M1, M2): a
  // candidate for a row store", or "the map M (op) after shuffle S and
  // batch B is not row-wise (M1 below it is): <proof>", the maps proven
  // row-wise below M in parentheses, if any.
  std::string Describe() const;
};

// Stages that give their input's elements as they are (a prefetch, options,
// InTune's cache and wrappers): a chain skips them.
bool IsPassThrough(absl::string_view op);

// The chain above `output` (the pipeline's output node) of `graph`.
RowWiseChain FindRowWiseChain(const GraphDef& graph,
                              const std::string& output);

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_REWRITES_ROW_WISE_H_
