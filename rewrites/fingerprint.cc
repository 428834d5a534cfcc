// The warm-start fingerprint of a dataset graph (GraphFingerprint, passes.h).
#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "intune_tf/cc/graph_walk.h"
#include "rewrites/graph_utils.h"
#include "rewrites/passes.h"
#include "tensorflow/core/platform/hash.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

std::string GraphFingerprint(const GraphDef& graph) {
  std::map<std::string, int64_t> ops;
  ForEachNode(graph, [&ops](const NodeDef& node, const FunctionDef* function) {
    if (function == nullptr ? !IsGrapplerSink(node) : !IsFakeSink(node)) {
      ++ops[node.op()];
    }
  });
  // One "<op> <count>" line per op type, in byte order: op names have no
  // spaces or newlines.
  std::string text;
  for (const auto& [op, count] : ops) {
    absl::StrAppend(&text, op, " ", count, "\n");
  }
  return absl::StrCat(absl::Hex(Hash64(text), absl::kZeroPad16));
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
