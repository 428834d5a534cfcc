"""The package's shape: its import graph has no cycle, the simulation part
imports no TensorFlow, and every deferred import says why.

The graph is read from the source (`ast`), not by importing: importing any
submodule runs `intune_tf/__init__.py`, which loads TensorFlow to add the
option, so only the modules' own imports can be checked.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re

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
