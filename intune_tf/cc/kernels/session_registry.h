// The process-wide registry of live tuning sessions, one per iterator of an
// IntuneRootDataset: the root iterator creates and removes its session, the
// control ops find it by id.
#ifndef INTUNE_TF_CC_KERNELS_SESSION_REGISTRY_H_
#define INTUNE_TF_CC_KERNELS_SESSION_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "intune_tf/cc/kernels/tuning_session.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/thread_annotations.h"

namespace tensorflow {
namespace intune {

class SessionRegistry {
 public:
  static SessionRegistry* Global();

  // A new session, whose RAM budget is `ram_budget` bytes (the user's), or
  // with 0 the default budget in force now (`SetDefaultRamBudget`; 0, no
  // guard, until one is set).
  std::shared_ptr<TuningSession> Create(const std::string& tag,
                                        int64_t ram_budget,
                                        ModelPtr tf_model)
      TF_LOCKS_EXCLUDED(mu_);
  // The budget of sessions made from now on without one of their own: the
  // tuner's budget service resolves it from this process's machine and
  // re-sets it as memory changes. It is also the process's budget for all
  // its caches and buffers (CacheStore::SetProcessBudget).
  void SetDefaultRamBudget(int64_t bytes) TF_LOCKS_EXCLUDED(mu_);
  void Remove(int64_t id) TF_LOCKS_EXCLUDED(mu_);
  // Live sessions, oldest first.
  std::vector<std::shared_ptr<TuningSession>> List() const
      TF_LOCKS_EXCLUDED(mu_);
  // The live session `id`, else null (its iterator was destroyed or
  // exhausted and released).
  std::shared_ptr<TuningSession> Lookup(int64_t id) const
      TF_LOCKS_EXCLUDED(mu_);
  // The live session whose model is `model`, else null (an iterator below
  // a root finds its session through the model in its context).
  std::shared_ptr<TuningSession> FindByModel(const model::Model* model) const
      TF_LOCKS_EXCLUDED(mu_);

 private:
  mutable mutex mu_;
  int64_t next_id_ TF_GUARDED_BY(mu_) = 1;
  int64_t default_ram_budget_ TF_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::weak_ptr<TuningSession>> sessions_ TF_GUARDED_BY(mu_);
};

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_SESSION_REGISTRY_H_
