// Differences between the TensorFlow releases the kernels build against.
#ifndef INTUNE_TF_CC_KERNELS_TF_COMPAT_H_
#define INTUNE_TF_CC_KERNELS_TF_COMPAT_H_

#include "tensorflow/core/public/version.h"

// DatasetBase::RandomIndexingCompatible (global shuffling): TF 2.17 on.
#define INTUNE_TF_HAS_RANDOM_INDEXING \
  (TF_MAJOR_VERSION > 2 || (TF_MAJOR_VERSION == 2 && TF_MINOR_VERSION >= 17))

#endif  // INTUNE_TF_CC_KERNELS_TF_COMPAT_H_
