#include "intune_tf/cc/kernels/session_registry.h"

#include <utility>

namespace tensorflow {
namespace intune {

SessionRegistry* SessionRegistry::Global() {
  static SessionRegistry* registry = new SessionRegistry();
  return registry;
}

std::shared_ptr<TuningSession> SessionRegistry::Create(
    const std::string& tag, int64_t ram_budget,
    ModelPtr tf_model) {
  mutex_lock l(mu_);
  auto session = std::make_shared<TuningSession>(
      next_id_++, tag, ram_budget > 0 ? ram_budget : default_ram_budget_,
      std::move(tf_model));
  sessions_[session->id()] = session;
  return session;
}

void SessionRegistry::SetDefaultRamBudget(int64_t bytes) {
  {
    mutex_lock l(mu_);
    default_ram_budget_ = bytes;
  }
  CacheStore::Global()->SetProcessBudget(bytes);
}

void SessionRegistry::Remove(int64_t id) {
  mutex_lock l(mu_);
  sessions_.erase(id);
}

std::vector<std::shared_ptr<TuningSession>> SessionRegistry::List() const {
  tf_shared_lock l(mu_);
  std::vector<std::shared_ptr<TuningSession>> live;
  for (const auto& [id, weak] : sessions_) {
    if (auto session = weak.lock()) live.push_back(std::move(session));
  }
  return live;
}

std::shared_ptr<TuningSession> SessionRegistry::Lookup(int64_t id) const {
  tf_shared_lock l(mu_);
  auto it = sessions_.find(id);
  return it != sessions_.end() ? it->second.lock() : nullptr;
}

std::shared_ptr<TuningSession> SessionRegistry::FindByModel(
    const model::Model* model) const {
  tf_shared_lock l(mu_);
  for (const auto& [id, weak] : sessions_) {
    auto session = weak.lock();
    if (session != nullptr && session->tf_model().get() == model) {
      return session;
    }
  }
  return nullptr;
}

}  // namespace intune
}  // namespace tensorflow
