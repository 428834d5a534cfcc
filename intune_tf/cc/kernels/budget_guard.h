// The RAM budget guard's arithmetic, as a pure function of what it counts.
//
// No TF types: it compiles with plain g++ (tests/cc/budget_guard_test.cc).
// TuningSession::EnforceBudget gathers the inputs from the model and the
// bounded interleave buffers, calls PlanBudget, and writes the outputs: knob
// values to the model's parameters, byte allowances and per-input limits to
// the BoundedBuffers, which admit a record only within them.
#ifndef INTUNE_TF_CC_KERNELS_BUDGET_GUARD_H_
#define INTUNE_TF_CC_KERNELS_BUDGET_GUARD_H_

#include <cstdint>
#include <vector>

namespace tensorflow {
namespace intune {

// A memory knob of a stage: a buffer size or a parallelism. The stage holds
// at most (value + 1) elements: its buffer and the element its consumer is
// taking.
struct GuardKnob {
  double wanted = 0;             // what the user or the policy asked for
  double min = 0;                // the lowest value the knob takes
  double bytes_per_element = 0;  // > 0
};

// A bounded interleave (bounded_buffers.h): `inputs` inputs of at most `cap`
// records each. A record is counted from the moment an input reads it until
// it leaves the interleave, so the group holds at most its records.
struct GuardGroup {
  int64_t cap = 1;
  int64_t inputs = 1;
  double bytes_per_record = 0;  // the estimate: the largest record seen, > 0
};

struct GuardPlan {
  std::vector<double> values;        // per knob, in [min, wanted]
  std::vector<int64_t> limits;       // per group: records per input, [1, cap]
  std::vector<double> group_bytes;   // per group: the bytes it may hold
  double committed = 0;  // fixed + groups' allowances + knobs' (value + 1)
};

// Lowers what the budget requires, bounded interleaves first (InTune's own
// deeper buffers), then the knobs in their order, each no lower than its
// minimum (a group: one record per input). `committed` exceeds `budget` only
// when the minima do. A budget <= 0 means no guard: everything as wanted.
GuardPlan PlanBudget(double budget, double fixed_bytes,
                     const std::vector<GuardKnob>& knobs,
                     const std::vector<GuardGroup>& groups);

// What a bounded interleave knows when one of its inputs asks to read a
// record (bounded_buffers.h).
struct Admission {
  int64_t held_records = 0;  // the records this input holds
  int64_t limit = 1;         // the records an input may hold
  int64_t held_bytes = 0;    // the bytes of the records the group holds
  // Records that may land without asking again: this one, one for each
  // other input reading now, one for each other input holding none.
  int64_t reserved = 1;
  int64_t record_bytes = 0;   // the estimate: the largest record seen
  double allowance = 0;       // the group's bytes (infinite: no budget)
  int64_t outside_bytes = 0;  // what the rest of the pipeline buffers now
  int64_t budget = 0;         // the pipeline's RAM budget (<= 0: none)
};

// Whether the input may read: always its first record; else within its
// limit, and the group's records with every reserved one fit both the
// group's allowance and, beside what the other stages buffer now, the
// budget.
bool Admits(const Admission& a);

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_BUDGET_GUARD_H_
