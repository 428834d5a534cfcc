// The elements InTune's cache holds (IntuneCacheDataset,
// cache_dataset_op.cc), outside any one iterator.
//
// tf.data's own cache lives in a resource made with its dataset. InTune's
// cache is added when the iterator is made, and `model.fit` makes one
// iterator per epoch: its elements live in a process-wide store, one entry
// per key (the cached pipeline's graph and the tensors it holds), with a
// signature of the pipeline's files, checked by each new iterator (a file
// changed between epochs empties the entry).
//
// An entry holds a prefix of the epoch: the elements 0..size-1, appended in
// order by whichever iterator reads element `size` from its input, up to a
// byte limit that the RAM budget's guard sets (TuningSession::EnforceBudget)
// and lowers first under memory pressure, dropping elements from the end.
// Its contents are never iterator state: checkpoints hold a position.
//
// An unordered entry (its input may give another order each epoch: a
// stage with deterministic=False or sloppy, or options.deterministic=False)
// is useful only whole: one iterator at a time fills it (ClaimFill), from
// element 0 of an epoch, and whatever stops it short (no room, an error, the
// iterator gone, a shrink) empties it. Its readers serve a whole epoch from a
// Snapshot that outlives a shrink.
#ifndef INTUNE_TF_CC_KERNELS_CACHE_STORE_H_
#define INTUNE_TF_CC_KERNELS_CACHE_STORE_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/thread_annotations.h"

namespace tensorflow {
namespace intune {

class CacheStore;
class RowStore;

// The bytes a cache entry may hold, which its elements and its row stores
// (row_store.h) share: each takes its bytes here as well as from the
// process's CacheStore.
class CacheRoom {
 public:
  // Takes `bytes` if held + bytes stays within the limit.
  bool Take(int64_t bytes);
  void Give(int64_t bytes) { held_.fetch_sub(bytes); }
  void set_limit(int64_t bytes) { limit_.store(bytes); }
  int64_t limit() const { return limit_.load(); }
  int64_t held() const { return held_.load(); }

 private:
  std::atomic<int64_t> limit_{0};
  std::atomic<int64_t> held_{0};
};

class CacheEntry {
 public:
  using Elements = std::vector<std::vector<Tensor>>;

  // `store` (may be null) counts the entry's bytes against the process's
  // budget.
  CacheEntry(std::string key, CacheStore* store, bool ordered = true)
      : key_(std::move(key)), store_(store), ordered_(ordered) {}
  ~CacheEntry();

  const std::string& key() const { return key_; }
  // Whether the input gives its elements in one order every epoch.
  bool ordered() const { return ordered_; }
  // Where the rewrite put the cache (the node it caches), for display.
  void set_point(const std::string& point) TF_LOCKS_EXCLUDED(mu_);
  std::string point() const TF_LOCKS_EXCLUDED(mu_);

  // Empties the entry unless its files' signature is `signature` (what
  // says each file is unchanged), then keeps `signature`. Returns whether it
  // was emptied.
  bool CheckFiles(const std::string& signature) TF_LOCKS_EXCLUDED(mu_);
  // The files the entry's pipeline may read, found once per entry (its key
  // fixes the strings that may name them): false until set.
  bool GetFiles(std::vector<std::string>* files) const TF_LOCKS_EXCLUDED(mu_);
  void SetFiles(std::vector<std::string> files) TF_LOCKS_EXCLUDED(mu_);
  // An epoch read whole from the input took `us` microseconds (the last
  // such epoch is kept); 0 until one did.
  void RecordInputEpoch(int64_t us) TF_LOCKS_EXCLUDED(mu_);
  int64_t input_epoch_us() const TF_LOCKS_EXCLUDED(mu_);
  // The entry holds nothing from now on, for `reason` (why the cache is
  // declined, cache_decision.h); empty while it is not declined.
  void Decline(const std::string& reason) TF_LOCKS_EXCLUDED(mu_);
  std::string declined() const TF_LOCKS_EXCLUDED(mu_);

  // A knob of a stage below the cache, as the last session that ran it saw
  // it: a session whose epochs the entry serves from the start lists it,
  // idle, under the same name (TuningSession::AttachCache).
  struct KnobBelow {
    std::string name;
    double value = 0;
    double min = 0;
    double max = 0;
  };
  // Remembers `knobs` (by name, over what was remembered).
  void RememberKnobs(const std::vector<KnobBelow>& knobs)
      TF_LOCKS_EXCLUDED(mu_);
  std::vector<KnobBelow> knobs_below() const TF_LOCKS_EXCLUDED(mu_);

  // The row store (row_store.h) of the map `key` above the entry's cache,
  // made if there is none; null while the entry is declined. The entry owns
  // it, and drops it (and the others) when its files change or it is
  // declined: the rows were computed from its elements.
  std::shared_ptr<RowStore> RowStoreFor(const std::string& key)
      TF_LOCKS_EXCLUDED(mu_);
  // The row stores it owns now.
  std::vector<std::shared_ptr<RowStore>> row_stores() const
      TF_LOCKS_EXCLUDED(mu_);

  // Element `index`, if held.
  bool Get(int64_t index, std::vector<Tensor>* out) const
      TF_LOCKS_EXCLUDED(mu_);
  // Appends `element` as element `index` when the entry holds exactly
  // `index` elements, is not complete and has room under its limit. Once an
  // element did not fit, nothing is appended until the next epoch begins
  // (`BeginEpoch`): the entry stays a prefix.
  // An unordered entry takes elements only from its filler (ClaimFill), and
  // empties itself when one does not fit.
  bool Append(int64_t index, const std::vector<Tensor>& element,
              int64_t upstream_us, const void* filler = nullptr)
      TF_LOCKS_EXCLUDED(mu_);
  // Unordered entries: makes `filler` (an iterator at element 0 of an epoch)
  // the one that fills the entry, if it is empty, nobody fills it, and its
  // limit has room for what the last try needed. Returns whether.
  bool ClaimFill(const void* filler) TF_LOCKS_EXCLUDED(mu_);
  // `filler` stops filling: an unordered entry not complete is emptied.
  void ReleaseFill(const void* filler) TF_LOCKS_EXCLUDED(mu_);
  // The whole epoch, while the entry is complete; else null. It stays valid
  // after the entry is emptied or shrunk.
  std::shared_ptr<const Elements> Snapshot() const TF_LOCKS_EXCLUDED(mu_);
  // The epoch ended after `count` elements: complete if all are held.
  void MarkEnd(int64_t count) TF_LOCKS_EXCLUDED(mu_);
  // The input gave an error in place of element `index`: the entry holds
  // fewer than `index` elements from then on (until emptied), so that every
  // epoch reads that element's input again and meets the error where
  // TensorFlow does. Nothing once the entry is complete.
  void FailedAt(int64_t index) TF_LOCKS_EXCLUDED(mu_);
  void BeginEpoch() TF_LOCKS_EXCLUDED(mu_);

  // Sets the byte limit of the elements and the row stores together,
  // shrinking the row stores first, then dropping elements from the end,
  // while they hold more. Returns the bytes dropped.
  int64_t SetLimit(int64_t bytes) TF_LOCKS_EXCLUDED(mu_);
  // Drops elements from the end until `bytes` are freed (or none is left),
  // and lowers the limit to what is left. Returns the bytes dropped.
  int64_t Shrink(int64_t bytes) TF_LOCKS_EXCLUDED(mu_);
  // Iterators reading the entry now: an entry that none reads is idle, and
  // goes first when the process's caches must shrink.
  void AddReader() { readers_.fetch_add(1); }
  void RemoveReader() { readers_.fetch_sub(1); }
  bool idle() const { return readers_.load() <= 0; }

  int64_t size() const TF_LOCKS_EXCLUDED(mu_);
  int64_t bytes() const TF_LOCKS_EXCLUDED(mu_);
  int64_t limit() const TF_LOCKS_EXCLUDED(mu_);
  // The whole epoch is held.
  bool complete() const TF_LOCKS_EXCLUDED(mu_);
  // Microseconds of upstream time per element held, measured as the entry
  // filled (the time between two elements read from the input).
  double upstream_us_per_element() const TF_LOCKS_EXCLUDED(mu_);
  // Elements dropped by SetLimit, over the entry's life.
  int64_t dropped() const TF_LOCKS_EXCLUDED(mu_);

 private:
  void ClearLocked() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the last element held (there is one), with its share of the
  // upstream time; returns its bytes.
  int64_t DropLastLocked() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string key_;
  CacheStore* const store_;
  const bool ordered_;
  std::atomic<int64_t> readers_{0};
  mutable mutex mu_;
  // Unordered entries: the iterator filling it (compared, never used).
  const void* filler_ TF_GUARDED_BY(mu_) = nullptr;
  // Unordered entries: the bytes a try to fill it reached without room (0:
  // none yet); it is tried again once the limit is above them.
  int64_t needed_bytes_ TF_GUARDED_BY(mu_) = 0;
  std::string point_ TF_GUARDED_BY(mu_);
  std::string signature_ TF_GUARDED_BY(mu_);
  bool has_signature_ TF_GUARDED_BY(mu_) = false;
  std::vector<std::string> files_ TF_GUARDED_BY(mu_);
  bool has_files_ TF_GUARDED_BY(mu_) = false;
  int64_t input_epoch_us_ TF_GUARDED_BY(mu_) = 0;
  std::string declined_ TF_GUARDED_BY(mu_);
  // Replaced, never changed, once complete: snapshots share it.
  std::shared_ptr<Elements> elements_ TF_GUARDED_BY(mu_) =
      std::make_shared<Elements>();
  std::vector<int64_t> element_bytes_ TF_GUARDED_BY(mu_);
  int64_t bytes_ TF_GUARDED_BY(mu_) = 0;
  int64_t limit_ TF_GUARDED_BY(mu_) = 0;
  bool complete_ TF_GUARDED_BY(mu_) = false;
  bool stopped_ TF_GUARDED_BY(mu_) = false;
  // The first element the input failed to give (FailedAt), or -1.
  int64_t failed_at_ TF_GUARDED_BY(mu_) = -1;
  int64_t upstream_us_ TF_GUARDED_BY(mu_) = 0;
  int64_t dropped_ TF_GUARDED_BY(mu_) = 0;
  std::map<std::string, KnobBelow> knobs_below_ TF_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<RowStore>> row_stores_
      TF_GUARDED_BY(mu_);
  const std::shared_ptr<CacheRoom> room_ = std::make_shared<CacheRoom>();
};

// Something outside the entries that holds bytes reserved in the store
// (CacheStore::Reserve) and can give them back: the row stores
// (row_store.h). The store shrinks them first when its caches must shrink.
class CacheHolder {
 public:
  virtual ~CacheHolder() = default;
  // Drops what it holds until `bytes` are freed (or it cannot free more),
  // releasing them to the store. Returns the bytes freed.
  virtual int64_t Shrink(int64_t bytes) = 0;
};

// The process's entries, by key. The store does not own them: an entry
// lives while a dataset that caches with its key does (each
// IntuneCacheDataset holds its entry), so the elements go with the last
// dataset that could read them, as tf.data's own cache goes with its dataset.
//
// The store also keeps every entry's bytes, with or without an iterator,
// inside the process's RAM budget (the default budget the tuner resolves on
// the machine, `SetProcessBudget`): the caches hold at most that budget less
// the bytes that the live sessions' buffers hold (`SetBuffered`). An element
// that would pass it is not appended; when the budget falls or the buffers
// grow, the caches are shrunk: the holders (row stores) first, then idle
// entries, then the others.
class CacheStore {
 public:
  static CacheStore* Global();

  // The process's budget for its caches and buffers, in bytes (0: none).
  void SetProcessBudget(int64_t bytes) TF_LOCKS_EXCLUDED(mu_);
  // Session `session`'s buffers hold `bytes` now (< 0: the session is gone).
  void SetBuffered(int64_t session, int64_t bytes) TF_LOCKS_EXCLUDED(mu_);
  // Takes `bytes` of the caches' room, if there is that much; Release gives
  // them back.
  bool Reserve(int64_t bytes);
  void Release(int64_t bytes);
  // Bytes the entries hold, and the most they may hold (INT64_MAX with no
  // budget).
  int64_t bytes() const { return bytes_.load(); }
  int64_t room() const { return room_.load(); }
  int64_t process_budget() const TF_LOCKS_EXCLUDED(mu_);
  // Bytes the live sessions' buffers hold, as they last said.
  int64_t buffered() const TF_LOCKS_EXCLUDED(mu_);

  // The entry of `key`, made if there is none alive (`ordered`: see
  // CacheEntry::ordered; the key holds the graph, so one key, one order).
  std::shared_ptr<CacheEntry> Get(const std::string& key, bool ordered = true)
      TF_LOCKS_EXCLUDED(mu_);
  // Every entry alive.
  std::vector<std::shared_ptr<CacheEntry>> List() const TF_LOCKS_EXCLUDED(mu_);
  // Shrinks `holder` (while it lives), before the entries, when the caches
  // hold more than their room.
  void AddHolder(std::weak_ptr<CacheHolder> holder) TF_LOCKS_EXCLUDED(mu_);

 private:
  // Sets the room from the budget and the buffers, then shrinks the
  // entries (idle ones first) until they fit it.
  void Balance() TF_LOCKS_EXCLUDED(mu_);

  mutable mutex mu_;
  std::unordered_map<std::string, std::weak_ptr<CacheEntry>> entries_
      TF_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<CacheHolder>> holders_ TF_GUARDED_BY(mu_);
  int64_t process_budget_ TF_GUARDED_BY(mu_) = 0;
  std::unordered_map<int64_t, int64_t> buffered_ TF_GUARDED_BY(mu_);
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> room_{std::numeric_limits<int64_t>::max()};
};

// Bytes of an element as the cache counts them: its tensors' buffers, their
// strings' bytes, and the tensors held by their variants (sparse and ragged
// tensors, tensor lists). `uncounted` (may be null) is set to the type of
// the first variant value whose size is not known (a nested dataset), ""
// when there is none: an element holding one is never cached.
int64_t ElementBytes(const std::vector<Tensor>& element,
                     std::string* uncounted = nullptr);

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_CACHE_STORE_H_
