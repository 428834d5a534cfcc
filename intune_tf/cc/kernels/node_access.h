// Reads and writes of TF's model nodes and their parameters.
//
// On a TensorFlow upgrade, check this header first: NodeAccess reads
// protected members of `model::Node` (its mutex and its parameters), and the
// helpers below rely on how `model::Parameter` and its shared state are
// locked (tensorflow/core/framework/model.h). It is the one file of the
// kernels that touches TF model internals.
#ifndef INTUNE_TF_CC_KERNELS_NODE_ACCESS_H_
#define INTUNE_TF_CC_KERNELS_NODE_ACCESS_H_

#include <memory>
#include <vector>

#include "tensorflow/core/framework/model.h"
#include "tensorflow/core/platform/mutex.h"

namespace tensorflow {
namespace intune {

namespace model = ::tensorflow::data::model;

inline constexpr char kParallelism[] = "parallelism";
inline constexpr char kBufferSize[] = "buffer_size";
// The largest double below 2^63: TF's iterators convert knob values to int64,
// and a buffer knob's maximum (2^63 as a double) does not fit one.
inline constexpr double kMaxInt64Double = 9223372036854774784.0;

// What the model does not expose publicly, read from a node's protected
// members: a class derived from Node may name them, and a pointer to such a
// member applies to any Node (standard C++, no layout assumption). The class
// is never instantiated.
//
// - The node's own mutex. TF's readers of `Parameter::value`
//   (Node::ToProto, Node::ParameterValue) hold it, shared; Node has no public
//   setter of a parameter's value that takes it (SyncStateValuesToParameter
//   Values, what TF's optimizer uses, writes under a shared lock of the
//   parameter's state only).
// - The node's parameters. Node::CollectNodeTunableParameters leaves out
//   nodes that have produced no element yet, and nodes TF does not autotune
//   (the iterators of an interleave's input elements): both are knobs here.
class NodeAccess : public model::Node {
 public:
  static mutex& Mutex(model::Node& node) {
    return node.*(&NodeAccess::mu_);
  }

  // The node's tunable parameters, sorted by name.
  static std::vector<std::shared_ptr<model::Parameter>> TunableParameters(
      model::Node& node);
};

// Every node of the model below `node`, `node` first.
void CollectNodes(const std::shared_ptr<model::Node>& node,
                  std::vector<std::shared_ptr<model::Node>>* out);

// The bytes of one element of `node`: of those buffered, else of those
// produced, else 0.
double BytesPerElement(const model::Node& node);

// The knob's minimum: a buffer never goes below one element. TF's prefetch
// with a buffer of 0 hands its consumer elements straight from its input
// while its own buffer still holds earlier ones: the order changes.
double KnobMin(const model::Parameter& p);

// The value in force, as the iterator reads it (kAutotune, before the
// iterator's Initialize gives its default, reads as `raw`).
double RawValue(const model::Parameter& p);

// RawValue, with kAutotune read as the knob's minimum.
double ReadValue(const model::Parameter& p);

// `value` within [min, max], and within what an int64 holds.
double Clamp(double value, double min, double max);

// Writes a value, clamped to the knob's range, where the iterator reads
// it (the shared state, under its lock) and where the model's readers do
// (Parameter::value, under the node's lock). The two locks are never held
// together.
void WriteValue(model::Node* node, model::Parameter* p, double value);

// The TF starting size of a buffer knob: the legacy prefetch autotuner (what
// TF uses for a user's prefetch(AUTOTUNE)) starts at max(1, buffer_size_min),
// and buffer_size_min is the knob's minimum.
double StartingBufferSize(const model::Parameter& p);

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_KERNELS_NODE_ACCESS_H_
