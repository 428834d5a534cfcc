// The passes of RunPasses (rewrite.h), one per file. Each edits `graph` in
// place and returns an error, possibly after some edits, when the graph is
// not what it expects (RunPasses then keeps the graph from before the pass).
// `*structure_changed` is set to true when a pass adds or removes datasets;
// it is never reset. Only the top-level graph is rewritten, except by
// UntrackInner, which edits the functions that interleaves call.
#ifndef INTUNE_TF_REWRITES_PASSES_H_
#define INTUNE_TF_REWRITES_PASSES_H_

#include <cstdint>
#include <map>
#include <string>

#include "intune_tf/cc/cache_decision.h"
#include "rewrites/row_wise.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/platform/status.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

// Removes every IntuneRootDataset and IntuneOptionsDataset node (nested ones
// too): its consumers, the graph's _Retval and Grappler's Sink included, read
// its input 0 instead. Not a change of structure: both ops are transparent to
// iterator checkpoints.
Status StripRoots(GraphDef* graph);

// Makes AUTOTUNE stages (and, with `include_fixed`, fixed ones) register as
// knobs:
// - a PrefetchDataset on AUTOTUNE gets legacy_autotune=false: with the
//   legacy autotuner it grows its buffer by itself and (TF 2.16) does not
//   register a tunable buffer_size; and buffer_size_min >= 1, so that it
//   starts at one element as the legacy autotuner does (MakeBufferKnob);
// - with `include_fixed`, stages with a fixed positive value read a new
//   AUTOTUNE Const (a Const shared with other nodes is never changed in
//   place), and `fixed` gets the user's value by node name; prefetch(0)
//   stays as it is;
// - `deterministic` attributes are never touched, so ordering is kept;
// - functions (an interleave's inner datasets) are left alone: their stages
//   run per input element, and their knobs would come and go with it.
Status MakeTunable(bool include_fixed, GraphDef* graph,
                   std::map<std::string, int64_t>* fixed);

// Adds PrefetchDataset(AUTOTUNE, legacy_autotune=false, buffer_size_min=1),
// with the producer's output_types and output_shapes, after each parallel
// stage whose consumers are not all prefetches; every other consumer (the
// graph's _Retval included) reads the prefetch. Element order and values are
// unchanged.
Status InsertPrefetch(GraphDef* graph, bool* structure_changed);

// Wraps the dataset that each interleave's (or flat_map's) function returns
// in an IntuneUntrackedDataset, so that the per-element datasets run
// without the autotuning model: their iterators (a TextLineDataset and the
// zips, skips and repeats around it, one element per row) skip the
// per-element bookkeeping that the model costs, and the wrapper's single
// node in the model accounts for their time. Functions with a stage that
// holds elements (a knob stage, a prefetch, any parallel dataset), or that
// call one, are left alone, so that the budget guard still sees their
// buffers. When the function returns through one of Grappler's FakeSink
// Identities, the wrapper goes before the Identity, so that the function
// still returns it once RemoveFakeSinks maps the ret back to the Identity's
// input. Element values and order are unchanged.
Status UntrackInner(GraphDef* graph, bool* structure_changed);

// Lets each input of a top-level ParallelInterleaveDatasetV4 of records
// (every component of its elements a scalar: a text line, a serialized
// example) buffer `elements` results ahead instead of TF's default
// 2 * block_length + 1, which Dataset.interleave always uses. With TF's 3, an
// input's worker stops after three rows and is woken again for each row
// consumed: one thread hand-off per row. Only buffers still at TF's default
// are changed, and only upwards; interleaves inside functions are left as
// they are, and so are interleaves whose function does not return an
// IntuneUntrackedDataset (untrack_inner): that wrapper, given the
// interleave's `buffer_group`, and an IntuneBufferReleaseDataset put above
// the interleave let the budget guard bound the deeper buffers. Element
// values and order are unchanged.
Status RaiseInterleaveBuffers(int64_t elements, GraphDef* graph);

// Sets, in every OptionsDataset's serialized_options, autotune.enabled =
// false (no ModelDataset, no TF optimization loop, and so no static
// autotune_buffer_sizes rewrite, which runs only with autotune on) and
// optimization_options.inject_prefetch = false. The root op sets the same
// options on its own dataset, so a graph without OptionsDataset needs
// nothing here.
Status DisableTfAutotune(GraphDef* graph);

// The warm-start fingerprint: 16 hex digits of TF's Hash64 over the
// multiset of op types of the graph's nodes and its library's function
// nodes (so renamed tensors, new file paths and other constants of the same
// job match), not counting Grappler's Sink and FakeSink Identities. This is
// the one definition: intune_tf.warmstart.graph_fingerprint calls it through
// the IntuneRewriteGraph op.
std::string GraphFingerprint(const GraphDef& graph);

// Where the pipeline stops changing between epochs: the dataset node of the
// top-level graph, found from the output down each dataset's first input,
// whose elements are the same every epoch (it and everything it reads are
// pure functions of their inputs), with work below it worth caching.
// Impure: random ops (seeded or not, stateless too), ops that
// OpDef.is_stateful marks, py_function, a shuffle (reshuffled each epoch or
// seeded by its own generator), a repeat (the cache goes below it), dataset
// ops not known to repeat each epoch, and any of these inside a function a
// node calls. A graph that holds a cache of its own (cache(), snapshot, or
// InTune's) gets none, nor one with a global shuffle (it reads its input by
// index, which the cache does not serve).
// `decision`: placed above `decision.point`, with what ends the pure part;
// or declined, with no point, and why there is none.
// `unordered`: why the elements below the point may come in another order
// each epoch (empty when their order is fixed); the cache then serves only a
// whole epoch.
// `row_wise`: the `shuffle -> batch -> maps` chain above the point, if any
// (FindRowWiseChain in row_wise.h), and whether its maps are row-wise;
// `decision.reason` ends with what RowWiseChain::Describe says of it.
struct CachePoint {
  CacheDecision decision;
  // The cache's node, once InsertCache put it.
  std::string cache_node;
  std::string unordered;
  RowWiseChain row_wise;
};
CachePoint FindCachePoint(const GraphDef& graph);

// Puts an IntuneCacheDataset (kCacheOp) above FindCachePoint's node, if it
// placed one: every consumer of that node reads the cache instead. `*point`
// says where, or why nowhere. Element values and order are unchanged.
Status InsertCache(GraphDef* graph, CachePoint* point, bool* structure_changed);

// Where `point` (placed by InsertCache, its cache node `cache`) has a
// row-wise chain `shuffle -> batch -> maps` right above the cache (only
// pass-throughs between), with its rows in one order every epoch: the cache
// gives each element its position (kCacheRowStoreAttr), the stages up to the
// first map carry it as one more component (a vector once batched), and the
// first map calls, in place of its function, F(positions, x, captured) =
// If(IntuneRowStoreHas, IntuneRowStoreGather, IntuneRowStorePut(f(x))),
// where f runs the row-wise maps in turn (they read each other directly, and
// the last gives dense tensors; the others are removed, their consumers read
// the first). Maps that capture a tensor passed by reference (not in the
// graph, so not in the store's key) are not wrapped. `*told` says what was
// done, or why not ("" when there is no such chain). Element values, order
// and errors are unchanged.
Status InsertRowStore(GraphDef* graph, const CachePoint& point,
                      const std::string& cache, std::string* told);

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_REWRITES_PASSES_H_
