"""The package's shape: its import graph has no cycle, the simulation part
imports no TensorFlow, and every deferred import says why; and, in fresh
processes, what importing the package and its numpy-only parts loads, and
that the option works whether TensorFlow is imported before or after it.

The graph is read from the source (`ast`): the test process has TensorFlow
loaded already, so what an import loads is checked in a fresh process.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import re
import subprocess
import sys

import pytest

_ROOT = pathlib.Path(__file__).resolve().parent.parent
# Installed package -> folder in the checkout (setup.py's package_dir).
_PACKAGES = {"intune_tf": "intune_tf", "intune_tf.rewrites": "rewrites",
             "intune_tf.criteo": "criteo"}
# The simulation part: numpy only when imported.
_SIMULATION = ("intune_tf.sim.simulator", "intune_tf.sim.pretrain",
               "intune_tf.sim.calibration")
_FORBIDDEN_IN_SIMULATION = ("tensorflow", "keras", "intune_tf.ops")


@dataclasses.dataclass(frozen=True)
class _Import:
  target: str  # a module of the package, or a top-level external module
  line: int
  deferred: bool  # inside a function body
  comment: str  # the comment on the import's line or the line above


def _modules() -> dict[str, pathlib.Path]:
  found = {}
  for package, folder in _PACKAGES.items():
    for path in sorted((_ROOT / folder).rglob("*.py")):
      parts = list(path.relative_to(_ROOT / folder).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      found[".".join([package] + parts)] = path
  return found


def _comment(lines: list[str], line: int) -> str:
  """The comment on an import's line, or above it or above the imports
  right before it (one comment gives a group of imports its reason)."""
  here = lines[line - 1]
  text = here.split("#", 1)[1] if "#" in here else ""
  above = line - 2
  while above >= 0 and re.match(r"\s*(import|from) ", lines[above]):
    above -= 1
  if above >= 0 and lines[above].strip().startswith("#"):
    text = lines[above].strip()[1:] + " " + text
  # A lint directive is not a reason.
  return re.sub(r"(pylint|noqa|type):\s*[\w=:,-]+", "", text).strip(" #")


def _is_type_checking(node: ast.AST) -> bool:
  return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(module: str, path: pathlib.Path,
             modules: dict[str, pathlib.Path]) -> list[_Import]:
  source = path.read_text()
  lines = source.splitlines()
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  found = []

  def resolve(name: str) -> str:
    if name in modules or not name.startswith("intune_tf"):
      return name if name in modules else name.split(".")[0]
    return resolve(name.rpartition(".")[0])

  def visit(node: ast.AST, deferred: bool) -> None:
    for child in ast.iter_child_nodes(node):
      if _is_type_checking(child):
        continue
      inner = deferred or isinstance(
          child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
      if isinstance(child, ast.Import):
        names = [a.name for a in child.names]
      elif isinstance(child, ast.ImportFrom):
        base = child.module or ""
        if child.level:
          base = ".".join(
              package.split(".")[:len(package.split(".")) - child.level + 1] +
              [base]).strip(".")
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in child.names]
      else:
        visit(child, inner)
        continue
      for name in names:
        if name == "__future__":
          continue
        found.append(_Import(resolve(name), child.lineno, deferred,
                             _comment(lines, child.lineno)))
  visit(ast.parse(source), False)
  return found


@pytest.fixture(scope="module")
def graph() -> dict[str, list[_Import]]:
  modules = _modules()
  return {m: _imports(m, p, modules) for m, p in modules.items()}


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
  """A cycle of `edges` as a path, or None."""
  state, stack = {}, []

  def visit(node):
    state[node] = "open"
    stack.append(node)
    for nxt in sorted(edges.get(node, ())):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    stack.pop()
    state[node] = "done"
    return None

  for node in sorted(edges):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


@pytest.mark.parametrize("edges,expected", [
    ({"a": {"b"}, "b": {"c"}}, None),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"a"}}, ["a", "a"]),
])
def test_cycle_finder(edges, expected):
  assert _cycle(edges) == expected


def test_the_graph_sees_the_package(graph):
  # A check over an empty or misread graph would pass anything.
  assert {"intune_tf", "intune_tf.ops.session", "intune_tf.sim.simulator",
          "intune_tf.rewrites", "intune_tf.criteo.pipelines"} <= set(graph)
  targets = {i.target for i in graph["intune_tf.tuning.observer"]}
  assert {"intune_tf.ops.session", "intune_tf.records", "numpy"} <= targets


def test_no_import_cycle(graph):
  """Over every import, deferred ones included: a deferred import may only
  put off a heavy or optional dependency, never break a cycle."""
  edges = {m: {i.target for i in imports if i.target in graph and i.target != m}
           for m, imports in graph.items()}
  # `import intune_tf.x.y` also runs the packages above it; a module's own
  # package is running already (Python imports parents first).
  assert _cycle(edges) is None, " -> ".join(_cycle(edges))


@pytest.mark.parametrize("module", _SIMULATION)
def test_simulation_imports_no_tensorflow(graph, module):
  """What importing the module loads (its module-level imports, followed
  through the package) holds no TensorFlow, Keras or kernel side."""
  seen, todo = set(), [module]
  while todo:
    current = todo.pop()
    for imp in graph.get(current, ()):
      if imp.deferred or imp.target in seen:
        continue
      seen.add(imp.target)
      todo.append(imp.target)
  bad = sorted(t for t in seen
               if any(t == f or t.startswith(f + ".")
                      for f in _FORBIDDEN_IN_SIMULATION))
  assert not bad, f"importing {module} loads {bad}"


def test_records_is_a_leaf(graph):
  targets = {i.target for i in graph["intune_tf.records"]}
  assert not {t for t in targets if t.startswith("intune_tf")}
  assert "tensorflow" not in targets


def test_every_deferred_import_says_why(graph):
  silent = [f"{m}:{i.line} ({i.target})" for m, imports in graph.items()
            for i in imports if i.deferred and not i.comment]
  assert not silent, "deferred imports without a reason: " + ", ".join(silent)


def _fresh(tmp_path, code: str) -> subprocess.CompletedProcess:
  # Outside the checkout (`-c` puts the working directory first on the
  # path): the installed package is the one imported.
  return subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=600, check=False, cwd=tmp_path)


# Prints, as JSON, the TensorFlow and Keras modules loaded.
_PRINT_HEAVY = ("import json, sys; print(json.dumps(sorted(m for m in "
                "sys.modules if m.split('.')[0] in ('tensorflow', 'keras'))))")

# Documented as numpy-only: importing them loads no TensorFlow.
_NUMPY_ONLY = ("intune_tf", "intune_tf.records", "intune_tf.options",
               "intune_tf.sim", "intune_tf.sim.simulator",
               "intune_tf.sim.calibration", "intune_tf.sim.pretrain",
               "intune_tf.agent.dqn", "intune_tf.agent.ranked",
               "intune_tf.tuning.policies", "intune_tf.tuning.search",
               "intune_tf.tuning.change", "intune_tf.observe.inspect")


@pytest.mark.parametrize("module", _NUMPY_ONLY)
def test_numpy_only_module_loads_no_tensorflow(tmp_path, module):
  result = _fresh(tmp_path, f"import {module}; {_PRINT_HEAVY}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.splitlines()[-1]) == []


def test_policy_names_check_without_loading_the_policies(tmp_path):
  """A built-in policy's name validates after `import intune_tf` alone,
  and its module is loaded only when such a policy is made."""
  result = _fresh(tmp_path, (
      "import sys, intune_tf; "
      "o = intune_tf.IntuneOptions(policy='climb'); "
      "print('intune_tf.tuning.search' in sys.modules); "
      "from intune_tf.tuning import policies; "
      "print(type(policies.create(o)).__name__); "
      f"{_PRINT_HEAVY}"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines()[-3:] == ["False", "ClimbPolicy", "[]"]


@pytest.mark.slow
def test_every_lazy_policy_is_registered_by_its_module(tmp_path):
  result = _fresh(tmp_path, (
      "import json; from intune_tf.tuning import policies; "
      "from intune_tf.options import IntuneOptions; "
      "table = dict(policies._LAZY); "
      "made = {n: type(policies.create(IntuneOptions(policy=n))).__module__ "
      "for n in table}; print(json.dumps([table, made]))"))
  assert result.returncode == 0, result.stderr[-3000:]
  table, made = json.loads(result.stdout.splitlines()[-1])
  assert {"intune", "intune-dqn", "climb", "plumber"} <= set(table)
  assert made == table


# The option on a dataset; prints whether its iterator got an InTune session.
_USE_OPTION = ("o = tf.data.Options(); o.experimental_intune = True; "
               "it = iter(tf.data.Dataset.range(3).with_options(o)); "
               "print([int(x) for x in it], "
               "intune_tf.session_of(it) is not None)")


@pytest.mark.slow
@pytest.mark.parametrize("imports", [
    "import intune_tf; import tensorflow as tf",
    "import tensorflow as tf; import intune_tf",
    # TensorFlow first loaded by one of the package's own modules.
    "import intune_tf; from intune_tf import session_of; "
    "import tensorflow as tf",
])
def test_the_option_works_in_any_import_order(tmp_path, imports):
  result = _fresh(tmp_path, f"{imports}; {_USE_OPTION}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines()[-1] == "[0, 1, 2] True"


def test_public_names_resolve_on_use():
  import intune_tf  # noqa: PLC0415  the package under test
  from intune_tf.ops import session  # noqa: PLC0415  the package under test
  assert set(intune_tf.__all__) <= set(dir(intune_tf))
  assert intune_tf.session_of is session.session_of
  with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
    intune_tf.no_such_name  # noqa: B018
