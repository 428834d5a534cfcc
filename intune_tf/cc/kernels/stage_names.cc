#include "intune_tf/cc/kernels/stage_names.h"

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
  if (place.parent_is_output && place.parent_type == kRootName) return own;
  return place.parent_stage + InputLabel(place) + "." + own;
}

}  // namespace intune
}  // namespace tensorflow
