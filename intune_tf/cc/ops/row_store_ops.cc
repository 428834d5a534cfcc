// Op registrations of the row store (kernels/row_store.h,
// kernels/row_store_ops.cc): the ops a row-wise map over batches is wrapped
// with, so that a batch whose rows were all stored skips the map.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "intune_tf/cc/op_names.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace intune {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// The batch dimension: the length of input 0, the positions (a vector).
Status BatchDim(InferenceContext* c, DimensionHandle* dim) {
  ShapeHandle positions;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &positions));
  *dim = c->Dim(positions, 0);
  return OkStatus();
}

const std::string& KeyAttr() {
  static const std::string* attr =
      new std::string(absl::StrCat(kRowStoreKeyAttr, ": string"));
  return *attr;
}

const std::string& TypesAttr() {
  static const std::string* attr =
      new std::string(absl::StrCat(kRowStoreTypesAttr, ": list(type) >= 1"));
  return *attr;
}

}  // namespace

REGISTER_OP(kRowStoreHasOp)
    .Input("positions: int64")
    .Output("stored: bool")
    .Attr(KeyAttr())
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(BatchDim(c, &unused));
      c->set_output(0, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Whether the row store `key` holds a row at every position of `positions`;
false for an empty vector (an empty batch is computed as written) and for a
store that does not exist yet. When true, those rows stay stored (a shrink
of the store leaves them) until the IntuneRowStoreGather of the same
positions, which must follow.
)doc");

REGISTER_OP(kRowStorePutOp)
    .Input("positions: int64")
    .Input(absl::StrCat("rows: ", kRowStoreTypesAttr))
    .Output(absl::StrCat("passed: ", kRowStoreTypesAttr))
    .Attr(KeyAttr())
    .Attr(TypesAttr())
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle batch;
      TF_RETURN_IF_ERROR(BatchDim(c, &batch));
      for (int i = 1; i < c->num_inputs(); ++i) {
        ShapeHandle rows, merged;
        TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(i), 1, &rows));
        TF_RETURN_IF_ERROR(c->ReplaceDim(rows, 0, batch, &merged));
        TF_RETURN_IF_ERROR(c->Merge(rows, merged, &merged));
        c->set_output(i - 1, merged);
      }
      return OkStatus();
    })
    .Doc(R"doc(
Passes `rows` through unchanged, and stores row j of each of them (copied)
under positions[j] in the row store `key`, made on first use. A position
already stored is left as it is. The rows' bytes are taken from the room of
the process's caches, which shrink the row stores first: once a row does not
fit (it says so once in the log) or the store was shrunk, it takes no more
rows. Dense dtypes only (strings included).
)doc");

REGISTER_OP(kRowStoreGatherOp)
    .Input("positions: int64")
    .Output(absl::StrCat("rows: ", kRowStoreTypesAttr))
    .Attr(KeyAttr())
    .Attr(TypesAttr())
    .Attr(absl::StrCat(kRowStoreShapesAttr, ": list(shape) >= 1"))
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle batch;
      TF_RETURN_IF_ERROR(BatchDim(c, &batch));
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr(kRowStoreShapesAttr, &shapes));
      if (static_cast<int>(shapes.size()) != c->num_outputs()) {
        return errors::InvalidArgument(
            "Got ", shapes.size(), " ", kRowStoreShapesAttr, " for ",
            c->num_outputs(), " dtypes (", kRowStoreTypesAttr, ").");
      }
      for (int i = 0; i < c->num_outputs(); ++i) {
        ShapeHandle row, out;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &row));
        TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(batch), row, &out));
        c->set_output(i, out);
      }
      return OkStatus();
    })
    .Doc(R"doc(
Stacks the rows stored under `positions` in the row store `key`: one tensor
[len(positions), *shapes[i]] per dtype of `T`. InvalidArgument when a
position is not stored (IntuneRowStoreHas says whether all are).
)doc");

}  // namespace intune
}  // namespace tensorflow
