#include "intune_tf/cc/kernels/bounded_buffers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "intune_tf/cc/kernels/budget_guard.h"
#include "tensorflow/core/platform/env.h"

namespace tensorflow {
namespace intune {
namespace {

// How often a held input checks for cancellation and a stalled consumer.
constexpr int64_t kPollUs = 10'000;

int64_t NowUs() { return static_cast<int64_t>(Env::Default()->NowMicros()); }

const void* Key(const std::vector<Tensor>& record) {
  return record.empty() ? nullptr : record[0].data();
}

class Registry {
 public:
  static Registry* Global() {
    static Registry* registry = new Registry();
    return registry;
  }

  std::shared_ptr<BoundedBuffers> Get(const data::model::Model* model,
                                      const std::string& group, int64_t cap,
                                      bool create) TF_LOCKS_EXCLUDED(mu_) {
    mutex_lock l(mu_);
    Prune();
    auto& slot = groups_[{model, group}];
    std::shared_ptr<BoundedBuffers> found = slot.lock();
    if (found == nullptr && create) {
      found = std::make_shared<BoundedBuffers>(cap);
      slot = found;
    }
    return found;
  }

  std::vector<std::shared_ptr<BoundedBuffers>> Of(
      const data::model::Model* model) TF_LOCKS_EXCLUDED(mu_) {
    std::vector<std::shared_ptr<BoundedBuffers>> result;
    mutex_lock l(mu_);
    for (auto it = groups_.lower_bound({model, ""});
         it != groups_.end() && it->first.first == model; ++it) {
      if (auto group = it->second.lock()) result.push_back(std::move(group));
    }
    return result;
  }

 private:
  void Prune() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = groups_.begin(); it != groups_.end();) {
      it = it->second.expired() ? groups_.erase(it) : std::next(it);
    }
  }

  mutex mu_;
  std::map<std::pair<const data::model::Model*, std::string>,
           std::weak_ptr<BoundedBuffers>>
      groups_ TF_GUARDED_BY(mu_);
};

}  // namespace

BoundedBuffers::BoundedBuffers(int64_t cap)
    : cap_(std::max<int64_t>(cap, 1)), limit_(1) {}

void BoundedBuffers::SetAllowance(int64_t limit, double bytes,
                                  int64_t budget) {
  limit = std::clamp<int64_t>(limit, 1, cap_);
  // Inputs are held only below the cap: at the cap the budget already holds
  // every input's records (PlanBudget lowers the limit first).
  const bool tracking = limit < cap_;
  mutex_lock l(mu_);
  if (limit_.load() == limit && allowance_ == bytes && budget_ == budget &&
      tracking_.load() == tracking) {
    return;
  }
  limit_.store(limit);
  allowance_ = bytes;
  budget_ = budget;
  // Records counted while tracking are forgotten when it stops: a later
  // start counts from empty (at most `cap` records per input uncounted).
  if (!tracking) {
    for (auto& [unused, slot] : inputs_) slot.records.clear();
    held_bytes_ = 0;
  }
  tracking_.store(tracking);
  room_.notify_all();
}

double BoundedBuffers::allowance() const {
  mutex_lock l(mu_);
  return allowance_;
}

int64_t BoundedBuffers::max_inputs() const {
  mutex_lock l(mu_);
  return max_inputs_;
}

int64_t BoundedBuffers::held_bytes() const {
  mutex_lock l(mu_);
  return held_bytes_;
}

void BoundedBuffers::set_model(std::weak_ptr<data::model::Model> model) {
  mutex_lock l(mu_);
  model_ = std::move(model);
}

bool BoundedBuffers::Admits(int64_t input, const Slot& slot,
                            int64_t outside_bytes) const {
  Admission a;
  a.held_records = static_cast<int64_t>(slot.records.size());
  a.limit = limit_.load();
  a.held_bytes = held_bytes_;
  for (const auto& [other, other_slot] : inputs_) {
    if (other != input && (other_slot.reading || other_slot.records.empty())) {
      ++a.reserved;
    }
  }
  a.record_bytes = largest_record_.load();
  a.allowance = allowance_;
  a.outside_bytes = outside_bytes;
  a.budget = budget_;
  return intune::Admits(a);
}

bool BoundedBuffers::AnyReading() const {
  for (const auto& [unused, slot] : inputs_) {
    if (slot.reading) return true;
  }
  return false;
}

int64_t BoundedBuffers::OutsideBytes() const {
  std::shared_ptr<data::model::Model> model;
  std::shared_ptr<data::model::Node> own;
  {
    mutex_lock l(mu_);
    model = model_.lock();
    own = node_;
  }
  if (model == nullptr) return 0;
  int64_t bytes = 0;
  std::vector<std::shared_ptr<data::model::Node>> pending = {model->output()};
  while (!pending.empty()) {
    std::shared_ptr<data::model::Node> node = std::move(pending.back());
    pending.pop_back();
    if (node == nullptr) continue;
    if (node != own) bytes += node->buffered_bytes();
    for (auto& input : node->inputs()) pending.push_back(std::move(input));
  }
  return bytes;
}

int64_t BoundedBuffers::inputs() const {
  mutex_lock l(mu_);
  return static_cast<int64_t>(inputs_.size());
}

double BoundedBuffers::bytes_per_record() const {
  const int64_t records = records_.load();
  return records > 0 ? static_cast<double>(bytes_.load()) / records : 0.0;
}

void BoundedBuffers::set_node(std::shared_ptr<data::model::Node> node) {
  mutex_lock l(mu_);
  node_ = std::move(node);
}

std::shared_ptr<data::model::Node> BoundedBuffers::node() const {
  mutex_lock l(mu_);
  return node_;
}

int64_t BoundedBuffers::AddInput() {
  mutex_lock l(mu_);
  const int64_t id = next_input_++;
  inputs_[id];
  max_inputs_ = std::max<int64_t>(max_inputs_, inputs_.size());
  return id;
}

void BoundedBuffers::RemoveInput(int64_t input) {
  mutex_lock l(mu_);
  auto found = inputs_.find(input);
  if (found == inputs_.end()) return;
  for (const Record& record : found->second.records) {
    held_bytes_ -= record.bytes;
  }
  inputs_.erase(found);
  room_.notify_all();
}

void BoundedBuffers::WaitForRoom(int64_t input,
                                 const std::function<bool()>& cancelled) {
  if (!Tracking()) return;
  // What the other stages buffer is read only where it decides (a walk of
  // the model), and without the lock (OutsideBytes takes it): a change in
  // between is seen at the next poll.
  bool read_outside = false;
  while (true) {
    const int64_t outside = read_outside ? OutsideBytes() : 0;
    mutex_lock l(mu_);
    auto found = inputs_.find(input);
    if (found == inputs_.end()) return;
    Slot& slot = found->second;
    const bool unbounded = !Tracking() || saving_.load() > 0;
    if (unbounded || Admits(input, slot, outside)) {
      if (!unbounded && !read_outside && budget_ > 0 &&
          !slot.records.empty() && !std::isinf(allowance_)) {
        read_outside = true;
        continue;
      }
      slot.reading = true;
      return;
    }
    if (cancelled()) return;
    // The last resort: the consumer waits, no input reads or has produced
    // for kStallUs (a slow read is no stall).
    const int64_t now = NowUs();
    const int64_t waiting_since = consumer_waiting_since_us_.load();
    if (waiting_since > 0 && now - waiting_since > kStallUs &&
        now - last_produced_us_.load() > kStallUs && !AnyReading()) {
      slot.reading = true;
      stall_escapes_.fetch_add(1);
      return;
    }
    room_.wait_for(l, std::chrono::microseconds(kPollUs));
  }
}

void BoundedBuffers::ReadNothing(int64_t input) {
  if (!Tracking()) return;
  mutex_lock l(mu_);
  auto found = inputs_.find(input);
  if (found == inputs_.end()) return;
  found->second.reading = false;
  room_.notify_all();
}

void BoundedBuffers::Produced(int64_t input,
                              const std::vector<Tensor>& record) {
  int64_t bytes = 0;
  for (const Tensor& t : record) bytes += t.TotalBytes();
  bytes_.fetch_add(bytes);
  records_.fetch_add(1);
  int64_t largest = largest_record_.load();
  while (bytes > largest &&
         !largest_record_.compare_exchange_weak(largest, bytes)) {
  }
  // Untracked (no budget), no input waits: no clock reading.
  if (!Tracking()) return;
  last_produced_us_.store(NowUs());
  const int64_t outside = OutsideBytes();
  int64_t counted;
  {
    mutex_lock l(mu_);
    auto found = inputs_.find(input);
    if (found == inputs_.end()) return;
    found->second.records.push_back({Key(record), bytes});
    found->second.reading = false;
    held_bytes_ += bytes;
    counted = outside + held_bytes_;
  }
  int64_t peak = peak_counted_bytes_.load();
  while (counted > peak &&
         !peak_counted_bytes_.compare_exchange_weak(peak, counted)) {
  }
}

void BoundedBuffers::Released(const std::vector<Tensor>& record) {
  if (!Tracking()) return;
  const void* key = Key(record);
  mutex_lock l(mu_);
  for (auto& [unused, slot] : inputs_) {
    Records& records = slot.records;
    if (!records.empty() && records.front().key == key) {
      held_bytes_ -= records.front().bytes;
      records.pop_front();
      room_.notify_all();
      return;
    }
  }
}

void BoundedBuffers::SetSaving(bool saving) {
  saving_.fetch_add(saving ? 1 : -1);
  mutex_lock l(mu_);
  room_.notify_all();
}

void BoundedBuffers::SetConsumerWaiting(bool waiting) {
  consumer_waiting_since_us_.store(waiting && Tracking() ? NowUs() : 0);
}

std::shared_ptr<BoundedBuffers> GetBoundedBuffers(
    const data::model::Model* model, const std::string& group, int64_t cap) {
  return Registry::Global()->Get(model, group, cap, /*create=*/true);
}

std::shared_ptr<BoundedBuffers> FindBoundedBuffers(
    const data::model::Model* model, const std::string& group) {
  return Registry::Global()->Get(model, group, 0, /*create=*/false);
}

std::vector<std::shared_ptr<BoundedBuffers>> BoundedBuffersOf(
    const data::model::Model* model) {
  return Registry::Global()->Of(model);
}

}  // namespace intune
}  // namespace tensorflow
