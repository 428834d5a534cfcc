// What became of InTune's cache for a pipeline: placed, with where and why
// there, or declined, with why not. One decision per session, made in two
// steps by the two that know: the rewrite insert_cache places the cache or
// finds no place for it (FindCachePoint, rewrites/passes.h), and the cache's
// kernel (kernels/cache_dataset_op.cc) may decline a placed cache at run
// time (too little room for an epoch, files too costly to check, elements
// it cannot count, tf.data service's splits). The session keeps the last
// word (TuningSession::DecideCache), and everything that reports the cache
// reads it from there: `TuningSession.cache()` in Python (its `state`, an
// `intune_tf.CacheState`, is spelled as CacheStateName gives), and through
// it the tuner's log, the status file, the decision log and the Keras logs.
#ifndef INTUNE_TF_CC_CACHE_DECISION_H_
#define INTUNE_TF_CC_CACHE_DECISION_H_

#include <string>
#include <utility>

namespace tensorflow {
namespace intune {

enum class CacheState {
  kOff,       // the `cache` option is off (the rewrite did not run)
  kPlaced,    // a cache sits above `point`
  kDeclined,  // no cache, for `reason`
};

// The state as intune_tf.records.CacheState spells it.
inline const char* CacheStateName(CacheState state) {
  switch (state) {
    case CacheState::kPlaced:
      return "placed";
    case CacheState::kDeclined:
      return "declined";
    case CacheState::kOff:
      break;
  }
  return "off";
}

struct CacheDecision {
  CacheState state = CacheState::kOff;
  // The node whose elements the cache holds: where it is placed, or, for a
  // cache the kernel declined, where it was; empty when the rewrite found
  // no place (or for tf.data service's splits, which no place can cache).
  std::string point;
  // Why there (placed), or why no cache (declined), in words that follow
  // "no cache: " when told; empty when off.
  std::string reason;

  static CacheDecision Placed(std::string point, std::string reason) {
    return {CacheState::kPlaced, std::move(point), std::move(reason)};
  }
  static CacheDecision Declined(std::string point, std::string reason) {
    return {CacheState::kDeclined, std::move(point), std::move(reason)};
  }
  bool placed() const { return state == CacheState::kPlaced; }
};

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_CACHE_DECISION_H_
