// Unit tests of the guard's arithmetic (budget_guard.h), hand-computed.
// Built and run by tests/test_cc_units.py with plain g++; prints
// "<passed> passed, <failed> failed" and exits non-zero on a failure.
#include "intune_tf/cc/kernels/budget_guard.h"

#include <cmath>
#include <limits>

#include "tests/cc/unit_test.h"

namespace {

using tensorflow::intune::Admission;
using tensorflow::intune::Admits;
using tensorflow::intune::GuardGroup;
using tensorflow::intune::GuardKnob;
using tensorflow::intune::GuardPlan;
using tensorflow::intune::PlanBudget;
using unit_test::Check;

#define CHECK_EQ(a, b) Check((a) == (b), #a " == " #b, __LINE__)
#define CHECK_NEAR(a, b) Check(std::fabs((a) - (b)) < 1e-9, #a " ~ " #b, __LINE__)

constexpr double kMb = 1 << 20;

void NoBudgetKeepsWhatIsWanted() {
  // Budget 0: no guard. Committed = 1 + (10 + 1) x 1 + 4 x 2 x 1 = 20 MB.
  GuardPlan plan = PlanBudget(0, kMb, {{10, 1, kMb}}, {{4, 2, kMb}});
  CHECK_EQ(plan.values[0], 10.0);
  CHECK_EQ(plan.limits[0], 4);
  CHECK_NEAR(plan.group_bytes[0], 8 * kMb);
  CHECK_NEAR(plan.committed, 20 * kMb);
}

void WithinTheBudgetNothingMoves() {
  // 1 + (10 + 1) x 1 + 4 x 2 x 1 = 20 MB <= 20 MB.
  GuardPlan plan = PlanBudget(20 * kMb, kMb, {{10, 1, kMb}}, {{4, 2, kMb}});
  CHECK_EQ(plan.values[0], 10.0);
  CHECK_EQ(plan.limits[0], 4);
  CHECK_NEAR(plan.committed, 20 * kMb);
}

void GroupsAreLoweredBeforeKnobs() {
  // Committed 20 MB, budget 17: the group gives 3 MB (8 -> 5 MB), a limit of
  // floor(5 / (2 x 1)) = 2 records per input; the knob keeps 10.
  GuardPlan plan = PlanBudget(17 * kMb, kMb, {{10, 1, kMb}}, {{4, 2, kMb}});
  CHECK_NEAR(plan.group_bytes[0], 5 * kMb);
  CHECK_EQ(plan.limits[0], 2);
  CHECK_EQ(plan.values[0], 10.0);
  CHECK_NEAR(plan.committed, 17 * kMb);
}

void KnobsGiveWhatGroupsCannot() {
  // Budget 8 MB: the group goes down to one record per input (2 MB, 6 MB
  // saved: 14 MB left), then the knob gives ceil((14 - 8) / 1) = 6 elements:
  // 10 -> 4. Committed 1 + 2 + (4 + 1) = 8 MB.
  GuardPlan plan = PlanBudget(8 * kMb, kMb, {{10, 1, kMb}}, {{4, 2, kMb}});
  CHECK_NEAR(plan.group_bytes[0], 2 * kMb);
  CHECK_EQ(plan.limits[0], 1);
  CHECK_EQ(plan.values[0], 4.0);
  CHECK_NEAR(plan.committed, 8 * kMb);
}

void MinimaAreKeptEvenOverTheBudget() {
  // Budget 1 byte: group at one record per input (2 MB), knob at its min 1:
  // committed 1 + 2 + (1 + 1) = 5 MB > budget.
  GuardPlan plan = PlanBudget(1, kMb, {{10, 1, kMb}}, {{4, 2, kMb}});
  CHECK_EQ(plan.limits[0], 1);
  CHECK_EQ(plan.values[0], 1.0);
  CHECK_NEAR(plan.committed, 5 * kMb);
}

void PartialElementsRoundTheKnobDown() {
  // Knob of 3 MB elements wanting 5: committed (5 + 1) x 3 = 18 MB; budget
  // 13 MB: excess 5 MB is ceil(5 / 3) = 2 elements: 5 -> 3, committed 12 MB.
  GuardPlan plan = PlanBudget(13 * kMb, 0, {{5, 1, 3 * kMb}}, {});
  CHECK_EQ(plan.values[0], 3.0);
  CHECK_NEAR(plan.committed, 12 * kMb);
}

void KnobsAreLoweredInOrder() {
  // Two 1 MB knobs wanting 4 each: (4 + 1) x 2 = 10 MB; budget 7: the first
  // gives 3 (4 -> 1), the second keeps 4.
  GuardPlan plan = PlanBudget(7 * kMb, 0, {{4, 1, kMb}, {4, 1, kMb}}, {});
  CHECK_EQ(plan.values[0], 1.0);
  CHECK_EQ(plan.values[1], 4.0);
  CHECK_NEAR(plan.committed, 7 * kMb);
}

void GroupAllowanceIsInBytesNotWholeRounds() {
  // 8 inputs x 256 records x 0.25 MB = 512 MB; budget 24 MB, fixed 0, a
  // prefetch knob of 1 (2 x 0.25 = 0.5 MB): the group may hold 23.5 MB, a
  // limit of floor(23.5 / (8 x 0.25)) = 11 records per input.
  GuardPlan plan =
      PlanBudget(24 * kMb, 0, {{1, 1, kMb / 4}}, {{256, 8, kMb / 4}});
  CHECK_NEAR(plan.group_bytes[0], 23.5 * kMb);
  CHECK_EQ(plan.limits[0], 11);
  CHECK_EQ(plan.values[0], 1.0);
  CHECK_NEAR(plan.committed, 24 * kMb);
}

// An input holding 2 of its limit 4 records, in a group holding 10 MB of
// 1 MB records, allowance 14 MB, budget 24 MB, 8 MB buffered elsewhere.
Admission Holding2() {
  Admission a;
  a.held_records = 2;
  a.limit = 4;
  a.held_bytes = 10 * kMb;
  a.reserved = 1;
  a.record_bytes = kMb;
  a.allowance = 14 * kMb;
  a.outside_bytes = 8 * kMb;
  a.budget = 24 * kMb;
  return a;
}

void AdmissionFitsTheAllowanceAndTheBudget() {
  // 10 + 1 x 1 = 11 <= 14 MB, and 8 + 11 = 19 <= 24 MB.
  CHECK_EQ(Admits(Holding2()), true);
  // 3 other inputs reading or empty: 10 + 4 x 1 = 14 <= 14 MB, and
  // 8 + 14 = 22 <= 24.
  Admission a = Holding2();
  a.reserved = 4;
  CHECK_EQ(Admits(a), true);
  // One more: 15 > 14 MB.
  a.reserved = 5;
  CHECK_EQ(Admits(a), false);
}

void ReadingInputsKeepTheirRoom() {
  // Two inputs past admission, neither record landed: 10 + 3 x 1 = 13 MB
  // fits 14; had the two been forgotten (reserved 1), a third and a fourth
  // would each see 11 MB and pass, to land at 10 + 4 = 14, then 15 MB.
  Admission a = Holding2();
  a.held_bytes = 12 * kMb;
  a.reserved = 3;  // this one and two reading
  CHECK_EQ(Admits(a), false);  // 12 + 3 = 15 > 14
  a.reserved = 1;
  CHECK_EQ(Admits(a), true);  // 12 + 1 = 13
}

void WhatOtherStagesBufferNowCounts() {
  // The allowance holds (11 <= 14 MB) but the other stages grew to 14 MB:
  // 14 + 11 = 25 > 24 MB.
  Admission a = Holding2();
  a.outside_bytes = 14 * kMb;
  CHECK_EQ(Admits(a), false);
  a.outside_bytes = 13 * kMb;  // 13 + 11 = 24 <= 24
  CHECK_EQ(Admits(a), true);
  a.budget = 0;  // no budget: the allowance alone
  a.outside_bytes = 100 * kMb;
  CHECK_EQ(Admits(a), true);
}

void TheFirstRecordAndTheLimit() {
  // An input holding none reads whatever the bytes say.
  Admission a = Holding2();
  a.held_records = 0;
  a.outside_bytes = 100 * kMb;
  CHECK_EQ(Admits(a), true);
  // At its limit, never; with an infinite allowance, up to the limit.
  a = Holding2();
  a.held_records = 4;
  a.allowance = std::numeric_limits<double>::infinity();
  CHECK_EQ(Admits(a), false);
  a.held_records = 3;
  a.outside_bytes = 100 * kMb;
  CHECK_EQ(Admits(a), true);
}

}  // namespace

int main() {
  AdmissionFitsTheAllowanceAndTheBudget();
  ReadingInputsKeepTheirRoom();
  WhatOtherStagesBufferNowCounts();
  TheFirstRecordAndTheLimit();
  NoBudgetKeepsWhatIsWanted();
  WithinTheBudgetNothingMoves();
  GroupsAreLoweredBeforeKnobs();
  KnobsGiveWhatGroupsCannot();
  MinimaAreKeptEvenOverTheBudget();
  PartialElementsRoundTheKnobDown();
  KnobsAreLoweredInOrder();
  GroupAllowanceIsInBytesNotWholeRounds();
  return unit_test::Summary();
}
