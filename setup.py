"""Builds intune_tf and its TensorFlow kernel library.

The kernel library is compiled against the TensorFlow installed in the current
environment, with every compile and link flag taken from `tf.sysconfig`.
Install with `pip install --no-build-isolation .` (or `-e .`) so that the build
sees that TensorFlow.
"""

import os

import setuptools
from setuptools.command import build_ext as _build_ext

# Keep in sync with the `srcs` of BUILD (tests/test_build_files.py checks it).
KERNEL_SOURCES = [
    "intune_tf/cc/kernels/intune_dataset_op.cc",
    "intune_tf/cc/kernels/bounded_buffers.cc",
    "intune_tf/cc/kernels/budget_guard.cc",
    "intune_tf/cc/kernels/buffer_release_dataset_op.cc",
    "intune_tf/cc/kernels/control_ops.cc",
    "intune_tf/cc/kernels/session_registry.cc",
    "intune_tf/cc/kernels/untracked_dataset_op.cc",
    "intune_tf/cc/kernels/options_dataset_op.cc",
    "intune_tf/cc/kernels/settings.cc",
    "intune_tf/cc/ops/intune_ops.cc",
    "intune_tf/cc/ops/rewrite_ops.cc",
    "rewrites/fingerprint.cc",
    "rewrites/graph_utils.cc",
    "rewrites/insert_prefetch.cc",
    "rewrites/interleave_buffers.cc",
    "rewrites/make_tunable.cc",
    "rewrites/optimizer.cc",
    "rewrites/rewrite.cc",
    "rewrites/rewrite_graph_op.cc",
    "rewrites/strip_roots.cc",
    "rewrites/tf_autotune.cc",
    "rewrites/untrack_inner.cc",
]
KERNEL_HEADERS = [
    "intune_tf/cc/kernels/bounded_buffers.h",
    "intune_tf/cc/kernels/budget_guard.h",
    "intune_tf/cc/kernels/pass_through.h",
    "intune_tf/cc/kernels/session_registry.h",
    "intune_tf/cc/kernels/settings.h",
    "intune_tf/cc/kernels/tf_compat.h",
    "intune_tf/cc/layout.h",
    "rewrites/graph_utils.h",
    "rewrites/optimizer.h",
    "rewrites/passes.h",
    "rewrites/rewrite.h",
]


# data::RewriteDataset, which IntuneDataset calls to run the rewrites, lives in
# libtensorflow_cc.so.2 (the Grappler optimizer registry is in
# libtensorflow_framework.so.2), and tf.sysconfig.get_link_flags() names only
# the framework. TF 2.21 happens to load libtensorflow_cc RTLD_GLOBAL; TF 2.16
# does not, and the library then fails to load with an undefined symbol.
TF_CC_LIBRARY = "libtensorflow_cc.so.2"


def _tf_cc_link_flags(lib_dir: str) -> list[str]:
  if not os.path.exists(os.path.join(lib_dir, TF_CC_LIBRARY)):
    raise RuntimeError(f"{TF_CC_LIBRARY} not found in {lib_dir}: the InTune "
                       "kernel library links it for data::RewriteDataset.")
  return ["-L" + lib_dir, "-l:" + TF_CC_LIBRARY]


def _write_stamp(directory: str) -> None:
  """Records, next to the library, which TensorFlow it was built for."""
  import tensorflow as tf  # noqa: PLC0415

  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "_intune_ops.tfversion"), "w") as f:
    f.write(tf.__version__ + "\n")


class BuildTfKernels(_build_ext.build_ext):
  """Compiles the op library with the flags of the installed TensorFlow."""

  def build_extension(self, ext):
    import tensorflow as tf  # noqa: PLC0415

    ext.extra_compile_args = list(tf.sysconfig.get_compile_flags()) + [
        "-O2", "-fPIC", "-Wno-sign-compare", "-Wno-deprecated-declarations",
        "-g0"]
    ext.extra_link_args = (list(tf.sysconfig.get_link_flags()) +
                           _tf_cc_link_flags(tf.sysconfig.get_lib()))
    major, minor = (int(part) for part in tf.__version__.split(".")[:2])
    # TF 2.21's headers no longer define TF_MINOR_VERSION (its build does).
    ext.define_macros = [("INTUNE_TF_BUILT_FOR", '"%s"' % tf.__version__),
                         ("INTUNE_TF_MAJOR", str(major)),
                         ("INTUNE_TF_MINOR", str(minor))]
    super().build_extension(ext)
    _write_stamp(os.path.dirname(self.get_ext_fullpath(ext.name)))

  def copy_extensions_to_source(self):
    super().copy_extensions_to_source()
    _write_stamp(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "intune_tf", "ops"))

  def get_ext_filename(self, ext_name):
    # A TensorFlow op library, not a Python extension module: plain name.
    return os.path.join(*ext_name.split(".")) + ".so"

  def get_export_symbols(self, ext):
    return []


setuptools.setup(
    name="intune_tf",
    version="0.1.0",
    description="InTune: reinforcement-learning tuning of tf.data pipelines",
    python_requires=">=3.10",
    packages=["intune_tf", "intune_tf.ops", "intune_tf.tuning",
              "intune_tf.agent", "intune_tf.sim", "intune_tf.observe",
              "intune_tf.bench", "intune_tf.tfx", "intune_tf.rewrites",
              "intune_tf.criteo"],
    package_dir={
        "intune_tf": "intune_tf",
        "intune_tf.rewrites": "rewrites",
        "intune_tf.criteo": "criteo",
    },
    package_data={
        "intune_tf.ops": ["_intune_ops.tfversion"],
        "intune_tf.agent": ["weights.npz", "ranker.npz", "jump_ranker.npz"],
        "intune_tf.criteo": ["data/*"],
    },
    ext_modules=[
        setuptools.Extension(
            "intune_tf.ops._intune_ops",
            sources=KERNEL_SOURCES,
            depends=KERNEL_HEADERS,
            include_dirs=[os.path.dirname(os.path.abspath(__file__))],
            language="c++",
        )
    ],
    cmdclass={"build_ext": BuildTfKernels},
    install_requires=[
        "numpy>=1.23,<3",
        "psutil>=5.9,<8",
        "absl-py>=1.0,<3",
    ],
    # Plots and progress bars: the demo, `intune bench` and pretraining.
    extras_require={"bench": ["matplotlib>=3.7,<4", "tqdm>=4.60,<5"]},
    entry_points={"console_scripts": ["intune=intune_tf.cli:run"]},
)
