// Internals shared by rewrite.cc, the Grappler optimizer and the
// IntuneRewriteGraph kernel.
#ifndef INTUNE_TF_REWRITES_OPTIMIZER_H_
#define INTUNE_TF_REWRITES_OPTIMIZER_H_

#include <string>

#include "google/protobuf/map.h"
#include "rewrites/rewrite.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/platform/status.h"

namespace tensorflow {
namespace intune {
namespace rewrites {

// Names of the Options fields, as the optimizer's parameters and as the
// attrs of IntuneRewriteGraph.
inline constexpr char kTune[] = "tune";
inline constexpr char kIncludeFixed[] = "include_fixed";
inline constexpr char kInsertPrefetch[] = "insert_prefetch";
inline constexpr char kInnerStats[] = "inner_stats";
inline constexpr char kInterleaveBuffer[] = "interleave_buffer";
inline constexpr char kCache[] = "cache";
inline constexpr char kTfOptimizations[] = "tf_optimizations";
inline constexpr char kTfOptimizationConfigs[] = "tf_optimization_configs";

using ParameterMap = google::protobuf::Map<std::string, AttrValue>;

void OptionsToParameters(const Options& options, ParameterMap* parameters);

// Fields missing from `parameters` keep their defaults.
Status OptionsFromParameters(const ParameterMap& parameters, Options* options);

// Hands `report` to the innermost ScopedReport alive on this thread, if any.
void PublishReport(Report report);

}  // namespace rewrites
}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_REWRITES_OPTIMIZER_H_
