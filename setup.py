"""Builds intune_tf and its TensorFlow kernel library.

A source build compiles the kernel library against the TensorFlow installed in
the current environment (tools/kernel_build.py, every flag from
`tf.sysconfig`): install with `pip install --no-build-isolation .` (or `-e .`)
so that the build sees that TensorFlow. `make wheel` instead packs the
libraries it built for every supported TensorFlow minor (INTUNE_PREBUILT=1).
"""

import os
import re
import sys

import setuptools
from setuptools.command import build_ext as _build_ext

try:
  from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # setuptools < 70.1
  from wheel.bdist_wheel import bdist_wheel as _bdist_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
from tools import kernel_build  # noqa: E402  needs ROOT on the path

# `make wheel` sets this after building one library per supported TensorFlow
# minor into intune_tf/ops/_lib/ (tools/kernel_build.py): the wheel carries
# those, and nothing is compiled here.
PREBUILT = os.environ.get("INTUNE_PREBUILT") == "1"
# Commands that compile the kernel library in a source build.
_COMPILING = {"build", "build_ext", "bdist_wheel", "editable_wheel",
              "install", "develop"}
_NEEDS_TENSORFLOW = """\
error: building intune_tf from source needs TensorFlow, and `import tensorflow`
failed in this build environment (pip builds in an isolated environment unless
told not to). The kernel library is compiled against the TensorFlow that the
package will run with. Either:
  - install the prebuilt wheel (no compiler needed):  pip install intune-tf
  - or install TensorFlow, then build without isolation:
      pip install 'tensorflow-cpu==2.21.*'
      pip install --no-build-isolation .            (in an intune_tf checkout)
      pip install --no-binary intune-tf --no-build-isolation intune-tf
"""


def _exit_unless_tensorflow() -> None:
  """A source build without TensorFlow stops here, with what to do."""
  try:
    import tensorflow  # noqa: F401, PLC0415  only for builds that compile
  except ModuleNotFoundError as e:
    if e.name != "tensorflow":
      raise
    sys.exit(_NEEDS_TENSORFLOW)




def _version() -> str:
  """The package's version, whose one home is intune_tf/__init__.py."""
  with open(os.path.join(ROOT, "intune_tf", "__init__.py")) as f:
    found = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M)
  if found is None:
    sys.exit("error: intune_tf/__init__.py has no __version__ line")
  return found.group(1)


if not PREBUILT and _COMPILING & set(sys.argv[1:]):
  _exit_unless_tensorflow()


def _write_stamp(directory: str, version: str) -> None:
  """Records, next to the library, which TensorFlow it was built for."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, kernel_build.STAMP), "w") as f:
    f.write(version + "\n")


class BuildTfKernels(_build_ext.build_ext):
  """Compiles the op library with the flags of the installed TensorFlow."""

  def build_extension(self, ext):
    tf = kernel_build.tf_info_here()
    self._tf_version = tf.version
    out_dir = os.path.dirname(self.get_ext_fullpath(ext.name))
    major, minor = tf.major_minor
    kernel_build.build(
        tf, out_dir,
        objdir=os.path.join(self.build_temp, "kernels", f"tf{major}_{minor}"),
        jobs=int(self.parallel or os.environ.get("INTUNE_BUILD_JOBS", 2)))

  # The TensorFlow the library was built for; None when nothing was built
  # (INTUNE_PREBUILT: the package has no extension to build).
  _tf_version = None

  def copy_extensions_to_source(self):
    super().copy_extensions_to_source()
    if self._tf_version is not None:
      _write_stamp(os.path.join(ROOT, "intune_tf", "ops"), self._tf_version)

  def get_ext_filename(self, ext_name):
    # A TensorFlow op library, not a Python extension module: plain name.
    return os.path.join(*ext_name.split(".")) + ".so"

  def get_export_symbols(self, ext):
    return []


class BinaryDistribution(setuptools.Distribution):
  """Platform-specific, prebuilt libraries (INTUNE_PREBUILT) included: they
  install to platlib, where auditwheel looks for them."""

  def has_ext_modules(self):
    return True


class BdistWheel(_bdist_wheel):
  """py3-none: the kernel library uses no Python C-API symbol."""

  def get_tag(self):
    _, _, platform = super().get_tag()
    return "py3", "none", platform


_OPS_DATA = (["_lib/*/" + kernel_build.LIBRARY, "_lib/*/" + kernel_build.STAMP]
             if PREBUILT else [kernel_build.STAMP])
_EXTENSIONS = [] if PREBUILT else [
    setuptools.Extension(
        "intune_tf.ops._intune_ops",
        sources=kernel_build.KERNEL_SOURCES,
        depends=kernel_build.KERNEL_HEADERS,
        language="c++",
    )
]

setuptools.setup(
    name="intune_tf",
    version=_version(),
    description=("InTune: live tuning of tf.data input pipelines under CPU "
                 "and RAM budgets"),
    long_description=open(os.path.join(ROOT, "README.md")).read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    python_requires=">=3.10",
    packages=["intune_tf", "intune_tf.ops", "intune_tf.tuning",
              "intune_tf.live", "intune_tf.tfdata",
              "intune_tf.agent", "intune_tf.sim", "intune_tf.observe",
              "intune_tf.bench", "intune_tf.tfx", "intune_tf.rewrites",
              "intune_tf.criteo", "intune_tf.service"],
    package_dir={
        "intune_tf": "intune_tf",
        "intune_tf.rewrites": "rewrites",
        "intune_tf.criteo": "criteo",
    },
    package_data={
        "intune_tf.ops": _OPS_DATA,
        "intune_tf.agent": ["weights.npz", "ranker.npz", "jump_ranker.npz",
                            "allocator.npz"],
        "intune_tf.criteo": ["data/*"],
    },
    ext_modules=_EXTENSIONS,
    cmdclass={"build_ext": BuildTfKernels, "bdist_wheel": BdistWheel},
    distclass=BinaryDistribution,
    install_requires=[
        "numpy>=1.23,<3",
        "psutil>=5.9,<8",
        "absl-py>=1.0,<3",
    ],
    # TensorFlow is the user's choice (tensorflow or tensorflow-cpu), so it is
    # an extra; the prebuilt libraries serve these minors (tf_versions.py).
    extras_require={
        "tensorflow": ["tensorflow>=2.16,<2.22"],
        "tensorflow-cpu": ["tensorflow-cpu>=2.16,<2.22"],
        # IntuneCallback(log_dir=...): TF >= 2.21 no longer installs it.
        "tensorboard": ["tensorboard>=2.16,<3"],
        # Plots and progress bars: the demo, `intune bench` and pretraining.
        "bench": ["matplotlib>=3.7,<4", "tqdm>=4.60,<5"],
    },
    entry_points={"console_scripts": ["intune=intune_tf.cli:run"]},
)
