// The stage-name grammar, as pure functions of plain values.
//
// No TF types: it compiles with plain g++ (tests/cc/stage_names_test.cc).
// TuningSession walks the model's nodes and names each new one with
// OutputStageName / InputStageName.
//
// A stage's name is its place in the pipeline, so that it survives the
// re-creation of the stage's iterator (every epoch of a `repeat` above it, a
// new or restored iterator, each input element of an interleave): the names
// of the model's nodes from the pipeline's output down to the stage, joined
// by ".", for example "Prefetch.ParallelMapV2" (the root's own node, named
// "Intune", is left out). A step that goes into one input among several
// names it in brackets after the node that has them:
//   "Zip[1].ParallelMapV2"   the ParallelMapV2 under input 1 of a zip (same
//                            for concatenate and other multi-input stages);
//   "ParallelInterleaveV4[*].ParallelMapV2"
//                            the ParallelMapV2 of the datasets that an
//                            interleave (or flat_map, group_by_window) makes
//                            from its input elements: every instance is the
//                            same stage and shares its knobs;
//   "ParallelInterleaveV4.TensorSlice"
//                            the interleave's own input (no brackets).
// A knob's name is "<stage name>/<parameter>", e.g.
// "Prefetch.ParallelMapV2/parallelism". Node names keep only [A-Za-z0-9_]
// (anything else becomes "_"). Node ids ("ParallelMapV2(id:3)", TF's long
// names) change with every re-creation: they are kept for display only.
// Python parses names in one place: `intune_tf.records.parse_stage`.
#ifndef INTUNE_TF_CC_KERNELS_STAGE_NAMES_H_
#define INTUNE_TF_CC_KERNELS_STAGE_NAMES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tensorflow {
namespace intune {

// The root's own node, left out of stage names.
inline constexpr char kRootName[] = "Intune";

// Where a node other than the output sits in a walk of the model.
struct StagePlace {
  std::string parent_stage;  // the parent's stage name
  std::string parent_type;   // the parent's node name (its dataset type)
  // The parent is the pipeline's output and a root node, left out of the
  // names below it (kRootName in a live session).
  bool parent_is_root;
  // The node was created right after its parent (its id is the parent's + 1):
  // it is the input its parent's Initialize made, the first input of an
  // interleave or a concatenate.
  bool first;
  int position;  // among the parent's inputs
  int siblings;  // the parent's number of inputs
};

// A node name with anything but [A-Za-z0-9_] replaced by "_".
std::string Sanitize(const std::string& name);

// Stages whose inputs after the first are datasets made from its input
// elements by a function (one per element, all the same stage).
bool IsInterleaveLike(const std::string& type);

// Stages with several inputs of their own (named by index even when only one
// of them is live).
bool IsMultiInput(const std::string& type);

// The label of the step from a parent into one of its inputs: "" (its only or
// own input), "[*]" (the per-element datasets of an interleave-like parent)
// or "[<index>]".
std::string InputLabel(const StagePlace& place);

// The stage name of the pipeline's output node.
std::string OutputStageName(const std::string& node_name);

// The stage name of the node `node_name` at `place`.
std::string InputStageName(const StagePlace& place,
                           const std::string& node_name);

// One node of a whole model as plain values (a `ModelProto` node).
struct ModelNode {
  std::string name;             // its node name (dataset type)
  std::vector<int64_t> inputs;  // its inputs' ids, in order
};

// A node's stage name in a whole model, the node it was reached from (-1 for
// the output), and whether a release node between them makes it a bounded
// interleave (bounded_buffers.h).
struct NamedStage {
  std::string stage;
  int64_t parent = -1;
  bool bounded = false;
};

// Names the nodes of a whole model reachable from `output`, breadth first as
// TuningSession walks a live one: a top node named `root` is left out of the
// names below it, and a node named `release` with one input is passed
// through (unnamed), the node below it marked bounded, with the node above
// as its parent; a node named `cache` with one input is passed through the
// same way, unmarked. Input ids missing from `nodes` are skipped. From one model
// a node's index among several inputs is its position now; a live session
// fixes it when it first sees the node.
std::map<int64_t, NamedStage> NameModelStages(
    int64_t output, const std::map<int64_t, ModelNode>& nodes,
    const std::string& root, const std::string& release,
    const std::string& cache);

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_STAGE_NAMES_H_
