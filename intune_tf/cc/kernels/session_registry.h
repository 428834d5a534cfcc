// The process-wide registry of live tuning sessions, one per iterator of an
// IntuneDataset: the root iterator creates and removes its session, the
// control ops find it by id.
#ifndef INTUNE_TF_CC_KERNELS_SESSION_REGISTRY_H_
#define INTUNE_TF_CC_KERNELS_SESSION_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "intune_tf/cc/kernels/tuning_session.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/thread_annotations.h"

namespace tensorflow {
namespace intune {

class SessionRegistry {
 public:
  static SessionRegistry* Global();

  std::shared_ptr<TuningSession> Create(const std::string& tag,
                                        int64_t ram_budget,
                                        ModelPtr tf_model)
      TF_LOCKS_EXCLUDED(mu_);
  void Remove(int64_t id) TF_LOCKS_EXCLUDED(mu_);
  // Live sessions, oldest first.
  std::vector<std::shared_ptr<TuningSession>> List() const
      TF_LOCKS_EXCLUDED(mu_);
  // The live session `id`, else NotFound.
  absl::StatusOr<std::shared_ptr<TuningSession>> Lookup(int64_t id) const
      TF_LOCKS_EXCLUDED(mu_);

 private:
  mutable mutex mu_;
  int64_t next_id_ TF_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::weak_ptr<TuningSession>> sessions_ TF_GUARDED_BY(mu_);
};

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_SESSION_REGISTRY_H_
