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
  if (index < 0 || index >= static_cast<int64_t>(elements_.size())) {
    return false;
  }
  *out = elements_[index];
  return true;
}

bool CacheEntry::Append(int64_t index, const std::vector<Tensor>& element,
                        int64_t upstream_us) {
  mutex_lock l(mu_);
  if (complete_ || stopped_ ||
      index != static_cast<int64_t>(elements_.size()) ||
      (failed_at_ >= 0 && index >= failed_at_)) {
    return false;
  }
  const int64_t bytes = ElementBytes(element);
  if (bytes_ + bytes > limit_) {
    stopped_ = true;
    return false;
  }
  elements_.push_back(element);
  element_bytes_.push_back(bytes);
  bytes_ += bytes;
  upstream_us_ += std::max<int64_t>(upstream_us, 0);
  return true;
}

void CacheEntry::MarkEnd(int64_t count) {
  mutex_lock l(mu_);
  if (!stopped_ && failed_at_ < 0 &&
      count == static_cast<int64_t>(elements_.size())) {
    complete_ = true;
  }
}

void CacheEntry::FailedAt(int64_t index) {
  mutex_lock l(mu_);
  if (complete_) return;
  index = std::max<int64_t>(index, 0);
  if (failed_at_ < 0 || index < failed_at_) failed_at_ = index;
  complete_ = false;
  while (static_cast<int64_t>(elements_.size()) > failed_at_) {
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
  while (bytes_ > limit_ && !elements_.empty()) {
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
  return elements_.size();
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
  if (elements_.empty()) return 0;
  return static_cast<double>(upstream_us_) / elements_.size();
}

int64_t CacheEntry::dropped() const {
  mutex_lock l(mu_);
  return dropped_;
}

int64_t CacheEntry::DropLastLocked() {
  const int64_t last = element_bytes_.back();
  const int64_t n = elements_.size();
  if (upstream_us_ > 0) upstream_us_ -= upstream_us_ / n;
  elements_.pop_back();
  element_bytes_.pop_back();
  bytes_ -= last;
  return last;
}

void CacheEntry::ClearLocked() {
  elements_.clear();
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

std::shared_ptr<CacheEntry> CacheStore::Get(const std::string& key) {
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
    entry = std::make_shared<CacheEntry>(key);
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
