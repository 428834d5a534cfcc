#include "intune_tf/cc/kernels/node_access.h"

#include <algorithm>

namespace tensorflow {
namespace intune {

std::vector<std::shared_ptr<model::Parameter>> NodeAccess::TunableParameters(
    model::Node& node) {
  std::vector<std::shared_ptr<model::Parameter>> result;
  {
    tf_shared_lock l(Mutex(node));
    for (const auto& entry : node.*(&NodeAccess::parameters_)) {
      const std::shared_ptr<model::Parameter>& p = entry.second;
      if (p != nullptr && p->state != nullptr && p->state->tunable) {
        result.push_back(p);
      }
    }
  }
  std::sort(result.begin(), result.end(),
            [](const std::shared_ptr<model::Parameter>& a,
               const std::shared_ptr<model::Parameter>& b) {
              return a->name < b->name;
            });
  return result;
}

void CollectNodes(const std::shared_ptr<model::Node>& node,
                  std::vector<std::shared_ptr<model::Node>>* out) {
  if (node == nullptr) return;
  out->push_back(node);
  for (const auto& input : node->inputs()) CollectNodes(input, out);
}

double BytesPerElement(const model::Node& node) {
  const int64_t buffered = node.buffered_elements();
  if (buffered > 0) {
    return static_cast<double>(node.buffered_bytes()) / buffered;
  }
  const int64_t produced = node.num_elements();
  if (produced > 0) {
    return static_cast<double>(node.bytes_produced()) / produced;
  }
  return 0.0;
}

double KnobMin(const model::Parameter& p) {
  return p.name == kBufferSize ? std::max(1.0, p.min) : p.min;
}

double RawValue(const model::Parameter& p) {
  if (p.state == nullptr) return p.value;
  tf_shared_lock l(*p.state->mu);
  return p.state->value;
}

double ReadValue(const model::Parameter& p) {
  const double value = RawValue(p);
  return value == model::kAutotune ? KnobMin(p) : value;
}

double Clamp(double value, double min, double max) {
  return std::min(std::max(value, min), std::min(max, kMaxInt64Double));
}

void WriteValue(model::Node* node, model::Parameter* p, double value) {
  value = Clamp(value, KnobMin(*p), p->max);
  if (p->state != nullptr) {
    {
      mutex_lock l(*p->state->mu);
      p->state->value = value;
    }
    p->state->cond_var->notify_all();
  }
  mutex_lock l(NodeAccess::Mutex(*node));
  p->value = value;
}

double StartingBufferSize(const model::Parameter& p) { return KnobMin(p); }

}  // namespace intune
}  // namespace tensorflow
