// Differences between the TensorFlow releases the kernels build against.
// INTUNE_TF_MAJOR and INTUNE_TF_MINOR come from setup.py (the installed
// TensorFlow's version): TF 2.21's pip headers do not define
// TF_MINOR_VERSION. Inside a TensorFlow Bazel workspace (BUILD), TF's own
// version macros are used.
#ifndef INTUNE_TF_CC_KERNELS_TF_COMPAT_H_
#define INTUNE_TF_CC_KERNELS_TF_COMPAT_H_

#if !defined(INTUNE_TF_MAJOR) || !defined(INTUNE_TF_MINOR)
#include "tensorflow/core/public/version.h"
#if defined(TF_MAJOR_VERSION) && defined(TF_MINOR_VERSION)
#define INTUNE_TF_MAJOR TF_MAJOR_VERSION
#define INTUNE_TF_MINOR TF_MINOR_VERSION
#else
#error "TensorFlow's version is unknown: build with setup.py, which defines INTUNE_TF_MAJOR and INTUNE_TF_MINOR"
#endif
#endif

// DatasetBase::RandomIndexingCompatible and Get(AnyContext, ...) (global
// shuffling): TF 2.17 on.
#define INTUNE_TF_HAS_RANDOM_INDEXING \
  (INTUNE_TF_MAJOR > 2 || (INTUNE_TF_MAJOR == 2 && INTUNE_TF_MINOR >= 17))

#endif  // INTUNE_TF_CC_KERNELS_TF_COMPAT_H_
