#include "intune_tf/cc/kernels/tuning_session.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "intune_tf/cc/kernels/bounded_buffers.h"
#include "intune_tf/cc/kernels/budget_guard.h"
#include "intune_tf/cc/kernels/row_store.h"
#include "intune_tf/cc/kernels/stage_names.h"
#include "intune_tf/cc/op_names.h"
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
  std::string name;
};

}  // namespace

TuningSession::TuningSession(int64_t id, std::string tag, int64_t ram_budget,
                             ModelPtr tf_model)
    : id_(id),
      tag_(std::move(tag)),
      creator_thread_(static_cast<int64_t>(syscall(SYS_gettid))),
      model_(std::move(tf_model)),
      created_us_(static_cast<int64_t>(Env::Default()->NowMicros())),
      ram_budget_(ram_budget) {}

TuningSession::~TuningSession() { CacheStore::Global()->SetBuffered(id_, -1); }

// Called under mu_: a walk and the sync pass that reads it are one step, so
// that a pass never reads a walk older than the last pass's.
std::vector<TuningSession::WalkNode> TuningSession::Walk() const {
  std::vector<WalkNode> walk;
  std::shared_ptr<Node> output = model_->output();
  if (output == nullptr) return walk;
  const int64_t output_id = output->id();
  // A cache at the top: the pipeline's output is its input's.
  bool top_cache = false;
  while (output->name() == kCacheNode &&
         output->inputs().size() == 1) {
    output = output->inputs().front();
    top_cache = true;
  }
  walk.push_back({std::move(output), -1, 0, 1, output_id});
  walk.back().below_cache = top_cache;
  // Breadth first; `walk` grows while it is read.
  for (size_t i = 0; i < walk.size(); ++i) {
    std::list<std::shared_ptr<Node>> inputs = walk[i].node->inputs();
    const int n = static_cast<int>(inputs.size());
    int position = 0;
    for (auto& input : inputs) {
      const int64_t id = input->id();
      bool below_cache = walk[i].below_cache;
      while (input->name() == kBufferReleaseNode ||
             input->name() == kCacheNode) {
        below_cache |= input->name() == kCacheNode;
        std::list<std::shared_ptr<Node>> below = input->inputs();
        if (below.size() != 1) break;
        input = std::move(below.front());
      }
      walk.push_back(
          {std::move(input), static_cast<int>(i), position++, n, id});
      walk.back().below_cache = below_cache;
    }
  }
  return walk;
}

std::string TuningSession::StageName(const std::vector<WalkNode>& walk,
                                     int index) const {
  const WalkNode& w = walk[index];
  if (w.parent < 0) return OutputStageName(w.node->name());
  const WalkNode& parent = walk[w.parent];
  // The walk lists parents first: SyncLocked has named this one.
  return InputStageName(
      {*parent.stage, parent.node->name(),
       parent.parent < 0 && parent.node->name() == kRootName,
       // An input created right after its parent is the one its Initialize
       // made: the first input of an interleave or a concatenate.
       w.id == parent.node->id() + 1, w.position, w.siblings},
      w.node->name());
}

void TuningSession::SyncLocked(std::vector<WalkNode>* walk) {
  AdoptKnobsBelowLocked();
  ++pass_;
  std::vector<std::string> below;
  for (size_t i = 0; i < walk->size(); ++i) {
    WalkNode& w = (*walk)[i];
    auto [it, inserted] = nodes_.try_emplace(w.node->id());
    it->second.pass = pass_;
    if (!inserted) {
      w.stage = &it->second.stage;
      continue;
    }
    it->second.stage = StageName(*walk, static_cast<int>(i));
    w.stage = &it->second.stage;
    // A node not seen before: its knobs start at the values last set for
    // their names, else buffers at TF's starting size.
    for (const auto& p : NodeAccess::TunableParameters(*w.node)) {
      KnownKnob& known = known_[absl::StrCat(*w.stage, "/", p->name)];
      known.min = KnobMin(*p);
      known.max = p->max;
      known.below_cache = w.below_cache;
      if (w.below_cache) below.push_back(absl::StrCat(*w.stage, "/", p->name));
      if (known.has_value) {
        WriteValue(w.node.get(), p.get(), std::min(known.value, known.allowed));
      } else if (p->name == kBufferSize) {
        const double start = StartingBufferSize(*p);
        const double value = RawValue(*p);
        if (value == model::kAutotune || value < start) {
          WriteValue(w.node.get(), p.get(), start);
        }
      }
      if (!known.has_start) {
        known.has_start = true;
        known.start = ReadValue(*p);
      }
    }
  }
  if (!below.empty()) TellCachesLocked(below);
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (it->second.pass != pass_) {
      it = nodes_.erase(it);
    } else {
      ++it;
    }
  }
}

void TuningSession::SyncKnobs() {
  mutex_lock l(mu_);
  std::vector<WalkNode> walk = Walk();
  SyncLocked(&walk);
}

std::vector<Knob> TuningSession::KnobsLocked(
    const std::vector<WalkNode>& walk) {
  std::map<std::string, Knob> by_name;
  for (const WalkNode& w : walk) {
    for (const auto& p : NodeAccess::TunableParameters(*w.node)) {
      const std::string name = absl::StrCat(*w.stage, "/", p->name);
      auto [it, inserted] = by_name.try_emplace(name);
      Knob& k = it->second;
      if (inserted) {
        k = {name,   p->name, ReadValue(*p), KnobMin(*p),
             p->max, w.node->long_name()};
      } else {
        k.min = std::max(k.min, KnobMin(*p));
        k.max = std::min(k.max, p->max);
        absl::StrAppend(&k.display, ",", w.node->long_name());
      }
    }
  }
  // The knobs below the cache whose stages do not run now (it serves the
  // epoch): listed, idle, at the value they come back at. Those that run
  // are told to the caches, for the sessions they serve from the start.
  std::vector<std::string> below;
  for (auto& [name, known] : known_) {
    const auto live = by_name.find(name);
    if (live != by_name.end()) {
      known.has_last = true;
      known.last = live->second.value;
      if (known.below_cache) below.push_back(name);
      continue;
    }
    if (!known.below_cache || !known.has_start) continue;
    const double value = known.has_value ? known.value
                         : known.has_last ? known.last
                                          : known.start;
    const size_t slash = name.rfind('/');
    by_name[name] = {name,      name.substr(slash + 1), value, known.min,
                     known.max, /*display=*/""};
  }
  if (!below.empty()) TellCachesLocked(below);
  std::vector<Knob> knobs;
  knobs.reserve(by_name.size());
  for (auto& [unused, knob] : by_name) knobs.push_back(std::move(knob));
  return knobs;
}

void TuningSession::TellCachesLocked(const std::vector<std::string>& names) {
  std::vector<CacheEntry::KnobBelow> below;
  for (const std::string& name : names) {
    const auto known = known_.find(name);
    if (known == known_.end() || !known->second.below_cache) continue;
    const KnownKnob& k = known->second;
    const double value = k.has_value ? k.value
                         : k.has_last ? k.last
                                      : k.start;
    below.push_back({name, value, k.min, k.max});
  }
  if (below.empty()) return;
  for (const auto& entry : Caches()) entry->RememberKnobs(below);
}

std::vector<Knob> TuningSession::ListKnobs() {
  mutex_lock l(mu_);
  std::vector<WalkNode> walk = Walk();
  SyncLocked(&walk);
  return KnobsLocked(walk);
}

absl::StatusOr<std::vector<double>> TuningSession::SetKnobs(
    const std::vector<std::string>& names, const std::vector<double>& values) {
  if (names.size() != values.size()) {
    return errors::InvalidArgument("Got ", names.size(), " knob names but ",
                                   values.size(), " values.");
  }
  using Instance = std::pair<Node*, std::shared_ptr<Parameter>>;
  Proposal proposal;
  std::vector<WalkNode> walk;
  std::map<std::string, std::vector<Instance>> live;
  {
    mutex_lock l(mu_);
    walk = Walk();
    SyncLocked(&walk);
    for (const WalkNode& w : walk) {
      for (const auto& p : NodeAccess::TunableParameters(*w.node)) {
        live[absl::StrCat(*w.stage, "/", p->name)].emplace_back(w.node.get(),
                                                                 p);
      }
    }
    std::vector<double> targets;
    for (size_t i = 0; i < names.size(); ++i) {
      auto known = known_.find(names[i]);
      if (known == known_.end()) {
        std::vector<std::string> valid;
        for (const auto& entry : known_) valid.push_back(entry.first);
        return errors::NotFound("Unknown knob '", names[i], "' in session ",
                                id_, ". Valid knobs: [",
                                absl::StrJoin(valid, ", "), "].");
      }
      if (!std::isfinite(values[i])) {
        return errors::InvalidArgument("Value ", values[i], " for knob '",
                                       names[i], "' is not a finite number.");
      }
      double lo = known->second.min, hi = known->second.max;
      auto instances = live.find(names[i]);
      if (instances != live.end()) {
        lo = -std::numeric_limits<double>::infinity();
        hi = std::numeric_limits<double>::infinity();
        for (const Instance& instance : instances->second) {
          lo = std::max(lo, KnobMin(*instance.second));
          hi = std::min(hi, instance.second->max);
        }
      }
      if (values[i] < lo || values[i] > hi) {
        return errors::OutOfRange("Value ", values[i], " for knob '", names[i],
                                  "' is outside its range [", lo, ", ", hi,
                                  "].");
      }
      targets.push_back(Clamp(std::round(values[i]), lo, hi));
    }
    std::vector<std::string> set_below;
    for (size_t i = 0; i < names.size(); ++i) {
      KnownKnob& known = known_[names[i]];
      known.has_value = true;
      known.value = targets[i];
      auto instances = live.find(names[i]);
      // Idle (no instance): its stage comes back at the value set, and the
      // guard's next pass lowers it if the budget must.
      if (instances == live.end()) {
        known.allowed = std::numeric_limits<double>::infinity();
      }
      if (known.below_cache) set_below.push_back(names[i]);
      if (instances == live.end()) continue;
      for (const Instance& instance : instances->second) {
        proposal[instance.second.get()] = targets[i];
      }
    }
    if (!set_below.empty()) TellCachesLocked(set_below);
  }
  EnforceBudget(/*thorough=*/true, &proposal);
  std::vector<double> applied;
  mutex_lock l(mu_);
  for (const std::string& name : names) {
    auto instances = live.find(name);
    applied.push_back(instances != live.end()
                          ? ReadValue(*instances->second.front().second)
                          : known_[name].value);
  }
  return applied;
}

void TuningSession::EnforceBudget(bool thorough, const Proposal* proposal) {
  std::vector<WalkNode> walk;
  // Copied under mu_: `WalkNode::stage` points into `nodes_`, whose entries a
  // SyncLocked on another thread erases once their node leaves the model
  // (an epoch's end), and the pass below runs without mu_.
  std::vector<std::string> stages;
  {
    mutex_lock l(mu_);
    walk = Walk();
    SyncLocked(&walk);
    stages.reserve(walk.size());
    for (const WalkNode& w : walk) stages.push_back(*w.stage);
  }
  if (walk.empty()) return;
  // The value a parameter is about to have: proposed, else its own.
  auto value_of = [proposal](const Parameter& p) {
    if (proposal != nullptr) {
      auto found = proposal->find(&p);
      if (found != proposal->end()) return found->second;
    }
    return ReadValue(p);
  };
  // Values are written once the knob pass below has lowered what it must:
  // a raised buffer never fills past the budget in between.
  auto write = [&walk](const Proposal& values) {
    if (values.empty()) return;
    for (const WalkNode& w : walk) {
      for (const auto& p : NodeAccess::TunableParameters(*w.node)) {
        auto found = values.find(p.get());
        if (found != values.end()) {
          WriteValue(w.node.get(), p.get(), found->second);
        }
      }
    }
  };
  Proposal to_write;
  if (proposal != nullptr) to_write = *proposal;
  int64_t total = 0;
  for (const WalkNode& w : walk) total += w.node->buffered_bytes();
  int64_t peak = peak_buffered_bytes_.load();
  while (total > peak && !peak_buffered_bytes_.compare_exchange_weak(peak, total)) {
  }
  const int64_t budget = ram_budget_.load();
  CacheStore::Global()->SetBuffered(id_, total);
  LimitCaches(budget, total);
  // Bounded interleave buffers by the interleave's node. One below its cap
  // needs a thorough pass.
  absl::flat_hash_map<const Node*, std::shared_ptr<BoundedBuffers>> bounded;
  bool bounded_pending = false;
  for (auto& buffers : BoundedBuffersOf(model_.get())) {
    std::shared_ptr<Node> node = buffers->node();
    if (node == nullptr) continue;
    bounded_pending |= buffers->limit() < buffers->cap();
    bounded[node.get()] = std::move(buffers);
  }
  if (budget <= 0) {
    for (auto& [unused, buffers] : bounded) {
      buffers->SetAllowance(buffers->cap(),
                            std::numeric_limits<double>::infinity(), 0);
    }
    mutex_lock l(mu_);
    write(to_write);
    return;
  }
  if (total > budget) guard_over_budget_.fetch_add(1);

  // Bytes held by async nodes without a memory knob cannot be lowered: they
  // are subtracted from what the knobs may commit. Buffer knobs are lowered
  // before parallelism knobs.
  std::vector<MemoryKnob> knobs;
  // Bounded interleaves that have read a record: their allowance is planned
  // with the largest record seen, for the most inputs seen alive at once.
  std::vector<std::shared_ptr<BoundedBuffers>> groups;
  std::vector<GuardGroup> guard_groups;
  // The bytes of an element of walk node `index`, for a knob: measured,
  // else (no element yet) that of the nearest stage below that has one, the
  // worst case being the largest record of a bounded interleave: a stage
  // that has not produced yet commits its buffer as soon as it does.
  std::function<double(size_t)> element_bytes = [&](size_t index) {
    const Node* node = walk[index].node.get();
    auto group = bounded.find(node);
    if (group != bounded.end()) {
      return static_cast<double>(group->second->largest_record());
    }
    const double bpe = BytesPerElement(*node);
    if (bpe > 0) return bpe;
    for (size_t i = index + 1; i < walk.size(); ++i) {
      if (walk[i].parent == static_cast<int>(index) && walk[i].position == 0) {
        return element_bytes(i);
      }
    }
    return 0.0;
  };
  double fixed_bytes = 0;
  for (size_t i = 0; i < walk.size(); ++i) {
    const WalkNode& w = walk[i];
    const std::shared_ptr<Node>& node = w.node;
    std::shared_ptr<Parameter> buffer, parallelism;
    for (const auto& parameter : NodeAccess::TunableParameters(*node)) {
      if (parameter->name == kBufferSize) buffer = parameter;
      if (parameter->name == kParallelism) parallelism = parameter;
    }
    auto group = bounded.find(node.get());
    if (group != bounded.end()) {
      const std::shared_ptr<BoundedBuffers>& buffers = group->second;
      const int64_t largest = buffers->largest_record();
      if (largest > 0) {
        groups.push_back(buffers);
        guard_groups.push_back(
            {buffers->cap(),
             std::max<int64_t>({buffers->inputs(), buffers->max_inputs(), 1}),
             static_cast<double>(largest)});
        continue;
      }
    }
    std::shared_ptr<Parameter> knob = buffer ? buffer : parallelism;
    const double bpe =
        knob != nullptr && node->IsAsync() ? element_bytes(i) : 0.0;
    if (bpe <= 0) {
      fixed_bytes += node->buffered_bytes();
      continue;
    }
    knobs.push_back({node, knob, bpe, absl::StrCat(stages[i], "/", knob->name)});
  }
  unlowerable_bytes_.store(static_cast<int64_t>(fixed_bytes));
  // Far below the budget, with no interleave to bound: nothing to plan (the
  // counter above stays current every round).
  if (!thorough && !bounded_pending && total <= budget / 2) {
    mutex_lock l(mu_);
    write(to_write);
    return;
  }
  std::stable_sort(knobs.begin(), knobs.end(),
                   [](const MemoryKnob& a, const MemoryKnob& b) {
                     return a.parameter->name == kBufferSize &&
                            b.parameter->name != kBufferSize;
                   });
  mutex_lock l(mu_);
  // Each knob is computed from the value wanted for it (proposed, else last
  // set, else its start), not from its current one: a knob the guard
  // lowered comes back up once the budget allows it again.
  std::vector<GuardKnob> guard_knobs;
  guard_knobs.reserve(knobs.size());
  for (const MemoryKnob& k : knobs) {
    double value = value_of(*k.parameter);
    const bool proposed =
        proposal != nullptr && proposal->contains(k.parameter.get());
    auto known = known_.find(k.name);
    if (!proposed && known != known_.end()) {
      if (known->second.has_value) {
        value = known->second.value;
      } else if (known->second.has_start) {
        value = known->second.start;
      }
    }
    guard_knobs.push_back({value, KnobMin(*k.parameter), k.bytes_per_element});
  }
  // Committed: what the knobs and allowances allow, not what is buffered now
  // (elements above a lowered knob drain; counting them would lower it
  // again).
  const GuardPlan plan = PlanBudget(static_cast<double>(budget), fixed_bytes,
                                    guard_knobs, guard_groups);
  // Allowances are lowered before knobs are raised, and raised after: the
  // bounded records and the knobs' buffers never together pass the budget.
  for (size_t i = 0; i < groups.size(); ++i) {
    if (plan.group_bytes[i] < groups[i]->allowance()) {
      groups[i]->SetAllowance(plan.limits[i], plan.group_bytes[i], budget);
    }
  }
  for (size_t i = 0; i < knobs.size(); ++i) {
    const MemoryKnob& k = knobs[i];
    const double value = plan.values[i];
    // New instances of the knob (SyncLocked) start no higher.
    known_[k.name].allowed = value;
    const double current = ReadValue(*k.parameter);
    if (value < current) {
      guard_shrinks_.fetch_add(static_cast<int64_t>(current - value));
    }
    if (value != current || to_write.contains(k.parameter.get())) {
      to_write[k.parameter.get()] = value;
    }
  }
  write(to_write);
  for (size_t i = 0; i < groups.size(); ++i) {
    groups[i]->SetAllowance(plan.limits[i], plan.group_bytes[i], budget);
  }
}

absl::StatusOr<std::string> TuningSession::ModelProto() {
  // The model's parameter values are what its readers (ToProto) see: bring
  // them to the values in force (an iterator gives its knobs their defaults
  // in the shared state only).
  {
    mutex_lock l(mu_);
    std::vector<WalkNode> walk = Walk();
    SyncLocked(&walk);
    for (const WalkNode& w : walk) {
      for (const auto& p : NodeAccess::TunableParameters(*w.node)) {
        const double value = RawValue(*p);
        if (value == model::kAutotune) continue;
        mutex_lock node_lock(NodeAccess::Mutex(*w.node));
        p->value = value;
      }
    }
  }
  model::ModelProto proto;
  TF_RETURN_IF_ERROR(model_->ToProto(&proto));
  std::string serialized;
  if (!proto.SerializeToString(&serialized)) {
    return errors::Internal("Could not serialize the model of session ", id_);
  }
  return serialized;
}

namespace {

StageSample Sample(const Node& node, const std::string& stage) {
  return {stage,
          node.id(),
          node.num_elements(),
          node.processing_time(),
          node.buffered_bytes(),
          node.buffered_elements(),
          node.bytes_produced(),
          node.bytes_consumed()};
}

}  // namespace

std::vector<StageSample> TuningSession::Stages() {
  mutex_lock l(mu_);
  std::vector<WalkNode> walk = Walk();
  std::vector<StageSample> stages;
  stages.reserve(walk.size());
  SyncLocked(&walk);
  for (const WalkNode& w : walk) stages.push_back(Sample(*w.node, *w.stage));
  return stages;
}

void TuningSession::Observe(std::vector<Knob>* knobs,
                            std::vector<StageSample>* stages) {
  mutex_lock l(mu_);
  std::vector<WalkNode> walk = Walk();
  stages->clear();
  stages->reserve(walk.size());
  SyncLocked(&walk);
  *knobs = KnobsLocked(walk);
  for (const WalkNode& w : walk) stages->push_back(Sample(*w.node, *w.stage));
}

void TuningSession::set_ram_budget(int64_t bytes, bool pin) {
  if (pin) pinned_ram_budget_.store(bytes);
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

void TuningSession::AttachCache(std::shared_ptr<CacheEntry> entry) {
  // The knobs below it that other sessions ran.
  std::vector<CacheEntry::KnobBelow> below = entry->knobs_below();
  {
    mutex_lock l(cache_mu_);
    for (const auto& held : caches_) {
      if (held == entry) return;
    }
    caches_.push_back(entry);
    pending_below_.insert(pending_below_.end(),
                          std::make_move_iterator(below.begin()),
                          std::make_move_iterator(below.end()));
  }
  // Before its first element: no room until the guard gives it some.
  LimitCaches(ram_budget_.load(), -1);
}

void TuningSession::AdoptKnobsBelowLocked() {
  std::vector<CacheEntry::KnobBelow> below;
  {
    mutex_lock l(cache_mu_);
    below.swap(pending_below_);
  }
  for (const CacheEntry::KnobBelow& knob : below) {
    KnownKnob& known = known_[knob.name];
    if (known.has_start) continue;
    known.min = knob.min;
    known.max = knob.max;
    known.below_cache = true;
    known.has_start = true;
    known.start = knob.value;
    known.has_last = true;
    known.last = knob.value;
  }
}

void TuningSession::DecideCache(CacheDecision decision) {
  mutex_lock l(cache_mu_);
  cache_decision_ = std::move(decision);
}

CacheDecision TuningSession::cache_decision() const {
  mutex_lock l(cache_mu_);
  return cache_decision_;
}

std::vector<std::shared_ptr<CacheEntry>> TuningSession::Caches() const {
  mutex_lock l(cache_mu_);
  return caches_;
}

void TuningSession::LimitCaches(int64_t budget, int64_t buffered) {
  std::vector<std::shared_ptr<CacheEntry>> caches = Caches();
  if (caches.empty()) return;
  if (buffered < 0) {
    buffered = 0;
    std::vector<std::shared_ptr<Node>> nodes;
    CollectNodes(model_->output(), &nodes);
    for (const auto& node : nodes) buffered += node->buffered_bytes();
  }
  // What the buffers leave, split evenly; no budget (0), no cache.
  const int64_t room = budget > 0 ? std::max<int64_t>(budget - buffered, 0) : 0;
  const int64_t each = room / static_cast<int64_t>(caches.size());
  for (const auto& entry : caches) {
    cache_shrinks_.fetch_add(entry->SetLimit(each));
  }
}

void TuningSession::RecordCacheRead(bool from_cache, double upstream_us) {
  if (!from_cache) {
    cache_misses_.fetch_add(1);
    return;
  }
  cache_hits_.fetch_add(1);
  double saved = cache_saved_us_.load();
  while (!cache_saved_us_.compare_exchange_weak(saved, saved + upstream_us)) {
  }
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
  // The guard's samples, now, and what bounded interleaves saw at admission.
  c.peak_buffered_bytes = std::max(peak_buffered_bytes_.load(), c.buffered_bytes);
  for (const auto& buffers : BoundedBuffersOf(model_.get())) {
    c.peak_buffered_bytes =
        std::max(c.peak_buffered_bytes, buffers->peak_counted_bytes());
  }
  c.ram_budget = ram_budget_.load();
  c.guard_shrinks = guard_shrinks_.load();
  c.guard_over_budget = guard_over_budget_.load();
  c.unlowerable_bytes = unlowerable_bytes_.load();
  c.created_us = created_us_;
  c.pinned_ram_budget = pinned_ram_budget_.load();
  for (const auto& entry : Caches()) {
    c.cache_bytes += entry->bytes();
    c.cache_limit += entry->limit();
    c.cache_elements += entry->size();
    c.cache_complete += entry->complete() ? 1 : 0;
    for (const auto& store : entry->row_stores()) {
      c.row_store_rows += store->rows();
      c.row_store_bytes += store->bytes();
      c.row_store_gathered += store->gathered();
    }
  }
  c.cache_hits = cache_hits_.load();
  c.cache_misses = cache_misses_.load();
  c.cache_saved_us = static_cast<int64_t>(cache_saved_us_.load());
  c.cache_shrinks = cache_shrinks_.load();
  return c;
}

}  // namespace intune
}  // namespace tensorflow
