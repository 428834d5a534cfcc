// Bounded interleave buffers: how many records each input of a parallel
// interleave of records may hold, set by the budget guard.
//
// TF's ParallelInterleaveDatasetV4 fills each input's output buffer up to its
// fixed buffer_output_elements (the cap, raised by the rewrite's
// raise_interleave_buffers). Two ops share one BoundedBuffers per interleave
// and iterator:
// - IntuneUntrackedDataset with a `buffer_group`, around what the
//   interleave's function returns: each of its iterators is one input (a
//   slot); before reading a record it waits while its slot holds `limit`
//   records;
// - IntuneBufferReleaseDataset above the interleave: each record that leaves
//   the interleave leaves its slot.
// A record is known by the data of its first component (a scalar: its buffer
// travels through the interleave unchanged); an input's records leave in the
// order they came.
//
// Admission (budget_guard.h Admits): before an input reads a record,
// WaitForRoom holds it unless the record fits the input's `limit` (records),
// the group's byte allowance (from the budget guard's PlanBudget) and,
// beside what the pipeline's other stages buffer at that moment, the RAM
// budget. A record is estimated at the largest seen, and room is kept for
// the records that may land without asking: one per other input reading
// now (admitted, its record not yet produced) and one per other input
// holding none (an input's first record is never held). Until the guard has
// decided (no record seen), the limit is one record per input and the
// allowance 0: each input reads its first record only. So, with records no
// larger than the largest seen, the group's records and the other stages'
// buffers never pass the budget at an admission unless one record per live
// input already does, whether or not the guard's thread gets the CPU.
// Released records leave the count; nothing is dropped or reordered.
//
// An input with no record is never held, and the consumer of a
// deterministic interleave only ever waits for one input, so it always gets
// its record, provided a worker thread is free to read it: the rewrite gives
// the interleave as many workers as its cycle length (held workers use no
// CPU). As a last resort, when the consumer has waited `kStallUs`, no input
// is reading and none has produced in that time, a held input reads one
// record (counted in stall_escapes()).
#ifndef INTUNE_TF_CC_KERNELS_BOUNDED_BUFFERS_H_
#define INTUNE_TF_CC_KERNELS_BOUNDED_BUFFERS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "tensorflow/core/framework/model.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/thread_annotations.h"

namespace tensorflow {
namespace intune {

class BoundedBuffers {
 public:
  // How long the consumer waits, with no input producing, before held inputs
  // read one record each.
  static constexpr int64_t kStallUs = 200'000;

  explicit BoundedBuffers(int64_t cap);

  // TF's per-input buffer: the most records an input holds.
  int64_t cap() const { return cap_; }
  // The records per input the guard allows: one until it has seen records
  // and decided.
  int64_t limit() const { return limit_.load(); }
  // The bytes the group's records may total (infinite: untracked).
  double allowance() const TF_LOCKS_EXCLUDED(mu_);
  // Sets both; a `limit` at the cap and an infinite allowance stop the
  // tracking (no budget).
  // `budget` is the pipeline's RAM budget: admission also checks the group's
  // records beside what the other stages buffer at that moment (<= 0: none).
  void SetAllowance(int64_t limit, double bytes, int64_t budget)
      TF_LOCKS_EXCLUDED(mu_);

  // Inputs alive now.
  int64_t inputs() const TF_LOCKS_EXCLUDED(mu_);
  // The most inputs alive at once so far.
  int64_t max_inputs() const TF_LOCKS_EXCLUDED(mu_);
  // Mean bytes of the records read so far (0 before the first).
  double bytes_per_record() const;
  // The admission estimate: the bytes of the largest record read so far (0
  // before the first).
  int64_t largest_record() const { return largest_record_.load(); }
  // Bytes of the records the group holds now (read, not yet released).
  int64_t held_bytes() const TF_LOCKS_EXCLUDED(mu_);
  // The most bytes the pipeline counted at the moment a record was admitted:
  // the records this group held then, plus what every other node of the
  // pipeline's model buffered (null `model` set: the group's own only).
  int64_t peak_counted_bytes() const { return peak_counted_bytes_.load(); }
  void set_model(std::weak_ptr<data::model::Model> model)
      TF_LOCKS_EXCLUDED(mu_);

  // The interleave's own node in the model.
  void set_node(std::shared_ptr<data::model::Node> node)
      TF_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<data::model::Node> node() const TF_LOCKS_EXCLUDED(mu_);

  int64_t AddInput() TF_LOCKS_EXCLUDED(mu_);
  void RemoveInput(int64_t input) TF_LOCKS_EXCLUDED(mu_);
  // Blocks until `input` may read a record (budget_guard.h Admits), or
  // `cancelled`. From then until Produced or ReadNothing the input is
  // reading: other inputs keep room for its record.
  void WaitForRoom(int64_t input, const std::function<bool()>& cancelled)
      TF_LOCKS_EXCLUDED(mu_);
  void Produced(int64_t input, const std::vector<Tensor>& record)
      TF_LOCKS_EXCLUDED(mu_);
  // The read ended without a record (end of input or an error).
  void ReadNothing(int64_t input) TF_LOCKS_EXCLUDED(mu_);
  // How often the last resort let a held input read.
  int64_t stall_escapes() const { return stall_escapes_.load(); }
  // A record left the interleave.
  void Released(const std::vector<Tensor>& record) TF_LOCKS_EXCLUDED(mu_);
  // The consumer is (or no longer is) waiting for the interleave.
  void SetConsumerWaiting(bool waiting);
  // While an iterator checkpoint is written, no input is held: TF's
  // interleave saves once every worker has stopped, and a worker stops only
  // when its input's buffer is full (at the cap) or the input ends.
  void SetSaving(bool saving) TF_LOCKS_EXCLUDED(mu_);

 private:
  struct Record {
    const void* key;
    int64_t bytes;
  };
  using Records = std::deque<Record>;
  struct Slot {
    Records records;  // oldest first
    bool reading = false;
  };

  bool Tracking() const { return tracking_.load(); }
  // Whether `input`, holding `held` records, may read one more now.
  bool Admits(int64_t input, const Slot& slot, int64_t outside_bytes) const
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyReading() const TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes buffered by the model's nodes other than the group's interleave.
  int64_t OutsideBytes() const TF_LOCKS_EXCLUDED(mu_);

  const int64_t cap_;
  std::atomic<int64_t> limit_;
  std::atomic<bool> tracking_{true};
  std::atomic<int64_t> records_{0};
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> largest_record_{0};
  std::atomic<int64_t> peak_counted_bytes_{0};
  std::atomic<int64_t> consumer_waiting_since_us_{0};
  std::atomic<int64_t> last_produced_us_{0};
  std::atomic<int64_t> saving_{0};
  std::atomic<int64_t> stall_escapes_{0};

  mutable mutex mu_;
  condition_variable room_;
  int64_t next_input_ TF_GUARDED_BY(mu_) = 0;
  int64_t max_inputs_ TF_GUARDED_BY(mu_) = 0;
  double allowance_ TF_GUARDED_BY(mu_) = 0;
  int64_t budget_ TF_GUARDED_BY(mu_) = 0;
  int64_t held_bytes_ TF_GUARDED_BY(mu_) = 0;
  std::weak_ptr<data::model::Model> model_ TF_GUARDED_BY(mu_);
  // What each live input holds (while tracking).
  absl::flat_hash_map<int64_t, Slot> inputs_ TF_GUARDED_BY(mu_);
  std::shared_ptr<data::model::Node> node_ TF_GUARDED_BY(mu_);
};

// The BoundedBuffers of interleave `group` in the pipeline of `model`,
// made with `cap` if there is none yet.
std::shared_ptr<BoundedBuffers> GetBoundedBuffers(
    const data::model::Model* model, const std::string& group, int64_t cap);
// The existing one, or null.
std::shared_ptr<BoundedBuffers> FindBoundedBuffers(
    const data::model::Model* model, const std::string& group);
// Every live one of the pipeline of `model`.
std::vector<std::shared_ptr<BoundedBuffers>> BoundedBuffersOf(
    const data::model::Model* model);

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_BOUNDED_BUFFERS_H_
