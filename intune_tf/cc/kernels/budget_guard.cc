#include "intune_tf/cc/kernels/budget_guard.h"

#include <algorithm>
#include <cmath>

namespace tensorflow {
namespace intune {

GuardPlan PlanBudget(double budget, double fixed_bytes,
                     const std::vector<GuardKnob>& knobs,
                     const std::vector<GuardGroup>& groups) {
  GuardPlan plan;
  plan.committed = fixed_bytes;
  for (const GuardGroup& g : groups) {
    const int64_t cap = std::max<int64_t>(g.cap, 1);
    const double full =
        static_cast<double>(cap) * std::max<int64_t>(g.inputs, 1) *
        g.bytes_per_record;
    plan.limits.push_back(cap);
    plan.group_bytes.push_back(full);
    plan.committed += full;
  }
  for (const GuardKnob& k : knobs) {
    plan.values.push_back(k.wanted);
    plan.committed += (k.wanted + 1) * k.bytes_per_element;
  }
  if (budget <= 0) return plan;
  for (size_t i = 0; i < groups.size() && plan.committed > budget; ++i) {
    const GuardGroup& g = groups[i];
    const double per_round = std::max<int64_t>(g.inputs, 1) *
                             g.bytes_per_record;  // one record per input
    const double lowered =
        std::max(per_round, plan.group_bytes[i] - (plan.committed - budget));
    plan.committed -= plan.group_bytes[i] - lowered;
    plan.group_bytes[i] = lowered;
    plan.limits[i] = std::clamp<int64_t>(
        static_cast<int64_t>(std::floor(lowered / per_round)), 1,
        plan.limits[i]);
  }
  for (size_t i = 0; i < knobs.size() && plan.committed > budget; ++i) {
    const GuardKnob& k = knobs[i];
    const double excess_elements =
        std::ceil((plan.committed - budget) / k.bytes_per_element);
    const double lowered =
        std::max(k.min, plan.values[i] - excess_elements);
    if (lowered < plan.values[i]) {
      plan.committed -= (plan.values[i] - lowered) * k.bytes_per_element;
      plan.values[i] = lowered;
    }
  }
  return plan;
}

bool Admits(const Admission& a) {
  if (a.held_records <= 0) return true;
  if (a.held_records >= a.limit) return false;
  if (std::isinf(a.allowance)) return true;
  const double needed = static_cast<double>(a.held_bytes) +
                        static_cast<double>(a.reserved) * a.record_bytes;
  if (needed > a.allowance) return false;
  return a.budget <= 0 ||
         static_cast<double>(a.outside_bytes) + needed <=
             static_cast<double>(a.budget);
}

}  // namespace intune
}  // namespace tensorflow
