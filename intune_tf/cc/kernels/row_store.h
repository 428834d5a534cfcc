// The rows a row-wise map over batches computed, by position, outside any
// one iterator (the ops in row_store_ops.cc).
//
// A pipeline `positions -> shuffle -> batch -> map(f)` carries each row's
// position in the epoch beside it: a shuffle's order depends only on its
// seeds and on how many elements it read, so the positions come out in the
// order plain tf.data gives the rows. When f is row-wise (row j of its
// output depends only on row j of its input), the map can be wrapped as
//
//   f'(pos, x) = If(IntuneRowStoreHas(pos),
//                   IntuneRowStoreGather(pos),
//                   IntuneRowStorePut(pos, f(x)))
//
// so that a batch whose rows were all stored skips f, and a batch with a
// row missing is computed as written (a malformed row raises where plain
// tf.data raises).
//
// Two kinds of positions:
// - Tagged (the rewrite insert_row_store): the cache below the shuffle gives
//   each element `RowPosition(tag, index)`, where `tag` names a store that
//   the cache's entry owns (CacheEntry::RowStoreFor): the store lives while
//   the entry does (with the datasets that read it) and is dropped with the
//   entry's elements when its files change or it is declined. The tag is
//   random, and the ops check the store's key too, so that positions
//   restored from another process's checkpoint find no store of another
//   pipeline. A negative position has no store: its batch is computed.
// - Untagged (0 <= position < 2^kRowTagShift, written by hand): the store
//   is the op's `key` in a registry that holds it for the life of the
//   process.
//
// A store's bytes are taken from the room of the process's caches
// (CacheStore::Reserve), so the budget guard counts them, and the store is
// the first that the caches give back when they must shrink
// (CacheStore::Balance): it drops rows (kRowChunk positions at a time) from
// the highest positions down. Once
// a row does not fit, or once the store was shrunk, it takes no more rows:
// it holds the rows stored before, and the others are computed every epoch.
//
// A stored row stays stored between the IntuneRowStoreHas that found it and
// the IntuneRowStoreGather of the same batch: a Has that answers true pins
// the batch's rows, its Gather unpins them, and a shrink leaves pinned rows.
// A Has answering true must therefore be followed by its Gather (the If
// does); a pin left behind only keeps its rows from a shrink.
#ifndef INTUNE_TF_CC_KERNELS_ROW_STORE_H_
#define INTUNE_TF_CC_KERNELS_ROW_STORE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "intune_tf/cc/kernels/cache_store.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/status.h"
#include "tensorflow/core/platform/thread_annotations.h"

namespace tensorflow {
namespace intune {

// OK when a row store can hold components of `dtypes`: dense tensors of any
// dtype, strings included; InvalidArgument naming the first variant or
// resource dtype (their bytes and lifetime are not the store's to know).
Status CheckRowTypes(const DataTypeVector& dtypes);

// A tagged position: bits 0..kRowTagShift-1 hold the element's index in the
// epoch, the bits above the tag of its store (1 .. 2^(63-kRowTagShift)-1).
inline constexpr int kRowTagShift = 40;
inline constexpr int64_t kRowIndexMask = (int64_t{1} << kRowTagShift) - 1;
// Positions held together, in one chunk of columns (RowStore).
inline constexpr int64_t kRowChunk = 32;
inline constexpr int64_t RowPosition(int64_t tag, int64_t index) {
  return (tag << kRowTagShift) | index;
}
inline constexpr int64_t RowTag(int64_t position) {
  return position < 0 ? -1 : position >> kRowTagShift;
}

class RowStore : public CacheHolder {
 public:
  // `budget` (may be null: no limit) gives the room for the rows' bytes;
  // `tag` (0: untagged) is the one its positions carry. Empty `dtypes`: set
  // by the first Accept.
  // `room` (may be null): the owning cache entry's, which its bytes are
  // taken from too.
  RowStore(std::string key, DataTypeVector dtypes, CacheStore* budget,
           int64_t tag = 0, std::shared_ptr<CacheRoom> room = nullptr)
      : key_(std::move(key)),
        budget_(budget),
        room_(std::move(room)),
        tag_(tag),
        dtypes_(std::move(dtypes)) {}
  ~RowStore() override;
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  const std::string& key() const { return key_; }
  int64_t tag() const { return tag_; }
  DataTypeVector dtypes() const TF_LOCKS_EXCLUDED(mu_);
  // OK when the store holds rows of `dtypes` (the first call of a store made
  // without dtypes sets them); else InvalidArgument.
  Status Accept(const DataTypeVector& dtypes) TF_LOCKS_EXCLUDED(mu_);

  // Whether every position of `positions` (a vector) is stored; false when
  // there is none (an empty batch is computed as written). When true, the
  // rows are pinned until `Gather` of the same positions.
  bool HasAll(const Tensor& positions) TF_LOCKS_EXCLUDED(mu_);

  // Stores row j of each of `components` (each [B, ...], B the length of
  // `positions`) under positions[j], copied, unless that position is stored
  // (it is left as it is) or the store stopped taking rows. The first row
  // without room under the budget stops the store, for good, and says so
  // once in the log; so does a row whose shape is not the first row's.
  // `stored` (may be null) is set to the rows this call stored.
  Status Put(const Tensor& positions, const std::vector<Tensor>& components,
             int64_t* stored = nullptr) TF_LOCKS_EXCLUDED(mu_);

  // Stacks the rows stored under `positions` into `out`, one tensor
  // [B, ...] per component, and unpins them (HasAll). InvalidArgument when a
  // position is not stored, when the rows of a component differ in shape,
  // or when they do not fit `shapes` (the row shapes the graph expects).
  Status Gather(const Tensor& positions,
                const std::vector<PartialTensorShape>& shapes,
                std::vector<Tensor>* out) TF_LOCKS_EXCLUDED(mu_);

  // Drops the chunks of rows (kRowChunk positions each) not pinned, from
  // the highest positions down, until `bytes` are freed or none is left,
  // and stops taking rows. Returns the bytes freed (released to the
  // budget).
  int64_t Shrink(int64_t bytes) override TF_LOCKS_EXCLUDED(mu_);

  // Rows and bytes held, and whether the store stopped taking rows.
  int64_t rows() const TF_LOCKS_EXCLUDED(mu_);
  int64_t bytes() const TF_LOCKS_EXCLUDED(mu_);
  bool stopped() const TF_LOCKS_EXCLUDED(mu_);
  // Batches gathered (Gather calls that succeeded).
  int64_t gathered() const { return gathered_.load(); }

 private:
  // Takes `bytes` from the budget and the room (both or neither).
  bool Take(int64_t bytes);
  void Give(int64_t bytes);

  const std::string key_;
  CacheStore* const budget_;
  const std::shared_ptr<CacheRoom> room_;
  const int64_t tag_;
  std::atomic<int64_t> gathered_{0};
  mutable mutex mu_;
  DataTypeVector dtypes_ TF_GUARDED_BY(mu_);
  // Rows are kept by column, kRowChunk consecutive positions to a chunk: one
  // tensor [kRowChunk, *row_shapes_[i]] per component, whose bytes are taken
  // from the budget when the chunk is made (and a string's bytes when it is
  // stored).
  struct Chunk {
    std::vector<Tensor> columns;
    // Where each column's bytes start (memcpy-able dtypes).
    std::vector<char*> bases;
    std::vector<bool> present;
    int64_t rows = 0;
    int64_t bytes = 0;
    // Rows that a Has answered for and whose Gather has not run yet.
    int64_t pins = 0;
  };
  // The chunk of `index`, made if `make` (null when it is not there, or
  // when its bytes have no room: the store then stops).
  Chunk* ChunkOf(int64_t index, bool make) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes of a row of component `i` for a memcpy, -1 for a dtype that
  // is not copied so (strings).
  int64_t RowBytes(size_t i) const TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<TensorShape> row_shapes_ TF_GUARDED_BY(mu_);
  // By chunk number (index / kRowChunk); null where none is held.
  std::vector<std::unique_ptr<Chunk>> chunks_ TF_GUARDED_BY(mu_);
  int64_t rows_ TF_GUARDED_BY(mu_) = 0;
  int64_t bytes_ TF_GUARDED_BY(mu_) = 0;
  bool stopped_ TF_GUARDED_BY(mu_) = false;
};

// The process's row stores: untagged ones by key, which live as long as the
// process, and tagged ones by tag, while their owner holds them. Each is a
// holder of the process's CacheStore.
class RowStoreRegistry {
 public:
  static RowStoreRegistry* Global();

  // The store of `key`, made (its bytes under CacheStore::Global()'s room)
  // if there is none. InvalidArgument if `dtypes` is refused
  // (CheckRowTypes) or differs from the store's.
  Status GetOrCreate(const std::string& key, const DataTypeVector& dtypes,
                     std::shared_ptr<RowStore>* store) TF_LOCKS_EXCLUDED(mu_);
  // The store of `key`, or null.
  std::shared_ptr<RowStore> Lookup(const std::string& key) const
      TF_LOCKS_EXCLUDED(mu_);

  // A new store of `key` with a random tag that no live store has, for its
  // caller to own (the registry keeps it only while the caller does), its
  // bytes taken from `room` too.
  std::shared_ptr<RowStore> MakeTagged(const std::string& key,
                                       std::shared_ptr<CacheRoom> room)
      TF_LOCKS_EXCLUDED(mu_);
  // The live store of `tag` if its key is `key`, else null.
  std::shared_ptr<RowStore> LookupTagged(int64_t tag,
                                         const std::string& key) const
      TF_LOCKS_EXCLUDED(mu_);

 private:
  mutable mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<RowStore>> stores_
      TF_GUARDED_BY(mu_);
  std::unordered_map<int64_t, std::weak_ptr<RowStore>> tagged_
      TF_GUARDED_BY(mu_);
};

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_ROW_STORE_H_
