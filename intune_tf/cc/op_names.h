// The names that the rewrites (rewrites/) and the kernels
// (intune_tf/cc/kernels/, intune_tf/cc/ops/) share: InTune's ops, their
// attributes, and their nodes in the autotuning model. Both folders include
// this header; neither includes the other's for a name.
#ifndef INTUNE_TF_CC_OP_NAMES_H_
#define INTUNE_TF_CC_OP_NAMES_H_

namespace tensorflow {
namespace intune {

// The root of a tuned pipeline, and its former name, which graphs saved by
// earlier releases carry: still registered, with the same kernel, so that
// those graphs load and run.
inline constexpr char kRootOp[] = "IntuneRootDataset";
inline constexpr char kLegacyRootOp[] = "IntuneDataset";
// The option, carried in the graph (kernels/options_dataset_op.cc).
inline constexpr char kIntuneOptionsOp[] = "IntuneOptionsDataset";

// The wrapper that runs an interleave's per-element datasets without the
// autotuning model (kernels/untracked_dataset_op.cc), and the op above the
// interleave that lets the budget guard bound their buffers
// (kernels/buffer_release_dataset_op.cc). Both carry the buffer group they
// share; the release op carries the interleave's records per input.
inline constexpr char kUntrackedOp[] = "IntuneUntrackedDataset";
inline constexpr char kBufferReleaseOp[] = "IntuneBufferReleaseDataset";
inline constexpr char kBufferGroupAttr[] = "buffer_group";
inline constexpr char kRecordsPerInputAttr[] = "records_per_input";

// The cache that insert_cache adds (kernels/cache_dataset_op.cc), and its
// attribute naming the node it caches (for display).
inline constexpr char kCacheOp[] = "IntuneCacheDataset";
inline constexpr char kCachePointAttr[] = "cache_point";
// Its attribute saying why the order of its input's elements may differ
// between epochs (a stage with `deterministic=False` or `sloppy`, or
// `options.deterministic=False`); empty when the order is fixed. Such a
// cache serves only a whole epoch.
inline constexpr char kCacheUnorderedAttr[] = "unordered";
// Its attribute naming the row store of the map above it (the rewrite
// insert_row_store): when set, each element comes with its position, a
// scalar int64 before its components, which names the store (row_store.h).
inline constexpr char kCacheRowStoreAttr[] = "row_store";

// The nodes of the release op and of the cache in the autotuning model,
// left out of stage names: a stage's name is the same with them or without
// them.
inline constexpr char kBufferReleaseNode[] = "IntuneBufferRelease";
inline constexpr char kCacheNode[] = "IntuneCache";

// The row store (kernels/row_store.h): the ops a row-wise map over batches
// is wrapped with, so that a batch whose rows were all stored under their
// positions is gathered instead of computed. `key` names the store (one per
// map), `T` the dtypes of the rows' components and `shapes` their shapes
// without the batch dimension.
inline constexpr char kRowStoreHasOp[] = "IntuneRowStoreHas";
inline constexpr char kRowStorePutOp[] = "IntuneRowStorePut";
inline constexpr char kRowStoreGatherOp[] = "IntuneRowStoreGather";
inline constexpr char kRowStoreKeyAttr[] = "key";
inline constexpr char kRowStoreTypesAttr[] = "T";
inline constexpr char kRowStoreShapesAttr[] = "shapes";

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_OP_NAMES_H_
