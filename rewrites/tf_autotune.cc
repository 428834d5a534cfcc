// Pass disable_tf_autotune: TF's own autotuner off in the options the graph
// carries.
#include <string>

#include "rewrites/graph_utils.h"
#include "rewrites/passes.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/dataset_options.pb.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

Status DisableTfAutotune(GraphDef* graph) {
  for (NodeDef& node : *graph->mutable_node()) {
    if (node.op() != kTfOptionsOp) continue;
    const auto attr = node.mutable_attr()->find(kSerializedOptionsAttr);
    if (attr == node.mutable_attr()->end()) continue;
    data::Options options;
    if (!options.ParseFromString(attr->second.s())) {
      return errors::InvalidArgument("the ", kSerializedOptionsAttr, " of ",
                                     node.name(), " do not parse");
    }
    options.mutable_autotune_options()->set_enabled(false);
    options.mutable_optimization_options()->set_inject_prefetch(false);
    std::string serialized;
    if (!options.SerializeToString(&serialized)) {
      return errors::Internal("cannot serialize the options of ", node.name());
    }
    attr->second.set_s(serialized);
  }
  return OkStatus();
}

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
