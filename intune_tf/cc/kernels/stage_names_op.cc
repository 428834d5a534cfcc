// IntuneStageNames: the stage-name grammar (stage_names.h) over a serialized
// ModelProto, so that Python names the nodes of any model as the kernel does.
#include <map>
#include <string>

#include "intune_tf/cc/kernels/stage_names.h"
#include "intune_tf/cc/op_names.h"
#include "tensorflow/core/framework/model.pb.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {
namespace intune {
namespace {

inline constexpr char kModelProto[] = "model_proto";
inline constexpr char kRoot[] = "root";

class IntuneStageNamesOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& serialized = ctx->input(0);
    const Tensor& root = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(serialized.shape()),
                errors::InvalidArgument(kModelProto, " must be a scalar, got ",
                                        serialized.shape().DebugString()));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(root.shape()),
                errors::InvalidArgument(kRoot, " must be a scalar, got ",
                                        root.shape().DebugString()));
    data::model::ModelProto proto;
    const tstring& bytes = serialized.scalar<tstring>()();
    OP_REQUIRES(ctx, proto.ParseFromArray(bytes.data(), bytes.size()),
                errors::InvalidArgument(kModelProto,
                                        " is not a serialized ModelProto (",
                                        bytes.size(), " bytes)"));
    std::map<int64_t, ModelNode> nodes;
    for (const auto& [id, node] : proto.nodes()) {
      ModelNode& plain = nodes[id];
      plain.name = node.name();
      plain.inputs.assign(node.inputs().begin(), node.inputs().end());
    }
    const std::map<int64_t, NamedStage> named = NameModelStages(
        proto.output(), nodes, std::string(root.scalar<tstring>()()),
        kBufferReleaseNode, kCacheNode);
    const int64_t n = static_cast<int64_t>(named.size());
    Tensor *ids, *stages, *parents, *bounded;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &ids));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &stages));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &parents));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({n}), &bounded));
    int64_t i = 0;
    for (const auto& [id, stage] : named) {
      ids->vec<int64_t>()(i) = id;
      stages->vec<tstring>()(i) = stage.stage;
      parents->vec<int64_t>()(i) = stage.parent;
      bounded->vec<bool>()(i) = stage.bounded;
      ++i;
    }
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("IntuneStageNames").Device(DEVICE_CPU),
                        IntuneStageNamesOp);

}  // namespace intune
}  // namespace tensorflow
