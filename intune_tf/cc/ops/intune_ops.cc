// Op registrations of the InTune kernel library (kernels live in kernels/).
#include "intune_tf/cc/layout.h"
#include "intune_tf/cc/op_names.h"
#include "intune_tf/cc/settings_fields.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace intune {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// Shape functions of the control ops: inputs of the documented rank.
Status InputRank(InferenceContext* c, int index, int rank) {
  ShapeHandle unused;
  return c->WithRank(c->input(index), rank, &unused);
}

// One scalar session id in, outputs `vectors` vectors of unknown length.
Status SessionInVectorsOut(InferenceContext* c, int vectors) {
  TF_RETURN_IF_ERROR(InputRank(c, 0, 0));
  for (int i = 0; i < vectors; ++i) {
    c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
  }
  c->set_output(vectors, c->Scalar());  // found
  return OkStatus();
}

REGISTER_OP("IntuneOptionsDataset")
    .Input("input_dataset: variant")
    .Output("handle: variant")
    // The settings attributes, from their one list (settings_fields.h).
    INTUNE_SETTINGS_FIELDS(INTUNE_SETTING_ATTR_SPEC)
    .Attr("output_types: list(type) >= 1")
    .Attr("output_shapes: list(shape) >= 1")
    .Attr("metadata: string = ''")
    .SetTypeConstructor(full_type::VariadicTensorContainer(TFT_DATASET,
                                                           "output_types"))
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
The `experimental_intune` option of a pipeline, carried in its graph. It
computes nothing; the InTune root made at iterator creation reads it and
removes it.

tag: the IntuneOptions JSON (shown by session listings).
enabled: False when the option was set to False.
ram_budget: bytes the pipeline's buffers may hold; 0: unset, each session
  takes the default in force where its iterator is made
  (IntuneSetDefaultRamBudget).
max_cpus: size of a private runner thread pool (the maximum of every
  parallelism knob); 0 keeps the runner of the iterator context.
guard_period_us: how often the budget guard checks buffered bytes.
include_fixed: graph rewrite option (rewrites/rewrite.h).
insert_prefetch: graph rewrite option (rewrites/rewrite.h).
inner_stats: graph rewrite option (rewrites/rewrite.h).
interleave_buffer: graph rewrite option (rewrites/rewrite.h); 0 keeps TF's.
)doc");

// The root, under its name and under its former name, which graphs saved by
// earlier releases carry (op_names.h: kRootOp, kLegacyRootOp); one
// kernel serves both.
#define INTUNE_REGISTER_ROOT_OP(name, doc)                                 \
  REGISTER_OP(name)                                                        \
      .Input("input_dataset: variant")                                     \
      .Output("handle: variant")                                           \
      INTUNE_SETTINGS_FIELDS(INTUNE_SETTING_ATTR_SPEC)                     \
      .Attr("find_settings: bool = false")                                 \
      .Attr("output_types: list(type) >= 1")                               \
      .Attr("output_shapes: list(shape) >= 1")                             \
      .Attr("metadata: string = ''")                                       \
      .SetTypeConstructor(                                                 \
          full_type::VariadicTensorContainer(TFT_DATASET, "output_types")) \
      .SetShapeFn(shape_inference::ScalarShape)                            \
      .Doc(doc)

INTUNE_REGISTER_ROOT_OP(kRootOp, R"doc(
The root of a tuned tf.data pipeline, made when its iterator is made: rewrites
its input by reference (TF's rewrite path), owns the autotuning model of the
rewritten input and publishes it as a live tuning session.

find_settings: take the settings from the IntuneOptionsDataset in force below
  (TF's order for options) instead of this op's attributes; with none, or
  with the option off, the op returns its input unchanged. The other
  attributes are those of IntuneOptionsDataset.
)doc");

INTUNE_REGISTER_ROOT_OP(kLegacyRootOp, R"doc(
IntuneRootDataset under its former name, kept so that saved graphs that carry
it load and run.
)doc");

#undef INTUNE_REGISTER_ROOT_OP

REGISTER_OP("IntuneUntrackedDataset")
    .Input("input_dataset: variant")
    .Output("handle: variant")
    .Attr("output_types: list(type) >= 1")
    .Attr("output_shapes: list(shape) >= 1")
    .Attr("buffer_group: string = ''")
    .Attr("metadata: string = ''")
    .SetTypeConstructor(full_type::VariadicTensorContainer(TFT_DATASET,
                                                           "output_types"))
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
A pass-through dataset whose input runs without the autotuning model: one
node in the model stands for its whole input, whose iterators record no
statistics (the rewrite puts it around an interleave's per-element datasets).
With a `buffer_group`, each of its iterators is one input of a parallel
interleave whose per-input buffers the budget guard bounds.
)doc");

REGISTER_OP("IntuneCacheDataset")
    .Input("input_dataset: variant")
    .Output("handle: variant")
    .Attr("output_types: list(type) >= 1")
    .Attr("output_shapes: list(shape) >= 1")
    .Attr("cache_point: string = ''")
    .Attr("unordered: string = ''")
    .Attr("row_store: string = ''")
    .Attr("metadata: string = ''")
    .SetTypeConstructor(full_type::VariadicTensorContainer(TFT_DATASET,
                                                           "output_types"))
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
InTune's cache, put by the rewrite where the pipeline stops changing from one
epoch to the next. Its elements outlive the iterator, in a process-wide store
keyed by the input's graph and tensors and checked against its files' size and
modification time at each epoch, under the session's RAM budget. Never
iterator state (a checkpoint holds the position, not the elements).

cache_point: the node it caches, for display.
unordered: why its input may give its elements in another order each epoch
  (empty: the order is fixed). Such a cache serves an epoch only when it holds
  all of it; otherwise the input runs as if there were no cache.
row_store: the key of the row store of the map above the cache (empty:
  none). Each element then comes with its position (int64, before its
  components), which names the store that the cache's entry owns; -1 when
  there is none.
)doc");

REGISTER_OP("IntuneBufferReleaseDataset")
    .Input("input_dataset: variant")
    .Output("handle: variant")
    .Attr("output_types: list(type) >= 1")
    .Attr("output_shapes: list(shape) >= 1")
    .Attr("buffer_group: string")
    .Attr("records_per_input: int >= 1")
    .Attr("metadata: string = ''")
    .SetTypeConstructor(full_type::VariadicTensorContainer(TFT_DATASET,
                                                           "output_types"))
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
A pass-through dataset above a parallel interleave of records whose per-input
buffers (`records_per_input` each) the budget guard bounds: it reports each
record that leaves the interleave to the inputs of `buffer_group`.
)doc");

REGISTER_OP("IntuneListSessions")
    .Output("session_ids: int64")
    .Output("tags: string")
    .Output("creator_threads: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < 3; ++i) {
        c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      }
      return OkStatus();
    });

// The ops below that name a session end with `found`: false when the session
// is gone (its iterator destroyed or exhausted and released), every other
// output then empty (zeros). A session that ends between the tuner's listing
// and its call is an expected outcome, not an error: TensorFlow logs a
// warning for an op that fails.
REGISTER_OP("IntuneModelProto")
    .Input("session_id: int64")
    .Output("model_proto: string")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRank(c, 0, 0));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return OkStatus();
    });

REGISTER_OP("IntuneStageNames")
    .Input("model_proto: string")
    .Input("root: string")
    .Output("node_ids: int64")
    .Output("stage_names: string")
    .Output("parent_ids: int64")
    .Output("bounded: bool")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRank(c, 0, 0));
      TF_RETURN_IF_ERROR(InputRank(c, 1, 0));
      for (int i = 0; i < 4; ++i) {
        c->set_output(i, c->Vector(InferenceContext::kUnknownDim));
      }
      return OkStatus();
    })
    .Doc(R"doc(
The stage names of the nodes of a serialized `ModelProto`, with the grammar a
live tuning session names its nodes by (stage_names.h), for models no session
names (TF AUTOTUNE's). A top node named `root` is left out of the names below
it. `parent_ids`: the node each was reached from (-1: the output), past any
release node. `bounded`: the node is an interleave whose records a release
node bounds.
)doc");

REGISTER_OP("IntuneListKnobs")
    .Input("session_id: int64")
    .Output("names: string")
    .Output("values: float64")
    .Output("mins: float64")
    .Output("maxs: float64")
    .Output("displays: string")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return SessionInVectorsOut(c, 5); })
    .Doc(R"doc(
The live knobs of a session, sorted by name: one per knob name (the
instances of a stage inside an interleave's function share it), with the
value of its first instance, the range every instance accepts, and the
instances' node long names ("<Name>(id:<n>)", comma-separated).
)doc");

REGISTER_OP("IntuneSetKnobs")
    .Input("session_id: int64")
    .Input("names: string")
    .Input("values: float64")
    .Output("applied: float64")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRank(c, 0, 0));
      ShapeHandle names, values, merged;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &names));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &values));
      TF_RETURN_IF_ERROR(c->Merge(names, values, &merged));
      c->set_output(0, merged);
      c->set_output(1, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
Sets knobs by name, all or none: each value must be finite and within its
knob's range; it is rounded, written to every live instance of the knob and
remembered for the instances created later. Returns the values in force.
)doc");

REGISTER_OP("IntuneSessionCounters")
    .Input("session_id: int64")
    .Output("counters: int64")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRank(c, 0, 0));
      c->set_output(0, c->Vector(kNumCounters));
      c->set_output(1, c->Scalar());
      return OkStatus();
    });

REGISTER_OP("IntuneSessionCache")
    .Input("session_id: int64")
    .Output("state: string")
    .Output("point: string")
    .Output("reason: string")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRank(c, 0, 0));
      for (int i = 0; i < 4; ++i) c->set_output(i, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
What became of the session's cache (intune_tf/cc/cache_decision.h).

state: "placed", "declined" or "off" (the option's cache is off), as
  intune_tf.CacheState spells them.
point: the node the cache holds the elements of; for a declined cache, where
  it was (empty when no place was found).
reason: why there, or why no cache; empty when off.
)doc");

REGISTER_OP("IntuneObserve")
    .Input("session_id: int64")
    .Output("knob_names: string")
    .Output("knob_values: float64")
    .Output("stage_names: string")
    .Output("stage_stats: int64")
    .Output("counters: int64")
    .Output("knob_displays: string")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRank(c, 0, 0));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim,
                                   kNumKnobColumns));
      c->set_output(2, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(3, c->Matrix(InferenceContext::kUnknownDim,
                                   kNumStageColumns));
      c->set_output(4, c->Vector(kNumCounters));
      c->set_output(5, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(6, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
One tuning step's reading of a session: knob names and [value, min, max]
(as IntuneListKnobs); the model's nodes breadth first from the output, by
stage name, with the columns IntuneLayout names; the counters of
IntuneSessionCounters; the knobs' node long names (as IntuneListKnobs).
)doc");

REGISTER_OP("IntuneLayout")
    .Output("counters: string")
    .Output("stage_columns: string")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(kNumCounters));
      c->set_output(1, c->Vector(kNumStageColumns));
      return OkStatus();
    })
    .Doc(R"doc(
The names of the counters (IntuneSessionCounters, IntuneObserve) and of the
stage_stats columns (IntuneObserve), in output order.
)doc");

REGISTER_OP("IntuneSetRamBudget")
    .Input("session_id: int64")
    .Input("ram_budget: int64")
    .Attr("pin: bool = false")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRank(c, 0, 0));
      c->set_output(0, c->Scalar());
      return InputRank(c, 1, 0);
    })
    .Doc(R"doc(
Sets a session's RAM budget (bytes, >= 0; 0: no guard); with `pin`, as the
user's, which the tuner then keeps.
)doc");

REGISTER_OP("IntuneProcessCaches")
    .Output("figures: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(5));
      return OkStatus();
    })
    .Doc(R"doc(
The process's caches (every entry alive, with an iterator or without one):
[entries, bytes held (the row stores' rows included), the most they may hold (-1: no budget), the process's
budget for caches and buffers (0: none), bytes the live sessions' buffers
hold].
)doc");

REGISTER_OP("IntuneSetDefaultRamBudget")
    .Input("ram_budget: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return InputRank(c, 0, 0); })
    .Doc(R"doc(
The RAM budget (bytes, >= 0) of the sessions made from now on whose options
leave it unset (ram_budget 0 in the graph): the tuner resolves it on the
machine that makes the iterator.
)doc");

}  // namespace intune
}  // namespace tensorflow
