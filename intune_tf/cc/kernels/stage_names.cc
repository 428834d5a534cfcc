#include "intune_tf/cc/kernels/stage_names.h"

#include <deque>

namespace tensorflow {
namespace intune {
namespace {

bool IsAsciiAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9');
}

}  // namespace

std::string Sanitize(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (!IsAsciiAlnum(c) && c != '_') c = '_';
  }
  return out;
}

bool IsInterleaveLike(const std::string& type) {
  if (type == "DirectedInterleave") return false;
  return type.find("Interleave") != std::string::npos || type == "FlatMap" ||
         type == "GroupByWindow";
}

bool IsMultiInput(const std::string& type) {
  return type == "Zip" || type == "Concatenate" ||
         type == "DirectedInterleave" || type == "ChooseFastest" ||
         type == "ChooseFastestBranch" || type == "WeightedFlatMap";
}

std::string InputLabel(const StagePlace& place) {
  const std::string& type = place.parent_type;
  if (IsInterleaveLike(type)) return place.first ? "" : "[*]";
  if (type == "Concatenate") return place.first ? "[0]" : "[1]";
  if (IsMultiInput(type) || place.siblings > 1) {
    return "[" + std::to_string(place.position) + "]";
  }
  return "";
}

std::string OutputStageName(const std::string& node_name) {
  return Sanitize(node_name);
}

std::string InputStageName(const StagePlace& place,
                           const std::string& node_name) {
  std::string own = Sanitize(node_name);
  if (place.parent_is_root) return own;
  return place.parent_stage + InputLabel(place) + "." + own;
}

std::map<int64_t, NamedStage> NameModelStages(
    int64_t output, const std::map<int64_t, ModelNode>& nodes,
    const std::string& root, const std::string& release,
    const std::string& cache) {
  std::map<int64_t, NamedStage> named;
  auto top = nodes.find(output);
  // A cache at the top: the pipeline's output is its input's.
  for (size_t steps = 0; steps < nodes.size() && top != nodes.end() &&
                         top->second.name == cache &&
                         top->second.inputs.size() == 1;
       ++steps) {
    output = top->second.inputs.front();
    top = nodes.find(output);
  }
  if (top == nodes.end()) return named;
  named[output].stage = OutputStageName(top->second.name);
  std::deque<int64_t> todo = {output};
  while (!todo.empty()) {
    const int64_t parent_id = todo.front();
    todo.pop_front();
    const ModelNode& parent = nodes.at(parent_id);
    const std::string parent_stage = named.at(parent_id).stage;
    std::vector<int64_t> inputs;
    for (int64_t id : parent.inputs) {
      if (nodes.count(id) > 0) inputs.push_back(id);
    }
    for (size_t position = 0; position < inputs.size(); ++position) {
      int64_t id = inputs[position];
      // An input created right after its parent is the one its Initialize
      // made (the id before any release node is passed through).
      const bool first = id == parent_id + 1;
      bool bounded = false;
      // At most one step per node, so that a cycle of such nodes ends.
      for (size_t steps = 0; steps < nodes.size(); ++steps) {
        auto it = nodes.find(id);
        if (it == nodes.end() || it->second.inputs.size() != 1 ||
            (it->second.name != release && it->second.name != cache)) {
          break;
        }
        bounded = bounded || it->second.name == release;
        id = it->second.inputs.front();
      }
      auto node = nodes.find(id);
      if (node == nodes.end() || named.count(id) > 0) continue;
      const StagePlace place{parent_stage, parent.name,
                             parent_id == output && parent.name == root, first,
                             static_cast<int>(position),
                             static_cast<int>(inputs.size())};
      named[id] = {InputStageName(place, node->second.name), parent_id,
                   bounded};
      todo.push_back(id);
    }
  }
  return named;
}

}  // namespace intune
}  // namespace tensorflow
