// The layout of the control ops' tables: what each counter and each column
// means, in output order. Python names the same entries in
// intune_tf/ops/session.py (COUNTERS, STAGE_COLUMNS); IntuneLayout returns
// these names so a test can check that both sides agree.
#ifndef INTUNE_TF_CC_LAYOUT_H_
#define INTUNE_TF_CC_LAYOUT_H_

namespace tensorflow {
namespace intune {

// Entries of the `counters` output of IntuneSessionCounters and IntuneObserve.
enum Counter : int {
  kCounterElements = 0,
  kCounterGapTimeUs,
  kCounterGapCount,
  kCounterGetNextTimeUs,
  kCounterBufferedBytes,
  kCounterPeakBufferedBytes,
  kCounterRamBudget,
  kCounterGuardShrinks,
  kCounterGuardOverBudget,
  kCounterCreatedUs,
  kCounterUnlowerableBytes,
  kCounterPinnedRamBudget,
  kCounterCacheBytes,
  kCounterCacheLimit,
  kCounterCacheElements,
  kCounterCacheComplete,
  kCounterCacheHits,
  kCounterCacheMisses,
  kCounterCacheSavedUs,
  kCounterCacheShrinks,
  kCounterRowStoreRows,
  kCounterRowStoreBytes,
  kCounterRowStoreGathered,
  kNumCounters,
};
inline constexpr const char* kCounterNames[kNumCounters] = {
    "elements",       "gap_time_us",         "gap_count",
    "get_next_time_us", "buffered_bytes",    "peak_buffered_bytes",
    "ram_budget",     "guard_shrinks",       "guard_over_budget",
    "created_us",     "unlowerable_bytes",   "pinned_ram_budget",
    "cache_bytes",    "cache_limit",         "cache_elements",
    "cache_complete", "cache_hits",          "cache_misses",
    "cache_saved_us", "cache_shrinks",       "row_store_rows",
    "row_store_bytes", "row_store_gathered"};

// Columns of the `stage_stats` output of IntuneObserve, one row per node.
enum StageColumn : int {
  kStageElements = 0,
  kStageProcessingTimeNs,
  kStageBufferedBytes,
  kStageBufferedElements,
  kStageBytesProduced,
  kStageBytesConsumed,
  kStageNodeId,
  kNumStageColumns,
};
inline constexpr const char* kStageColumnNames[kNumStageColumns] = {
    "elements",       "processing_time_ns", "buffered_bytes",
    "buffered_elements", "bytes_produced",  "bytes_consumed",
    "node_id"};

// Columns of the `knob_values` output of IntuneObserve.
enum KnobColumn : int { kKnobValue = 0, kKnobMin, kKnobMax, kNumKnobColumns };

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_LAYOUT_H_
