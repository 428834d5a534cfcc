"""Compiles the InTune kernel library against one TensorFlow installation.

Used by setup.py (source builds, for the TensorFlow of the running
interpreter) and by `make wheel` (one library per supported TensorFlow minor,
each from its own venv):

    python tools/kernel_build.py --python /path/to/tf-venv/bin/python \\
        --out intune_tf/ops/_lib/tf2_16 --jobs 2

Every compile and link flag comes from that TensorFlow's `tf.sysconfig`. The
library links only `libtensorflow_framework.so.2`, and carries no run path:
the two functions it needs from `libtensorflow_cc.so.2`
(`data::RewriteDataset`, `data::CreateRewriterConfig`) are looked up at run
time in the copy TensorFlow's Python module has already loaded
(intune_tf/cc/tf_cc_symbols.cc), under their mangled names, which this
module reads from a probe object compiled with the same flags (the names
embed TF's abseil namespace, which changes between minors).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Keep in sync with the `srcs` of BUILD (tests/test_build_files.py checks it).
KERNEL_SOURCES = [
    "intune_tf/cc/kernels/root_dataset_op.cc",
    "intune_tf/cc/kernels/bounded_buffers.cc",
    "intune_tf/cc/kernels/budget_guard.cc",
    "intune_tf/cc/kernels/buffer_release_dataset_op.cc",
    "intune_tf/cc/kernels/cache_dataset_op.cc",
    "intune_tf/cc/kernels/cache_store.cc",
    "intune_tf/cc/kernels/control_ops.cc",
    "intune_tf/cc/kernels/node_access.cc",
    "intune_tf/cc/kernels/session_registry.cc",
    "intune_tf/cc/kernels/stage_names.cc",
    "intune_tf/cc/kernels/stage_names_op.cc",
    "intune_tf/cc/kernels/tuning_session.cc",
    "intune_tf/cc/kernels/untracked_dataset_op.cc",
    "intune_tf/cc/kernels/options_dataset_op.cc",
    "intune_tf/cc/kernels/row_store.cc",
    "intune_tf/cc/kernels/row_store_ops.cc",
    "intune_tf/cc/kernels/settings.cc",
    "intune_tf/cc/graph_walk.cc",
    "intune_tf/cc/tf_cc_symbols.cc",
    "intune_tf/cc/ops/intune_ops.cc",
    "intune_tf/cc/ops/rewrite_ops.cc",
    "intune_tf/cc/ops/row_store_ops.cc",
    "rewrites/cache_point.cc",
    "rewrites/fingerprint.cc",
    "rewrites/graph_utils.cc",
    "rewrites/insert_prefetch.cc",
    "rewrites/insert_row_store.cc",
    "rewrites/interleave_buffers.cc",
    "rewrites/make_tunable.cc",
    "rewrites/optimizer.cc",
    "rewrites/rewrite.cc",
    "rewrites/rewrite_graph_op.cc",
    "rewrites/row_wise.cc",
    "rewrites/strip_roots.cc",
    "rewrites/tf_autotune.cc",
    "rewrites/untrack_inner.cc",
]
KERNEL_HEADERS = [
    "intune_tf/cc/kernels/bounded_buffers.h",
    "intune_tf/cc/kernels/cache_store.h",
    "intune_tf/cc/kernels/budget_guard.h",
    "intune_tf/cc/kernels/node_access.h",
    "intune_tf/cc/kernels/pass_through.h",
    "intune_tf/cc/kernels/row_store.h",
    "intune_tf/cc/kernels/session_registry.h",
    "intune_tf/cc/kernels/settings.h",
    "intune_tf/cc/kernels/stage_names.h",
    "intune_tf/cc/kernels/tf_compat.h",
    "intune_tf/cc/kernels/tuning_session.h",
    "intune_tf/cc/cache_decision.h",
    "intune_tf/cc/graph_walk.h",
    "intune_tf/cc/layout.h",
    "intune_tf/cc/op_names.h",
    "intune_tf/cc/settings_fields.h",
    "intune_tf/cc/tf_cc_symbols.h",
    "rewrites/graph_utils.h",
    "rewrites/optimizer.h",
    "rewrites/passes.h",
    "rewrites/rewrite.h",
    "rewrites/row_wise.h",
]
LIBRARY = "_intune_ops.so"
STAMP = "_intune_ops.tfversion"
TF_FRAMEWORK = "libtensorflow_framework.so.2"
# Functions of libtensorflow_cc.so.2 that the kernels look up at run time
# (tf_cc_symbols.cc): data::<name> -> the macro giving its mangled name.
TF_CC_FUNCTIONS = {"RewriteDataset": "INTUNE_REWRITE_DATASET_SYMBOL",
                   "CreateRewriterConfig":
                       "INTUNE_CREATE_REWRITER_CONFIG_SYMBOL"}
# The file given those macros.
_TF_CC_SOURCE = "intune_tf/cc/tf_cc_symbols.cc"
# The probe's references to those functions give their mangled names.
_PROBE = ('#include "tensorflow/core/data/rewrite_utils.h"\n' + "".join(
    f"void* IntuneProbe{name}() {{ return reinterpret_cast<void*>("
    f"&tensorflow::data::{name}); }}\n" for name in TF_CC_FUNCTIONS))
_EXTRA_COMPILE_FLAGS = ["-O2", "-fPIC", "-Wno-sign-compare",
                        "-Wno-deprecated-declarations", "-g0"]
_TF_INFO = ("import json, tensorflow as tf; print(json.dumps({"
            "'version': tf.__version__, "
            "'compile_flags': tf.sysconfig.get_compile_flags(), "
            "'link_flags': tf.sysconfig.get_link_flags(), "
            "'lib': tf.sysconfig.get_lib()}))")


class BuildError(RuntimeError):
  """The kernel library could not be built."""


@dataclasses.dataclass(frozen=True)
class TfInfo:
  """What the build needs to know about one TensorFlow installation."""
  version: str
  compile_flags: list[str]
  link_flags: list[str]
  lib: str

  @property
  def major_minor(self) -> tuple[int, int]:
    major, minor = (int(part) for part in self.version.split(".")[:2])
    return major, minor


def tf_info_here() -> TfInfo:
  """The TensorFlow importable by this interpreter."""
  # Deferred: setup.py imports this module before it knows TF is there.
  import tensorflow as tf  # noqa: PLC0415

  return TfInfo(tf.__version__, list(tf.sysconfig.get_compile_flags()),
                list(tf.sysconfig.get_link_flags()), tf.sysconfig.get_lib())


def tf_info_of(python: str) -> TfInfo:
  """The TensorFlow importable by the interpreter `python`."""
  result = subprocess.run([python, "-c", _TF_INFO], capture_output=True,
                          text=True, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  if result.returncode != 0:
    raise BuildError(f"{python} cannot import tensorflow:\n"
                     f"{result.stderr[-2000:]}")
  return TfInfo(**json.loads(result.stdout.strip().splitlines()[-1]))


def link_flags(tf: TfInfo) -> list[str]:
  """TF's link flags: the framework library only, no run path."""
  flags = [f for f in tf.link_flags if not f.startswith("-Wl,-rpath")]
  if not any(TF_FRAMEWORK in f or f == "-ltensorflow_framework"
             for f in flags):
    raise BuildError(f"TensorFlow {tf.version}'s link flags {flags} do not "
                     f"name {TF_FRAMEWORK}")
  return flags


def _run(command: list[str]) -> None:
  result = subprocess.run(command, capture_output=True, text=True,
                          check=False)
  if result.returncode != 0:
    raise BuildError(f"{shlex.join(command)}\nfailed:\n{result.stderr}")


def _cxx() -> list[str]:
  return shlex.split(os.environ.get("CXX") or "g++")


def tf_cc_symbols(tf: TfInfo, objdir: str) -> dict[str, str]:
  """The mangled names of TF_CC_FUNCTIONS in TensorFlow `tf`'s ABI."""
  os.makedirs(objdir, exist_ok=True)
  source = os.path.join(objdir, "probe.cc")
  with open(source, "w") as f:
    f.write(_PROBE)
  obj = source[:-3] + ".o"
  _run(_cxx() + tf.compile_flags + _EXTRA_COMPILE_FLAGS +
       ["-c", source, "-o", obj])
  symbols = subprocess.run(["nm", "--undefined-only", "--format=just-symbols",
                            obj], capture_output=True, text=True,
                           check=True).stdout.split()
  found = {}
  for name in TF_CC_FUNCTIONS:
    named = [s for s in symbols if f"4data{len(name)}{name}E" in s]
    if len(named) != 1:
      raise BuildError(f"expected one data::{name} symbol in {obj}, found "
                       f"{named}")
    found[name] = named[0]
  return found


def _up_to_date(obj: str) -> bool:
  """Whether `obj` is newer than every file its depfile (g++ -MMD) lists."""
  try:
    built = os.path.getmtime(obj)
    with open(obj[:-2] + ".d") as f:
      deps = f.read().replace("\\\n", " ").split(":", 1)[1].split()
    return all(os.path.getmtime(dep) < built for dep in deps)
  except (OSError, IndexError):
    return False


def _leaks_names(source: str) -> bool:
  """Whether `source` has a namespace-scope using-declaration (`using
  model::Node;`), which would change what names mean in the files after it
  in a unity unit."""
  with open(os.path.join(ROOT, source)) as f:
    return re.search(r"^using [\w:]+::\w+;", f.read(), re.M) is not None


def unity_chunks(sources: list[str], count: int) -> list[list[str]]:
  """`sources` in `count` chunks of about equal size (largest first into the
  smallest chunk), each in the list's order; a file whose using-declarations
  would leak into the others gets a unit of its own."""
  alone = [[s] for s in sources if _leaks_names(s)]
  rest = [s for s in sources if not _leaks_names(s)]
  sizes = {s: os.path.getsize(os.path.join(ROOT, s)) for s in rest}
  chunks: list[list[str]] = [[] for _ in range(min(count, len(rest)))]
  for source in sorted(rest, key=lambda s: -sizes[s]):
    min(chunks, key=lambda c: sum(sizes[s] for s in c)).append(source)
  return [sorted(c, key=sources.index) for c in chunks] + alone


def compile_flags(tf: TfInfo) -> list[str]:
  """Compile flags for the sources, for TensorFlow `tf`."""
  major, minor = tf.major_minor
  # TF 2.21's headers no longer define TF_MINOR_VERSION (its build does).
  return (tf.compile_flags + _EXTRA_COMPILE_FLAGS +
          [f"-I{ROOT}", f'-DINTUNE_TF_BUILT_FOR="{tf.version}"',
           f"-DINTUNE_TF_MAJOR={major}", f"-DINTUNE_TF_MINOR={minor}"])


def build(tf: TfInfo, out_dir: str, objdir: str, jobs: int = 2) -> str:
  """Compiles and links the library into `out_dir`, with its stamp.

  Args:
    tf: the TensorFlow to build against.
    out_dir: where `_intune_ops.so` and `_intune_ops.tfversion` go.
    objdir: where object files go (reused when newer than every source and
      header and built with the same flags).
    jobs: unity translation units, compiled at once (default 2).

  Returns:
    The library's path.

  Raises:
    BuildError: a compile or link failed (with the compiler's output).
  """
  symbols = tf_cc_symbols(tf, objdir)
  flags = compile_flags(tf)
  # Only the chunk holding tf_cc_symbols.cc sees the names.
  tf_cc_flags = [f'-D{TF_CC_FUNCTIONS[name]}="{mangled}"'
                 for name, mangled in symbols.items()]

  def write_if_changed(path: str, text: str) -> bool:
    old = None
    if os.path.exists(path):
      with open(path) as f:
        old = f.read()
    if old != text:
      with open(path, "w") as f:
        f.write(text)
    return old != text

  def compile_one(chunk: list[str]) -> str:
    name = f"unity_{chunks.index(chunk)}"
    source = os.path.join(objdir, name + ".cc")
    write_if_changed(source, "".join(f'#include "{s}"\n' for s in chunk))
    obj = source[:-3] + ".o"
    command = flags + (tf_cc_flags if _TF_CC_SOURCE in chunk else [])
    # The flags it was compiled with, written only after a success.
    flags_file = source[:-3] + ".flags"
    same_flags = (os.path.exists(flags_file) and
                  open(flags_file).read() == shlex.join(command))
    if not (same_flags and _up_to_date(obj)):
      _run(_cxx() + command + ["-MMD", "-MF", obj[:-2] + ".d", "-c", source,
                               "-o", obj])
      write_if_changed(flags_file, shlex.join(command))
    return obj

  # Unity builds: TF's headers, most of the compile time, are parsed once per
  # chunk instead of once per source file; `jobs` chunks compile at once.
  chunks = unity_chunks(KERNEL_SOURCES, max(1, jobs))
  with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
    futures = [pool.submit(compile_one, c) for c in chunks]
  failures = [str(f.exception()) for f in futures if f.exception()]
  if failures:
    raise BuildError("\n\n".join(failures))
  objects = [f.result() for f in futures]
  os.makedirs(out_dir, exist_ok=True)
  library = os.path.join(out_dir, LIBRARY)
  with tempfile.NamedTemporaryFile(dir=out_dir, suffix=".so",
                                   delete=False) as tmp:
    pass
  try:
    _run(_cxx() + ["-shared", "-o", tmp.name] + objects + link_flags(tf))
    os.replace(tmp.name, library)
  finally:
    if os.path.exists(tmp.name):
      os.unlink(tmp.name)
  with open(os.path.join(out_dir, STAMP), "w") as f:
    f.write(tf.version + "\n")
  return library


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--python", default=sys.executable,
                      help="interpreter whose TensorFlow to build against "
                      "(default: this one)")
  parser.add_argument("--out", required=True,
                      help="folder for _intune_ops.so and its stamp")
  parser.add_argument("--objdir", default=None,
                      help="folder for object files (default: "
                      "build/kernels/tf<major>_<minor>)")
  parser.add_argument("--jobs", type=int, default=2,
                      help="unity translation units, compiled at once "
                      "(default 2)")
  args = parser.parse_args(argv)
  tf = tf_info_of(args.python)
  major, minor = tf.major_minor
  objdir = args.objdir or os.path.join(ROOT, "build", "kernels",
                                       f"tf{major}_{minor}")
  start = time.monotonic()
  try:
    library = build(tf, args.out, objdir, args.jobs)
  except BuildError as e:
    print(e, file=sys.stderr)
    return 1
  print(f"built {library} for TensorFlow {tf.version} in "
        f"{time.monotonic() - start:.0f} s with {args.jobs} jobs")
  return 0


if __name__ == "__main__":
  sys.exit(main())
