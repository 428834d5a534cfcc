#include "intune_tf/cc/kernels/cache_store.h"

#include <algorithm>
#include <utility>

#include "intune_tf/cc/kernels/row_store.h"
#include "tensorflow/core/framework/variant.h"
#include "tensorflow/core/framework/variant_tensor_data.h"

namespace tensorflow {
namespace intune {

namespace {

// Variants inside variants (a list of ragged tensors) are counted this deep.
constexpr int kMaxVariantDepth = 8;
// Variant values whose tensors the cache counts through Encode, which
// copies only their tensors' handles.
constexpr char kRaggedVariant[] = "RaggedTensorVariant";
constexpr char kTensorListVariant[] = "tensorflow::TensorList";

int64_t TensorBytes(const Tensor& t, int depth, std::string* uncounted) {
  // A string tensor's bytes count its strings (tensor.cc, TotalBytes).
  int64_t bytes = t.TotalBytes();
  if (t.dtype() != DT_VARIANT) return bytes;
  const auto values = t.flat<Variant>();
  for (int64_t i = 0; i < values.size(); ++i) {
    const Variant& v = values(i);
    if (v.is_empty()) continue;
    if (depth >= kMaxVariantDepth) {
      if (uncounted->empty()) *uncounted = v.TypeName();
      continue;
    }
    if (const Tensor* inner = v.get<Tensor>()) {
      bytes += TensorBytes(*inner, depth + 1, uncounted);
      continue;
    }
    const std::string type = v.TypeName();
    if (type != kRaggedVariant && type != kTensorListVariant) {
      if (uncounted->empty()) *uncounted = type;
      continue;
    }
    VariantTensorData data;
    v.Encode(&data);
    bytes += data.metadata_string().size();
    for (const Tensor& inner : data.tensors()) {
      bytes += TensorBytes(inner, depth + 1, uncounted);
    }
  }
  return bytes;
}

// Adds `bytes` to `held` if the sum stays within `limit`.
bool AddUnderLimit(std::atomic<int64_t>* held,
                   const std::atomic<int64_t>& limit, int64_t bytes) {
  int64_t now = held->load();
  do {
    if (now + bytes > limit.load()) return false;
  } while (!held->compare_exchange_weak(now, now + bytes));
  return true;
}

}  // namespace

int64_t ElementBytes(const std::vector<Tensor>& element,
                     std::string* uncounted) {
  std::string unknown;
  int64_t bytes = 0;
  for (const Tensor& t : element) bytes += TensorBytes(t, 0, &unknown);
  if (uncounted != nullptr) *uncounted = unknown;
  return bytes;
}

bool CacheRoom::Take(int64_t bytes) {
  return AddUnderLimit(&held_, limit_, bytes);
}

CacheEntry::~CacheEntry() {
  mutex_lock l(mu_);
  if (store_ != nullptr) store_->Release(bytes_);
  room_->Give(bytes_);
}

void CacheEntry::set_point(const std::string& point) {
  mutex_lock l(mu_);
  point_ = point;
}

std::string CacheEntry::point() const {
  mutex_lock l(mu_);
  return point_;
}

void CacheEntry::RememberKnobs(const std::vector<KnobBelow>& knobs) {
  mutex_lock l(mu_);
  for (const KnobBelow& knob : knobs) knobs_below_[knob.name] = knob;
}

std::vector<CacheEntry::KnobBelow> CacheEntry::knobs_below() const {
  mutex_lock l(mu_);
  std::vector<KnobBelow> knobs;
  knobs.reserve(knobs_below_.size());
  for (const auto& [unused, knob] : knobs_below_) knobs.push_back(knob);
  return knobs;
}

bool CacheEntry::CheckFiles(const std::string& signature) {
  // Dropped after the lock: a store gives its bytes back to the CacheStore.
  std::map<std::string, std::shared_ptr<RowStore>> dropped;
  mutex_lock l(mu_);
  const bool changed = has_signature_ && signature != signature_;
  if (changed) {
    ClearLocked();
    dropped.swap(row_stores_);
  }
  signature_ = signature;
  has_signature_ = true;
  return changed;
}

bool CacheEntry::GetFiles(std::vector<std::string>* files) const {
  mutex_lock l(mu_);
  if (!has_files_) return false;
  *files = files_;
  return true;
}

void CacheEntry::SetFiles(std::vector<std::string> files) {
  mutex_lock l(mu_);
  files_ = std::move(files);
  has_files_ = true;
}

void CacheEntry::RecordInputEpoch(int64_t us) {
  mutex_lock l(mu_);
  input_epoch_us_ = std::max<int64_t>(us, 1);
}

int64_t CacheEntry::input_epoch_us() const {
  mutex_lock l(mu_);
  return input_epoch_us_;
}

void CacheEntry::Decline(const std::string& reason) {
  std::map<std::string, std::shared_ptr<RowStore>> dropped;
  mutex_lock l(mu_);
  ClearLocked();
  dropped.swap(row_stores_);
  declined_ = reason;
}

std::shared_ptr<RowStore> CacheEntry::RowStoreFor(const std::string& key) {
  mutex_lock l(mu_);
  if (!declined_.empty()) return nullptr;
  std::shared_ptr<RowStore>& store = row_stores_[key];
  if (store == nullptr) {
    store = RowStoreRegistry::Global()->MakeTagged(key, room_);
  }
  return store;
}

std::vector<std::shared_ptr<RowStore>> CacheEntry::row_stores() const {
  mutex_lock l(mu_);
  std::vector<std::shared_ptr<RowStore>> stores;
  for (const auto& [key, store] : row_stores_) stores.push_back(store);
  return stores;
}

std::string CacheEntry::declined() const {
  mutex_lock l(mu_);
  return declined_;
}

bool CacheEntry::Get(int64_t index, std::vector<Tensor>* out) const {
  mutex_lock l(mu_);
  if (index < 0 || index >= static_cast<int64_t>(elements_->size())) {
    return false;
  }
  *out = (*elements_)[index];
  return true;
}

bool CacheEntry::Append(int64_t index, const std::vector<Tensor>& element,
                        int64_t upstream_us, const void* filler) {
  mutex_lock l(mu_);
  if (!ordered_ && (filler == nullptr || filler != filler_)) return false;
  if (complete_ || stopped_ || !declined_.empty() ||
      index != static_cast<int64_t>(elements_->size()) ||
      (failed_at_ >= 0 && index >= failed_at_)) {
    return false;
  }
  std::string uncounted;
  const int64_t bytes = ElementBytes(element, &uncounted);
  bool room = uncounted.empty() && room_->Take(bytes);
  if (room && store_ != nullptr && !store_->Reserve(bytes)) {
    room_->Give(bytes);
    room = false;
  }
  if (!room) {
    stopped_ = true;
    if (!ordered_) {
      // A part of an unordered epoch is never served: let it go.
      needed_bytes_ = bytes_ + bytes;
      ClearLocked();
      stopped_ = true;
    }
    return false;
  }
  elements_->push_back(element);
  element_bytes_.push_back(bytes);
  bytes_ += bytes;
  upstream_us_ += std::max<int64_t>(upstream_us, 0);
  return true;
}

void CacheEntry::MarkEnd(int64_t count) {
  mutex_lock l(mu_);
  if (!stopped_ && failed_at_ < 0 &&
      count == static_cast<int64_t>(elements_->size())) {
    complete_ = true;
    needed_bytes_ = 0;
  }
  if (!ordered_) filler_ = nullptr;
}

bool CacheEntry::ClaimFill(const void* filler) {
  mutex_lock l(mu_);
  if (ordered_ || filler == nullptr) return false;
  if (filler_ != nullptr || complete_ || !elements_->empty()) return false;
  if (needed_bytes_ > 0 && limit_ < needed_bytes_) return false;
  ClearLocked();
  filler_ = filler;
  return true;
}

void CacheEntry::ReleaseFill(const void* filler) {
  mutex_lock l(mu_);
  if (ordered_ || filler == nullptr || filler != filler_) return;
  filler_ = nullptr;
  if (!complete_) ClearLocked();
}

std::shared_ptr<const CacheEntry::Elements> CacheEntry::Snapshot() const {
  mutex_lock l(mu_);
  if (!complete_) return nullptr;
  return elements_;
}

void CacheEntry::FailedAt(int64_t index) {
  mutex_lock l(mu_);
  if (complete_) return;
  if (!ordered_) {
    // The elements before it may come in another order next time.
    filler_ = nullptr;
    ClearLocked();
    return;
  }
  index = std::max<int64_t>(index, 0);
  if (failed_at_ < 0 || index < failed_at_) failed_at_ = index;
  complete_ = false;
  while (static_cast<int64_t>(elements_->size()) > failed_at_) {
    DropLastLocked();
  }
}

void CacheEntry::BeginEpoch() {
  mutex_lock l(mu_);
  stopped_ = false;
}

int64_t CacheEntry::SetLimit(int64_t bytes) {
  std::vector<std::shared_ptr<RowStore>> stores;
  {
    mutex_lock l(mu_);
    limit_ = std::max<int64_t>(bytes, 0);
    room_->set_limit(limit_);
    for (const auto& [key, store] : row_stores_) stores.push_back(store);
  }
  // The row stores first (outside the lock: a store gives its bytes back
  // to the room and the CacheStore).
  int64_t dropped = 0;
  for (const auto& store : stores) {
    const int64_t excess = room_->held() - room_->limit();
    if (excess <= 0) break;
    dropped += store->Shrink(excess);
  }
  mutex_lock l(mu_);
  if (!ordered_ && bytes_ > 0 && room_->held() > limit_) {
    // Part of an unordered epoch is worth nothing: all of it goes, and the
    // filler (if any) stops; readers keep their snapshots to the epoch's end.
    dropped += bytes_;
    dropped_ += elements_->size();
    needed_bytes_ = std::max(needed_bytes_, bytes_);
    filler_ = nullptr;
    ClearLocked();
    stopped_ = true;
    return dropped;
  }
  while (room_->held() > limit_ && !elements_->empty()) {
    dropped += DropLastLocked();
    complete_ = false;
    // A shrunk entry is a prefix: nothing more until the next epoch.
    stopped_ = true;
    ++dropped_;
  }
  return dropped;
}

int64_t CacheEntry::Shrink(int64_t bytes) {
  mutex_lock l(mu_);
  int64_t dropped = 0;
  if (!ordered_ && bytes > 0 && bytes_ > 0) {
    // Part of an unordered epoch is worth nothing (SetLimit).
    dropped = bytes_;
    dropped_ += elements_->size();
    needed_bytes_ = std::max(needed_bytes_, bytes_);
    filler_ = nullptr;
    ClearLocked();
    stopped_ = true;
    limit_ = 0;
    room_->set_limit(limit_);
    return dropped;
  }
  while (dropped < bytes && !elements_->empty()) {
    dropped += DropLastLocked();
    complete_ = false;
    stopped_ = true;
    ++dropped_;
  }
  limit_ = std::min(limit_, room_->held());
  room_->set_limit(limit_);
  return dropped;
}

int64_t CacheEntry::size() const {
  mutex_lock l(mu_);
  return elements_->size();
}

int64_t CacheEntry::bytes() const {
  mutex_lock l(mu_);
  return bytes_;
}

int64_t CacheEntry::limit() const {
  mutex_lock l(mu_);
  return limit_;
}

bool CacheEntry::complete() const {
  mutex_lock l(mu_);
  return complete_;
}

double CacheEntry::upstream_us_per_element() const {
  mutex_lock l(mu_);
  if (elements_->empty()) return 0;
  return static_cast<double>(upstream_us_) / elements_->size();
}

int64_t CacheEntry::dropped() const {
  mutex_lock l(mu_);
  return dropped_;
}

int64_t CacheEntry::DropLastLocked() {
  const int64_t last = element_bytes_.back();
  const int64_t n = elements_->size();
  if (upstream_us_ > 0) upstream_us_ -= upstream_us_ / n;
  elements_->pop_back();
  element_bytes_.pop_back();
  bytes_ -= last;
  if (store_ != nullptr) store_->Release(last);
  room_->Give(last);
  return last;
}

void CacheEntry::ClearLocked() {
  if (store_ != nullptr) store_->Release(bytes_);
  room_->Give(bytes_);
  // A new vector: a snapshot of the old one stays whole.
  elements_ = std::make_shared<Elements>();
  element_bytes_.clear();
  bytes_ = 0;
  complete_ = false;
  stopped_ = false;
  failed_at_ = -1;
  upstream_us_ = 0;
}

CacheStore* CacheStore::Global() {
  static CacheStore* store = new CacheStore;
  return store;
}

std::shared_ptr<CacheEntry> CacheStore::Get(const std::string& key,
                                            bool ordered) {
  mutex_lock l(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.expired()) {
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  std::shared_ptr<CacheEntry> entry = entries_[key].lock();
  if (entry == nullptr) {
    entry = std::make_shared<CacheEntry>(key, this, ordered);
    entries_[key] = entry;
  }
  return entry;
}

std::vector<std::shared_ptr<CacheEntry>> CacheStore::List() const {
  mutex_lock l(mu_);
  std::vector<std::shared_ptr<CacheEntry>> entries;
  for (const auto& [unused, weak] : entries_) {
    if (auto entry = weak.lock()) entries.push_back(std::move(entry));
  }
  return entries;
}

void CacheStore::AddHolder(std::weak_ptr<CacheHolder> holder) {
  mutex_lock l(mu_);
  holders_.push_back(std::move(holder));
}

void CacheStore::SetProcessBudget(int64_t bytes) {
  {
    mutex_lock l(mu_);
    process_budget_ = std::max<int64_t>(bytes, 0);
  }
  Balance();
}

void CacheStore::SetBuffered(int64_t session, int64_t bytes) {
  {
    mutex_lock l(mu_);
    if (bytes < 0) {
      buffered_.erase(session);
    } else {
      buffered_[session] = bytes;
    }
  }
  Balance();
}

int64_t CacheStore::process_budget() const {
  mutex_lock l(mu_);
  return process_budget_;
}

int64_t CacheStore::buffered() const {
  mutex_lock l(mu_);
  int64_t total = 0;
  for (const auto& [unused, bytes] : buffered_) total += bytes;
  return total;
}

bool CacheStore::Reserve(int64_t bytes) {
  return AddUnderLimit(&bytes_, room_, bytes);
}

void CacheStore::Release(int64_t bytes) { bytes_.fetch_sub(bytes); }

void CacheStore::Balance() {
  std::vector<std::shared_ptr<CacheEntry>> entries;
  std::vector<std::shared_ptr<CacheHolder>> holders;
  {
    mutex_lock l(mu_);
    int64_t room = std::numeric_limits<int64_t>::max();
    if (process_budget_ > 0) {
      room = process_budget_;
      for (const auto& [unused, bytes] : buffered_) room -= bytes;
      room = std::max<int64_t>(room, 0);
    }
    room_.store(room);
    if (bytes_.load() <= room) return;
    for (const auto& [unused, weak] : entries_) {
      if (auto entry = weak.lock()) entries.push_back(std::move(entry));
    }
    for (auto it = holders_.begin(); it != holders_.end();) {
      if (auto holder = it->lock()) {
        holders.push_back(std::move(holder));
        ++it;
      } else {
        it = holders_.erase(it);
      }
    }
  }
  for (const auto& holder : holders) {
    const int64_t over = bytes_.load() - room_.load();
    if (over <= 0) return;
    holder->Shrink(over);
  }
  // Idle entries first, the largest first in each group.
  std::sort(entries.begin(), entries.end(),
            [](const std::shared_ptr<CacheEntry>& a,
               const std::shared_ptr<CacheEntry>& b) {
              if (a->idle() != b->idle()) return a->idle();
              return a->bytes() > b->bytes();
            });
  for (const auto& entry : entries) {
    const int64_t over = bytes_.load() - room_.load();
    if (over <= 0) break;
    entry->Shrink(over);
  }
}

}  // namespace intune
}  // namespace tensorflow
