#include "intune_tf/cc/kernels/session_registry.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensorflow/core/framework/model.pb.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace {

using model::Node;
using model::Parameter;

// A node that holds memory and the knob that bounds how much.
struct MemoryKnob {
  std::shared_ptr<Node> node;
  std::shared_ptr<Parameter> parameter;
  double bytes_per_element;
};

void CollectNodes(const std::shared_ptr<Node>& node,
                  std::vector<std::shared_ptr<Node>>* out) {
  if (node == nullptr) return;
  out->push_back(node);
  for (const auto& input : node->inputs()) CollectNodes(input, out);
}

double BytesPerElement(const Node& node) {
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

double ReadValue(const Parameter& p) {
  if (p.state == nullptr) return p.value;
  tf_shared_lock l(*p.state->mu);
  return p.state->value;
}

void WriteValue(Parameter* p, double value) {
  p->value = value;
  if (p->state == nullptr) return;
  {
    mutex_lock l(*p->state->mu);
    p->state->value = value;
  }
  p->state->cond_var->notify_all();
}

}  // namespace

TuningSession::TuningSession(int64_t id, std::string tag, int64_t ram_budget,
                             ModelPtr tf_model)
    : id_(id),
      tag_(std::move(tag)),
      model_(std::move(tf_model)),
      created_us_(static_cast<int64_t>(Env::Default()->NowMicros())),
      ram_budget_(ram_budget) {}

std::vector<Knob> TuningSession::ListKnobs() const {
  std::vector<Knob> knobs;
  std::shared_ptr<Node> output = model_->output();
  if (output == nullptr) return knobs;
  for (const auto& [node_name, parameter] :
       output->CollectTunableParameters()) {
    knobs.push_back({absl::StrCat(node_name, "/", parameter->name),
                     parameter->name, ReadValue(*parameter), parameter->min,
                     parameter->max});
  }
  std::sort(knobs.begin(), knobs.end(),
            [](const Knob& a, const Knob& b) { return a.name < b.name; });
  return knobs;
}

Status TuningSession::SetKnobs(const std::vector<std::string>& names,
                               const std::vector<double>& values,
                               std::vector<double>* applied) {
  if (names.size() != values.size()) {
    return errors::InvalidArgument("Got ", names.size(), " knob names but ",
                                   values.size(), " values.");
  }
  std::shared_ptr<Node> output = model_->output();
  std::map<std::string, std::shared_ptr<Parameter>> by_name;
  if (output != nullptr) {
    for (const auto& [node_name, parameter] :
         output->CollectTunableParameters()) {
      by_name[absl::StrCat(node_name, "/", parameter->name)] = parameter;
    }
  }
  std::vector<std::shared_ptr<Parameter>> targets;
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = by_name.find(names[i]);
    if (it == by_name.end()) {
      std::vector<std::string> valid;
      for (const auto& entry : by_name) valid.push_back(entry.first);
      return errors::NotFound("Unknown knob '", names[i], "' in session ",
                              id_, ". Valid knobs: [",
                              absl::StrJoin(valid, ", "), "].");
    }
    const Parameter& p = *it->second;
    if (!std::isfinite(values[i]) || values[i] < p.min || values[i] > p.max) {
      return errors::OutOfRange("Value ", values[i], " for knob '", names[i],
                                "' is outside its range [", p.min, ", ",
                                p.max, "].");
    }
    targets.push_back(it->second);
  }
  {
    mutex_lock l(mu_);
    for (size_t i = 0; i < targets.size(); ++i) {
      WriteValue(targets[i].get(), std::round(values[i]));
    }
  }
  EnforceBudget();
  applied->clear();
  for (const auto& target : targets) applied->push_back(ReadValue(*target));
  return OkStatus();
}

void TuningSession::EnforceBudget(bool thorough) {
  std::shared_ptr<Node> output = model_->output();
  if (output == nullptr) return;
  std::vector<std::shared_ptr<Node>> nodes;
  CollectNodes(output, &nodes);
  int64_t total = 0;
  for (const auto& node : nodes) total += node->buffered_bytes();
  int64_t peak = peak_buffered_bytes_.load();
  while (total > peak && !peak_buffered_bytes_.compare_exchange_weak(peak, total)) {
  }
  const int64_t budget = ram_budget_.load();
  if (budget <= 0) return;
  if (total > budget) guard_over_budget_.fetch_add(1);
  if (!thorough && total <= budget / 2) return;

  // Bytes held by async nodes without a memory knob cannot be lowered: they
  // are subtracted from what the knobs may commit. Buffer knobs are lowered
  // before parallelism knobs.
  std::vector<MemoryKnob> knobs;
  double fixed_bytes = 0;
  for (const auto& node : nodes) {
    std::shared_ptr<Parameter> buffer, parallelism;
    for (const auto& [name, parameter] : node->CollectNodeTunableParameters()) {
      if (parameter->name == kBufferSize) buffer = parameter;
      if (parameter->name == kParallelism) parallelism = parameter;
    }
    const double bpe = BytesPerElement(*node);
    std::shared_ptr<Parameter> knob = buffer ? buffer : parallelism;
    if (knob == nullptr || !node->IsAsync() || bpe <= 0) {
      fixed_bytes += node->buffered_bytes();
      continue;
    }
    knobs.push_back({node, knob, bpe});
  }
  std::stable_sort(knobs.begin(), knobs.end(),
                   [](const MemoryKnob& a, const MemoryKnob& b) {
                     return a.parameter->name == kBufferSize &&
                            b.parameter->name != kBufferSize;
                   });
  mutex_lock l(mu_);
  double committed = fixed_bytes;
  for (const auto& k : knobs) {
    committed += std::max<double>(ReadValue(*k.parameter),
                                  k.node->buffered_elements()) *
                 k.bytes_per_element;
  }
  for (auto& k : knobs) {
    if (committed <= budget) break;
    const double value = ReadValue(*k.parameter);
    const double excess_elements =
        std::ceil((committed - budget) / k.bytes_per_element);
    const double lowered =
        std::max(k.parameter->min, value - excess_elements);
    if (lowered < value) {
      WriteValue(k.parameter.get(), lowered);
      guard_shrinks_.fetch_add(static_cast<int64_t>(value - lowered));
      committed -= (value - lowered) * k.bytes_per_element;
    }
  }
}

Status TuningSession::ModelProto(std::string* serialized) {
  model::ModelProto proto;
  TF_RETURN_IF_ERROR(model_->ToProto(&proto));
  if (!proto.SerializeToString(serialized)) {
    return errors::Internal("Could not serialize the model of session ", id_);
  }
  return OkStatus();
}

std::vector<StageSample> TuningSession::Stages() const {
  std::vector<StageSample> stages;
  std::deque<std::shared_ptr<Node>> todo;
  if (model_->output() != nullptr) todo.push_back(model_->output());
  std::set<int64_t> seen;
  while (!todo.empty()) {
    std::shared_ptr<Node> node = std::move(todo.front());
    todo.pop_front();
    if (!seen.insert(node->id()).second) continue;
    stages.push_back({node->long_name(), node->num_elements(),
                      node->processing_time(), node->buffered_bytes(),
                      node->buffered_elements(), node->bytes_produced(),
                      node->bytes_consumed()});
    for (auto& input : node->inputs()) todo.push_back(std::move(input));
  }
  return stages;
}

void TuningSession::set_ram_budget(int64_t bytes) {
  ram_budget_.store(bytes);
  EnforceBudget();
}

void TuningSession::RecordGetNext(int64_t start_us, int64_t end_us) {
  const int64_t last = last_end_us_.exchange(end_us);
  if (last > 0 && start_us >= last) {
    const int64_t gap = start_us - last;
    gap_time_us_.fetch_add(gap);
    gap_count_.fetch_add(1);
    model_->RecordIteratorGapTime(static_cast<uint64_t>(gap));
  }
  get_next_time_us_.fetch_add(end_us - start_us);
  elements_.fetch_add(1);
}

SessionCounters TuningSession::Counters() const {
  SessionCounters c;
  c.elements = elements_.load();
  c.gap_time_us = gap_time_us_.load();
  c.gap_count = gap_count_.load();
  c.get_next_time_us = get_next_time_us_.load();
  std::vector<std::shared_ptr<Node>> nodes;
  CollectNodes(model_->output(), &nodes);
  for (const auto& node : nodes) c.buffered_bytes += node->buffered_bytes();
  c.peak_buffered_bytes = std::max(peak_buffered_bytes_.load(), c.buffered_bytes);
  c.ram_budget = ram_budget_.load();
  c.guard_shrinks = guard_shrinks_.load();
  c.guard_over_budget = guard_over_budget_.load();
  c.created_us = created_us_;
  return c;
}

SessionRegistry* SessionRegistry::Global() {
  static SessionRegistry* registry = new SessionRegistry();
  return registry;
}

std::shared_ptr<TuningSession> SessionRegistry::Create(
    const std::string& tag, int64_t ram_budget,
    ModelPtr tf_model) {
  mutex_lock l(mu_);
  auto session = std::make_shared<TuningSession>(next_id_++, tag, ram_budget,
                                                 std::move(tf_model));
  sessions_[session->id()] = session;
  return session;
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

Status SessionRegistry::Lookup(int64_t id,
                               std::shared_ptr<TuningSession>* session) const {
  tf_shared_lock l(mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) *session = it->second.lock();
  if (it == sessions_.end() || *session == nullptr) {
    return errors::NotFound("InTune session ", id,
                            " is gone: its iterator was destroyed or "
                            "exhausted and released. List live sessions with "
                            "intune_tf.sessions().");
  }
  return OkStatus();
}

}  // namespace intune
}  // namespace tensorflow
