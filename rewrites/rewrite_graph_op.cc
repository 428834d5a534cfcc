// IntuneRewriteGraph: RunPasses on a serialized GraphDef, for tests and
// debugging (op registration: intune_tf/cc/ops/rewrite_ops.cc).
#include <string>

#include "rewrites/optimizer.h"
#include "rewrites/passes.h"
#include "rewrites/rewrite.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tensorflow {
namespace intune {
namespace rewrites {
namespace {

inline constexpr char kGraphDef[] = "graph_def";

class IntuneRewriteGraphOp : public OpKernel {
 public:
  explicit IntuneRewriteGraphOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kIncludeFixed, &options_.include_fixed));
    OP_REQUIRES_OK(ctx,
                   ctx->GetAttr(kInsertPrefetch, &options_.insert_prefetch));
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kInnerStats, &options_.inner_stats));
    OP_REQUIRES_OK(
        ctx, ctx->GetAttr(kInterleaveBuffer, &options_.interleave_buffer));
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kCache, &options_.cache));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(input.shape()),
                errors::InvalidArgument(kGraphDef,
                                        " must be a scalar, got shape ",
                                        input.shape().DebugString()));
    const tstring& serialized = input.scalar<tstring>()();
    GraphDef graph;
    OP_REQUIRES(ctx, graph.ParseFromArray(serialized.data(), serialized.size()),
                errors::InvalidArgument(kGraphDef, " is not a GraphDef"));
    Report report;
    OP_REQUIRES_OK(ctx, RunPasses(options_, &graph, &report));

    SetScalar(ctx, 0, graph.SerializeAsString());
    const int64_t n = report.fixed.size();
    Tensor *names, *values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &names));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &values));
    int64_t i = 0;
    for (const auto& [name, value] : report.fixed) {
      names->vec<tstring>()(i) = name;
      values->vec<int64_t>()(i) = value;
      ++i;
    }
    Tensor* skipped;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            3, TensorShape({static_cast<int64_t>(
                                   report.skipped.size())}),
                            &skipped));
    for (size_t j = 0; j < report.skipped.size(); ++j) {
      skipped->vec<tstring>()(j) = report.skipped[j];
    }
    Tensor* changed;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({}), &changed));
    changed->scalar<bool>()() = report.structure_changed;
    SetScalar(ctx, 5, report.fingerprint);
    SetScalar(ctx, 6, MakeRewriterConfig(options_).SerializeAsString());
    SetScalar(ctx, 7, report.cache.point);
    SetScalar(ctx, 8, report.cache.reason);
  }

 private:
  static void SetScalar(OpKernelContext* ctx, int index,
                        const std::string& value) {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(index, TensorShape({}), &out));
    out->scalar<tstring>()() = value;
  }

  Options options_;
};

REGISTER_KERNEL_BUILDER(Name("IntuneRewriteGraph").Device(DEVICE_CPU),
                        IntuneRewriteGraphOp);

// IntuneCachePoint: FindCachePoint (passes.h) on a serialized GraphDef.
class IntuneCachePointOp : public OpKernel {
 public:
  explicit IntuneCachePointOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(input.shape()),
                errors::InvalidArgument(kGraphDef,
                                        " must be a scalar, got shape ",
                                        input.shape().DebugString()));
    const tstring& serialized = input.scalar<tstring>()();
    GraphDef graph;
    OP_REQUIRES(ctx, graph.ParseFromArray(serialized.data(), serialized.size()),
                errors::InvalidArgument(kGraphDef, " is not a GraphDef"));
    const CachePoint point = FindCachePoint(graph);
    for (int i = 0; i < 2; ++i) {
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({}), &out));
      out->scalar<tstring>()() =
          i == 0 ? point.decision.point : point.decision.reason;
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("IntuneCachePoint").Device(DEVICE_CPU),
                        IntuneCachePointOp);

}  // namespace
}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow
