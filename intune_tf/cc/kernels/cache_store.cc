#include "intune_tf/cc/kernels/cache_store.h"

#include <algorithm>
#include <utility>

namespace tensorflow {
namespace intune {

int64_t ElementBytes(const std::vector<Tensor>& element) {
  int64_t bytes = 0;
  for (const Tensor& t : element) {
    bytes += t.TotalBytes();
    if (t.dtype() == DT_STRING) {
      const auto strings = t.flat<tstring>();
      for (int64_t i = 0; i < strings.size(); ++i) bytes += strings(i).size();
    }
  }
  return bytes;
}

void CacheEntry::set_point(const std::string& point) {
  mutex_lock l(mu_);
  point_ = point;
}

std::string CacheEntry::point() const {
  mutex_lock l(mu_);
  return point_;
}

bool CacheEntry::CheckFiles(const std::string& signature) {
  mutex_lock l(mu_);
  const bool changed = has_signature_ && signature != signature_;
  if (changed) ClearLocked();
  signature_ = signature;
  has_signature_ = true;
  return changed;
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
  if (complete_ || stopped_ ||
      index != static_cast<int64_t>(elements_->size()) ||
      (failed_at_ >= 0 && index >= failed_at_)) {
    return false;
  }
  const int64_t bytes = ElementBytes(element);
  if (bytes_ + bytes > limit_) {
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
  mutex_lock l(mu_);
  limit_ = std::max<int64_t>(bytes, 0);
  int64_t dropped = 0;
  if (!ordered_ && bytes_ > limit_) {
    // Part of an unordered epoch is worth nothing: all of it goes, and the
    // filler (if any) stops; readers keep their snapshots to the epoch's end.
    dropped = bytes_;
    dropped_ += elements_->size();
    needed_bytes_ = std::max(needed_bytes_, bytes_);
    filler_ = nullptr;
    ClearLocked();
    stopped_ = true;
    return dropped;
  }
  while (bytes_ > limit_ && !elements_->empty()) {
    dropped += DropLastLocked();
    complete_ = false;
    // A shrunk entry is a prefix: nothing more until the next epoch.
    stopped_ = true;
    ++dropped_;
  }
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
  return last;
}

void CacheEntry::ClearLocked() {
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
    entry = std::make_shared<CacheEntry>(key, ordered);
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

}  // namespace intune
}  // namespace tensorflow
