// Op registration of IntuneRewriteGraph (kernel: rewrites/rewrite_graph_op.cc).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace intune {

using shape_inference::InferenceContext;

REGISTER_OP("IntuneRewriteGraph")
    .Input("graph_def: string")
    .Output("rewritten: string")
    .Output("fixed_names: string")
    .Output("fixed_values: int64")
    .Output("skipped: string")
    .Output("structure_changed: bool")
    .Output("fingerprint: string")
    .Output("rewriter_config: string")
    .Output("cache_point: string")
    .Output("cache_reason: string")
    .Attr("include_fixed: bool = false")
    .Attr("insert_prefetch: bool = false")
    .Attr("inner_stats: bool = false")
    .Attr("interleave_buffer: int = 16")
    .Attr("cache: bool = true")
    .SetShapeFn([](InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(2, c->output(1));
      c->set_output(3, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(4, c->Scalar());
      c->set_output(5, c->Scalar());
      c->set_output(6, c->Scalar());
      c->set_output(7, c->Scalar());
      c->set_output(8, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Runs the InTune graph rewrites (rewrites/rewrite.h, RunPasses) on a
serialized dataset GraphDef: for tests and debugging. IntuneRootDataset runs the
same passes inside data::RewriteDataset.

graph_def: a serialized GraphDef.
rewritten: the rewritten GraphDef, serialized.
fixed_names: nodes whose fixed value was made tunable.
fixed_values: their values, in the order of fixed_names.
skipped: one line per pass that could not apply, and why.
structure_changed: whether datasets were added or removed.
fingerprint: the warm-start fingerprint of graph_def (before the passes).
rewriter_config: the serialized RewriterConfig that IntuneRootDataset gives
  data::RewriteDataset for these options (MakeRewriterConfig).
interleave_buffer: results each input of a parallel interleave of records
  may buffer; 0 keeps TF's.
cache_point: the node insert_cache put InTune's cache above; empty if none.
cache_reason: why there, or why nowhere; empty if the pass did not run.
cache: run insert_cache.
)doc");

REGISTER_OP("IntuneCachePoint")
    .Input("graph_def: string")
    .Output("node: string")
    .Output("reason: string")
    .SetShapeFn([](InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Where a dataset graph stops changing between epochs (rewrites/passes.h,
FindCachePoint): the node above which InTune's cache goes. For tests and
debugging.

graph_def: a serialized GraphDef.
node: the node whose elements are the same every epoch; empty if none.
reason: what ends the pure part of the pipeline, or why there is no point.
)doc");

}  // namespace intune
}  // namespace tensorflow
