// Kernels of the row store's ops (row_store.h; registered in
// intune_tf/cc/ops/row_store_ops.cc).
#include <memory>
#include <string>
#include <vector>

#include "intune_tf/cc/kernels/row_store.h"
#include "intune_tf/cc/op_names.h"
#include "intune_tf/cc/tf_cc_symbols.h"
#include "tensorflow/core/framework/dataset_stateful_op_allowlist.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tensorflow {
namespace intune {
namespace {

// Input 0 of every row store op.
inline constexpr char kPositions[] = "positions";

// Checks that input 0 (the positions) is a vector; on failure sets an
// InvalidArgument status and returns false.
bool CheckPositions(OpKernelContext* ctx) {
  const TensorShape& shape = ctx->input(0).shape();
  if (TensorShapeUtils::IsVector(shape)) return true;
  ctx->SetStatus(errors::InvalidArgument(
      kPositions, " must be a vector, got shape ", shape.DebugString()));
  return false;
}

// The store the batch's positions name (row_store.h): the tagged store of
// their tag and `key`, or the untagged store of `key` (made, for a Put, with
// `dtypes`); null when the batch is empty, a position is negative or the
// positions carry different tags, or no such store lives.
Status StoreOf(const Tensor& positions, const std::string& key,
               const DataTypeVector* dtypes, std::shared_ptr<RowStore>* store) {
  store->reset();
  const auto pos = positions.flat<int64_t>();
  if (pos.size() == 0) return OkStatus();
  const int64_t tag = RowTag(pos(0));
  for (int64_t j = 0; j < pos.size(); ++j) {
    if (RowTag(pos(j)) != tag || pos(j) < 0) return OkStatus();
  }
  if (tag > 0) {
    *store = RowStoreRegistry::Global()->LookupTagged(tag, key);
  } else if (dtypes != nullptr) {
    return RowStoreRegistry::Global()->GetOrCreate(key, *dtypes, store);
  } else {
    *store = RowStoreRegistry::Global()->Lookup(key);
  }
  return OkStatus();
}

class IntuneRowStoreHasOp : public OpKernel {
 public:
  explicit IntuneRowStoreHasOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kRowStoreKeyAttr, &key_));
  }

  void Compute(OpKernelContext* ctx) override {
    if (!CheckPositions(ctx)) return;
    std::shared_ptr<RowStore> store;
    OP_REQUIRES_OK(ctx, StoreOf(ctx->input(0), key_, nullptr, &store));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = store != nullptr && store->HasAll(ctx->input(0));
  }

 private:
  std::string key_;
};

class IntuneRowStorePutOp : public OpKernel {
 public:
  explicit IntuneRowStorePutOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kRowStoreKeyAttr, &key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kRowStoreTypesAttr, &dtypes_));
    OP_REQUIRES_OK(ctx, CheckRowTypes(dtypes_));
  }

  void Compute(OpKernelContext* ctx) override {
    if (!CheckPositions(ctx)) return;
    const int64_t n = ctx->input(0).NumElements();
    std::vector<Tensor> components;
    components.reserve(ctx->num_inputs() - 1);
    for (int i = 1; i < ctx->num_inputs(); ++i) {
      const Tensor& component = ctx->input(i);
      OP_REQUIRES(
          ctx, component.dims() >= 1 && component.dim_size(0) == n,
          errors::InvalidArgument(
              "rows[", i - 1, "] must have ", n, " rows (the length of ",
              kPositions, "), got shape ", component.shape().DebugString()));
      components.push_back(component);
    }
    std::shared_ptr<RowStore> store;
    OP_REQUIRES_OK(ctx, StoreOf(ctx->input(0), key_, &dtypes_, &store));
    if (store != nullptr) {
      OP_REQUIRES_OK(ctx, store->Accept(dtypes_));
      OP_REQUIRES_OK(ctx, store->Put(ctx->input(0), components));
    }
    for (int i = 1; i < ctx->num_inputs(); ++i) {
      ctx->set_output(i - 1, ctx->input(i));
    }
  }

 private:
  std::string key_;
  DataTypeVector dtypes_;
};

class IntuneRowStoreGatherOp : public OpKernel {
 public:
  explicit IntuneRowStoreGatherOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kRowStoreKeyAttr, &key_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kRowStoreTypesAttr, &dtypes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr(kRowStoreShapesAttr, &shapes_));
    OP_REQUIRES_OK(ctx, CheckRowTypes(dtypes_));
    OP_REQUIRES(ctx, shapes_.size() == dtypes_.size(),
                errors::InvalidArgument(
                    "Got ", shapes_.size(), " ", kRowStoreShapesAttr, " for ",
                    dtypes_.size(), " dtypes (", kRowStoreTypesAttr, ")."));
  }

  void Compute(OpKernelContext* ctx) override {
    if (!CheckPositions(ctx)) return;
    std::shared_ptr<RowStore> store;
    OP_REQUIRES_OK(ctx, StoreOf(ctx->input(0), key_, nullptr, &store));
    OP_REQUIRES(ctx, store != nullptr,
                errors::InvalidArgument(
                    "Row store ", key_, " holds no rows: only a batch whose "
                    "rows are all stored (IntuneRowStoreHas) can be "
                    "gathered."));
    OP_REQUIRES_OK(ctx, store->Accept(dtypes_));
    std::vector<Tensor> out;
    OP_REQUIRES_OK(ctx, store->Gather(ctx->input(0), shapes_, &out));
    for (size_t i = 0; i < out.size(); ++i) ctx->set_output(i, out[i]);
  }

 private:
  std::string key_;
  DataTypeVector dtypes_;
  std::vector<PartialTensorShape> shapes_;
};

REGISTER_KERNEL_BUILDER(Name(kRowStoreHasOp).Device(DEVICE_CPU),
                        IntuneRowStoreHasOp);
REGISTER_KERNEL_BUILDER(Name(kRowStorePutOp).Device(DEVICE_CPU),
                        IntuneRowStorePutOp);
REGISTER_KERNEL_BUILDER(Name(kRowStoreGatherOp).Device(DEVICE_CPU),
                        IntuneRowStoreGatherOp);

// Stateful for the graph's optimizers (never folded, pruned or merged), but
// nothing of theirs belongs in an iterator checkpoint: a store holds only
// what its map computes again without it.
ALLOW_STATEFUL_OP_FOR_DATASET_FUNCTIONS(kRowStoreHasOp);
ALLOW_STATEFUL_OP_FOR_DATASET_FUNCTIONS(kRowStorePutOp);
ALLOW_STATEFUL_OP_FOR_DATASET_FUNCTIONS(kRowStoreGatherOp);
// Also in TensorFlow's own copies of the allowlist, where this library's
// is another (TensorFlow 2.16).
const bool kAllowedInTensorFlow TF_ATTRIBUTE_UNUSED = [] {
  for (const char* op : {kRowStoreHasOp, kRowStorePutOp, kRowStoreGatherOp}) {
    AllowStatefulOpInTensorFlow(op);
  }
  return true;
}();

}  // namespace
}  // namespace intune
}  // namespace tensorflow
