"""Shared test fixtures, and the split of the suite between the stacks."""

import gc
import importlib.abc
import importlib.machinery
import importlib.util
import os
import pathlib
import re
import sys
import tempfile

import pytest

# Each test process shares the host only with the processes it starts: the
# suites that other checkouts or the other stack run at the same time, and
# the other pytest-xdist workers of its own suite (which inherit the
# controller's environment), keep their own leases (`intune_tf.arbiter`).
# Nor do they share warm-start state or status files, with each other or with
# the user's own jobs (~/.cache/intune_tf).
for _variable, _prefix in (("INTUNE_HOST_DIR", "intune-host-test-"),
                           ("INTUNE_WARMSTART_DIR", "intune-warmstart-test-"),
                           ("INTUNE_STATUS_DIR", "intune-status-test-")):
  if "PYTEST_XDIST_WORKER" in os.environ or _variable not in os.environ:
    os.environ[_variable] = tempfile.mkdtemp(prefix=_prefix)

# The real Criteo sample lives beside the repository, never inside it.
CRITEO_REAL_DIR = (pathlib.Path(__file__).resolve().parents[1].parent
                   / "shared" / "data" / "criteo")


@pytest.fixture
def criteo_real_dir() -> pathlib.Path:
  """../shared/data/criteo, or skip when this checkout has no shared data."""
  if not (CRITEO_REAL_DIR / "criteo_sample_10k.tsv").is_file():
    pytest.skip(f"real Criteo sample not found at {CRITEO_REAL_DIR} (it sits "
                "beside the repository, in ../shared/data/criteo)")
  return CRITEO_REAL_DIR


@pytest.fixture(scope="module", autouse=True)
def _frozen_heap():
  """Moves the objects alive when a module starts (TensorFlow's and Keras's
  modules, about 300,000) out of the cyclic garbage collector's sight: each
  full collection otherwise rescans them (0.3 s of CPU each, on this
  machine), and the hundreds of datasets, traces and sessions a module makes
  trigger many, besides the tests' own `gc.collect()`. Reference counting
  still frees them; garbage cycles made before a module starts are collected
  first."""
  gc.collect()
  gc.freeze()


# Test modules whose code under test never imports TensorFlow or Keras: their
# behaviour cannot depend on the TensorFlow version, so `make test` runs them
# once, on the main stack, with `--tf-free` (which refuses any import of
# TensorFlow or Keras, so a module listed here that starts to need them fails
# loudly instead of quietly losing the compat stack). Every other module runs
# on both stacks (`--needs-tf`).
TF_FREE_MODULES = frozenset({
    "test_build_files.py",
    "test_calibration.py",
    "test_cc_units.py",
    "test_change.py",
    "test_docs.py",
    "test_files.py",
    "test_host.py",
    "test_mdp.py",
    "test_meter.py",
    "test_pool.py",
    "test_ranked.py",
    "test_records.py",
    "test_registry.py",
    "test_resize.py",
    "test_scalers.py",
    "test_search.py",
    "test_simulator.py",
    "test_tf_versions.py",
})
# Test modules that need TensorFlow to run, but check our own logic, whose
# behaviour does not change with the TensorFlow or Keras version: `make test`
# runs them on the main stack only. Each names the modules that run its
# TensorFlow-facing part on both stacks (`--version-dependent`, checked at
# start-up). Every module in neither list runs on both stacks.
MAIN_STACK_ONLY = {
    # The agent's policy maths and its runs in the simulator; its networks.
    "test_agent.py": ("test_dqn.py", "test_allocator.py"),
    # The lease protocol and the CPU placement (Python over files and
    # sched_setaffinity); the budgets it gives reach a pipeline through the
    # session, as the tuner gives them.
    "test_arbiter.py": ("test_session.py", "test_tuner.py"),
    # The flag types of the command line; what the commands run.
    "test_arguments.py": ("test_criteo_pipelines.py", "test_service.py"),
    "test_cli.py": ("test_criteo_pipelines.py", "test_service.py"),
    "test_criteo_cli.py": ("test_criteo_reader.py", "test_criteo_pipelines.py",
                           "test_criteo_convert.py"),
    # The worker-pool simulation (TensorFlow only through `cli`); the pool
    # of real tf.data service workers.
    "test_cluster.py": ("test_service.py",),
    # The models' quality on the real rows; the same DLRM trains under the
    # callback on both stacks.
    "test_criteo_models.py": ("test_keras.py",),
    # The demo command: model.fit under the callback.
    "test_demo.py": ("test_keras.py",),
    # The harness's measurements and reports; the workloads it runs.
    "test_harness.py": ("test_workloads.py",),
    # The import graph and layers of the package; the installed package.
    "test_package.py": ("test_install.py",),
    # `intune try`'s runs and report; the cache and the option it measures.
    "test_trial.py": ("test_cache.py",),
    # Pretraining in the simulator; the networks it trains.
    "test_pretrain.py": ("test_dqn.py",),
}
# A single test of a module that runs on both stacks can be marked
# `main_stack_only(covered_by=("test_x.py::test_y", ...))` when it checks our
# own logic at a cost (a real training run, a subprocess that loads
# TensorFlow) and the named tests, which run on both stacks, check its
# TensorFlow-facing part: `--version-dependent` deselects it.
_TF_PACKAGES = frozenset({"tensorflow", "keras", "tf_keras"})


class _RefuseTensorFlow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """An import hook under which importing TensorFlow or Keras fails.

  It only fails the import itself: `importlib.util.find_spec` (which
  `intune_tf` uses to say whether TensorFlow is installed) still finds them.
  """

  def find_spec(self, name, path=None, target=None):
    del path, target  # unused
    if name.partition(".")[0] in _TF_PACKAGES:
      return importlib.machinery.ModuleSpec(name, self)
    return None

  def create_module(self, spec):
    del spec  # unused
    return None

  def exec_module(self, module):
    raise ImportError(
        f"{module.__name__} imported under --tf-free: a module in conftest's "
        "TF_FREE_MODULES now needs TensorFlow or Keras; remove it from that "
        "list so that it runs on both stacks")


def pytest_addoption(parser: pytest.Parser) -> None:
  group = parser.getgroup("intune_tf")
  group.addoption("--tf-free", action="store_true",
                  help="run only the modules in conftest's TF_FREE_MODULES, "
                  "refusing every import of TensorFlow or Keras")
  group.addoption("--needs-tf", action="store_true",
                  help="run only the modules not in TF_FREE_MODULES")
  group.addoption("--version-dependent", action="store_true",
                  help="run only the modules in neither TF_FREE_MODULES nor "
                  "MAIN_STACK_ONLY, less the tests marked main_stack_only "
                  "(the compat stack's part)")
  group.addoption("--modules-loaded", metavar="FOLDER", default=None,
                  help="fail unless the tests, in all their processes, "
                  "loaded every module of intune_tf (each process writes "
                  "its list into FOLDER)")


def _check_split() -> None:
  """Raises pytest.UsageError unless every module MAIN_STACK_ONLY names
  exists and runs on both stacks."""
  tests = pathlib.Path(__file__).resolve().parent
  for module, covered_by in MAIN_STACK_ONLY.items():
    for name in (module, *covered_by):
      if not (tests / name).is_file():
        raise pytest.UsageError(f"conftest's MAIN_STACK_ONLY names {name}, "
                                "which is not a test module")
    wrong = [n for n in covered_by
             if n in MAIN_STACK_ONLY or n in TF_FREE_MODULES]
    if module in TF_FREE_MODULES or wrong:
      raise pytest.UsageError(
          f"conftest's MAIN_STACK_ONLY: {module} is covered on both stacks by "
          f"{', '.join(wrong) or module}, which does not run on both")


def _check_main_stack_only(item: pytest.Item) -> None:
  """Raises pytest.UsageError unless every test a `main_stack_only` mark
  names is a test function of a module that runs on both stacks."""
  tests = pathlib.Path(__file__).resolve().parent
  for mark in item.iter_markers("main_stack_only"):
    covered_by = mark.kwargs.get("covered_by", ())
    if mark.args or not covered_by or isinstance(covered_by, str):
      raise pytest.UsageError(
          f"{item.nodeid}: write main_stack_only(covered_by=(\"test_x.py::"
          "test_y\", ...)), naming the tests that run its TensorFlow-facing "
          "part on both stacks")
    for name in covered_by:
      module, _, function = name.partition("::")
      path = tests / module
      if (module in TF_FREE_MODULES or module in MAIN_STACK_ONLY
          or not path.is_file()
          or not re.search(rf"^def {re.escape(function)}\(", path.read_text(),
                           re.MULTILINE)):
        raise pytest.UsageError(
            f"{item.nodeid} is marked main_stack_only, covered by {name}: "
            "that is not a test function of a module that runs on both "
            "stacks")


def pytest_collection_modifyitems(config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
  main_only = []
  for item in items:
    if item.get_closest_marker("main_stack_only"):
      _check_main_stack_only(item)
      main_only.append(item)
  if config.getoption("--version-dependent") and main_only:
    config.hook.pytest_deselected(items=main_only)
    deselected = set(main_only)
    items[:] = [item for item in items if item not in deselected]


def pytest_configure(config: pytest.Config) -> None:
  chosen = [o for o in ("--tf-free", "--needs-tf", "--version-dependent")
            if config.getoption(o)]
  if len(chosen) > 1:
    raise pytest.UsageError(f"give one of {', '.join(chosen)}, not several")
  _check_split()
  if config.getoption("--tf-free"):
    already = _TF_PACKAGES.intersection(sys.modules)
    if already:
      raise pytest.UsageError(f"--tf-free: {sorted(already)} imported before "
                              "the tests started")
    sys.meta_path.insert(0, _RefuseTensorFlow())


def pytest_ignore_collect(collection_path: pathlib.Path,
                          config: pytest.Config) -> bool | None:
  if collection_path.suffix != ".py" or not collection_path.name.startswith(
      "test_"):
    return None
  listed = collection_path.name in TF_FREE_MODULES
  if config.getoption("--tf-free") and not listed:
    return True
  if config.getoption("--needs-tf") and listed:
    return True
  if config.getoption("--version-dependent") and (
      listed or collection_path.name in MAIN_STACK_ONLY):
    return True
  return None


# `make check`: the modules of the package that the selected tests loaded,
# per test process, and the session fails naming any module none loaded.
# Packages of intune_tf that need a distribution only the compat stack
# installs: on a stack without it no test can load them.
_NEEDS_DISTRIBUTION = {"intune_tf.tfx": "tfx"}


def _package_modules() -> set[str]:
  """Every module of intune_tf in the checkout, criteo/ and rewrites/ as
  setup.py installs them, except `__main__` and the packages whose
  distribution (`_NEEDS_DISTRIBUTION`) this stack does not install."""
  root = pathlib.Path(__file__).resolve().parents[1]
  names = set()
  for folder, package in (("intune_tf", "intune_tf"),
                          ("criteo", "intune_tf.criteo"),
                          ("rewrites", "intune_tf.rewrites")):
    for path in (root / folder).rglob("*.py"):
      parts = path.relative_to(root / folder).with_suffix("").parts
      if parts[-1] == "__init__":
        parts = parts[:-1]
      if parts[-1:] != ("__main__",):
        names.add(".".join((package, *parts)))
  absent = [prefix for prefix, distribution in _NEEDS_DISTRIBUTION.items()
            if importlib.util.find_spec(distribution) is None]
  return {n for n in names
          if not any(n == p or n.startswith(p + ".") for p in absent)}


def _loaded_file(config: pytest.Config, worker: str) -> pathlib.Path:
  return pathlib.Path(config.getoption("--modules-loaded")) / f"{worker}.txt"


def pytest_sessionfinish(session: pytest.Session) -> None:
  config = session.config
  if not config.getoption("--modules-loaded"):
    return
  worker = getattr(config, "workerinput", {}).get("workerid", "main")
  loaded = sorted(m for m in sys.modules if m.split(".")[0] == "intune_tf")
  _loaded_file(config, worker).write_text("\n".join(loaded))
  if worker != "main":
    return  # the controller reads every worker's list
  folder = pathlib.Path(config.getoption("--modules-loaded"))
  seen = {line for path in folder.glob("*.txt")
          for line in path.read_text().splitlines()}
  missing = sorted(_package_modules() - seen)
  if missing:
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
    print(f"\n--modules-loaded: no selected test loaded {', '.join(missing)}: "
          "select a test of each (Makefile's check)", file=sys.stderr)
