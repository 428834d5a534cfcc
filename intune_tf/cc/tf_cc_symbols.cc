#include "intune_tf/cc/tf_cc_symbols.h"

#include <dlfcn.h>

#include "tensorflow/core/framework/dataset_stateful_op_allowlist.h"
#include "tensorflow/core/platform/errors.h"

namespace tensorflow {
namespace intune {
namespace {

constexpr char kTfCcLibrary[] = "libtensorflow_cc.so.2";

#if defined(INTUNE_REWRITE_DATASET_SYMBOL) && \
    defined(INTUNE_CREATE_REWRITER_CONFIG_SYMBOL)
// `mangled` (the function `name`) in the running TensorFlow.
StatusOr<void*> Lookup(const char* name, const char* mangled) {
  // Already global (a TensorFlow that loads it RTLD_GLOBAL)?
  void* symbol = dlsym(RTLD_DEFAULT, mangled);
  if (symbol == nullptr) {
    // RTLD_NOLOAD: only the copy TensorFlow loaded, never a second one. The
    // handle is never closed: the library stays loaded while in use.
    void* handle = dlopen(kTfCcLibrary, RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) {
      return errors::FailedPrecondition(
          "InTune needs ", name, " from ", kTfCcLibrary, ", which the running "
          "TensorFlow has not loaded (", dlerror(), "). Import tensorflow in "
          "Python before using InTune's kernels.");
    }
    symbol = dlsym(handle, mangled);
  }
  if (symbol == nullptr) {
    return errors::FailedPrecondition(
        kTfCcLibrary, " has no ", name, " (", mangled, "): the InTune kernel "
        "library was built for TensorFlow ", INTUNE_TF_BUILT_FOR, " and does "
        "not match the running TensorFlow. Install the intune_tf wheel for "
        "it, or build intune_tf from source against it.");
  }
  return symbol;
}

template <typename Fn>
StatusOr<Fn> FindSymbol(const char* name, const char* mangled) {
  TF_ASSIGN_OR_RETURN(void* const symbol, Lookup(name, mangled));
  return reinterpret_cast<Fn>(symbol);
}
#define INTUNE_FIND(type, name, mangled) \
  FindSymbol<type>("data::" #name, mangled)
#else
#define INTUNE_FIND(type, name, mangled) StatusOr<type>(&data::name)
#endif

}  // namespace

int AllowStatefulOpInTensorFlow(const std::string& op) {
  int added = 0;
#if defined(INTUNE_REWRITE_DATASET_SYMBOL)
  for (const char* library : {"libtensorflow_framework.so.2", kTfCcLibrary}) {
    void* handle = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    // The static `reg` of the inline AllowlistedStatefulOpRegistry::Global():
    // a pointer, set once its library first called Global().
    void* symbol = dlsym(handle,
                         "_ZZN10tensorflow4data29AllowlistedStatefulOpRegistry"
                         "6GlobalEvE3reg");
    if (symbol == nullptr) continue;
    auto* registry =
        *static_cast<data::AllowlistedStatefulOpRegistry**>(symbol);
    if (registry == nullptr ||
        registry == data::AllowlistedStatefulOpRegistry::Global()) {
      continue;
    }
    if (registry->Add(op).ok()) ++added;
  }
#else
  (void)op;
#endif
  return added;
}

StatusOr<RewriteDatasetFn> FindRewriteDataset() {
  // Thread-safe static initialization: looked up once per process.
  static const auto* const found = new StatusOr<RewriteDatasetFn>(
      INTUNE_FIND(RewriteDatasetFn, RewriteDataset,
                  INTUNE_REWRITE_DATASET_SYMBOL));
  return *found;
}

StatusOr<CreateRewriterConfigFn> FindCreateRewriterConfig() {
  static const auto* const found = new StatusOr<CreateRewriterConfigFn>(
      INTUNE_FIND(CreateRewriterConfigFn, CreateRewriterConfig,
                  INTUNE_CREATE_REWRITER_CONFIG_SYMBOL));
  return *found;
}

}  // namespace intune
}  // namespace tensorflow
