// Functions of libtensorflow_cc.so.2 that the kernels call, found at run time.
//
// The kernel library links only libtensorflow_framework.so.2. TensorFlow's
// Python module has already loaded libtensorflow_cc.so.2 (RTLD_LOCAL on some
// releases, so its symbols cannot be bound when the library loads); these
// functions are looked up in that copy with dlsym, under the mangled names
// that the build (tools/kernel_build.py) read for this TensorFlow minor.
// Inside a TensorFlow Bazel workspace (BUILD), where no names are given, they
// are the functions themselves.
#ifndef INTUNE_TF_CC_TF_CC_SYMBOLS_H_
#define INTUNE_TF_CC_TF_CC_SYMBOLS_H_

#include <string>

#include "tensorflow/core/data/rewrite_utils.h"
#include "tensorflow/core/platform/status.h"
#include "tensorflow/core/platform/statusor.h"

namespace tensorflow {
namespace intune {

using RewriteDatasetFn = decltype(&data::RewriteDataset);
using CreateRewriterConfigFn = decltype(&data::CreateRewriterConfig);

// data::RewriteDataset, or FailedPrecondition naming the library and symbol
// when the running TensorFlow does not provide it. Looked up once.
StatusOr<RewriteDatasetFn> FindRewriteDataset();

// data::CreateRewriterConfig, as FindRewriteDataset.
StatusOr<CreateRewriterConfigFn> FindCreateRewriterConfig();

// Adds `op` to the copies of data::AllowlistedStatefulOpRegistry that
// TensorFlow's libraries (libtensorflow_framework.so.2,
// libtensorflow_cc.so.2) made, where they are not the copy that
// ALLOW_STATEFUL_OP_FOR_DATASET_FUNCTIONS reaches from this library: on
// TensorFlow 2.16 this library keeps a registry of its own, and saving an
// iterator refuses an op missing from TensorFlow's as stateful. Returns the
// copies it was added to.
int AllowStatefulOpInTensorFlow(const std::string& op);

}  // namespace intune
}  // namespace tensorflow

#endif  // INTUNE_TF_CC_TF_CC_SYMBOLS_H_
