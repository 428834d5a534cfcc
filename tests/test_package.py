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
  targets = {i.target for i in graph["intune_tf.live.observation"]}
  assert {"intune_tf.ops.session", "intune_tf.records", "numpy"} <= targets


def test_no_import_cycle(graph):
  """Over every import, deferred ones included: a deferred import may only
  put off a heavy or optional dependency, never break a cycle."""
  edges = {m: {i.target for i in imports if i.target in graph and i.target != m}
           for m, imports in graph.items()}
  # `import intune_tf.x.y` also runs the packages above it; a module's own
  # package is running already (Python imports parents first).
  assert _cycle(edges) is None, " -> ".join(_cycle(edges))


# The subpackage graph: one node per subpackage of `intune_tf`, per top-level
# module, and per package installed beside it (`_PACKAGES`).
_PACKAGE = "intune_tf"

# The layers, bottom first. A node imports from its own layer or below,
# never from above (`test_layer_order_holds`); within a layer, no cycle
# (`test_no_subpackage_cycle`). The package itself (`intune_tf/__init__.py`)
# runs before any of its modules, so it sits at the bottom with what it
# imports eagerly; its public names (`_PUBLIC`) and the hooks' installation
# resolve on first use, from above, and are not edges (counted, they would
# make every module import the whole package).
_LAYERS = (
    # Leaves: values, file helpers, the TensorFlow version table, the host's
    # readings and its arbiter.
    ("intune_tf.tf_versions", "intune_tf._require_tf", _PACKAGE,
     "intune_tf.option_fields", "intune_tf.records", "intune_tf.files",
     "intune_tf.arguments", "intune_tf.host", "intune_tf.arbiter"),
    ("intune_tf.options",),
    # The kernel side: the loader and the tuning session; the rewrites.
    ("intune_tf.ops", "intune_tf.rewrites"),
    # Status files of the running jobs, and `intune inspect`.
    ("intune_tf.observe",),
    # The policy interface, the MDP and the searches (numpy only).
    ("intune_tf.tuning",),
    # The learned policies (built on the searches) and their warm starts.
    ("intune_tf.agent",),
    # The tuner of a live process: the registry, observations, the thread.
    ("intune_tf.live",),
    # The option in tf.data: the hooks and the root dataset.
    ("intune_tf.tfdata",),
    # tf.data service: its servers, the trainer's meter and the worker
    # pool's controllers (numpy only) and scalers; the simulator drives
    # the same controllers and standby rule.
    ("intune_tf.service",),
    ("intune_tf.sim",),
    # Users of the public API.
    ("intune_tf.keras", "intune_tf.bench", "intune_tf.criteo"),
    ("intune_tf.tfx",),
    ("intune_tf.cli", "intune_tf.__main__"),
)

# Imports that still go up a layer (and so close a cycle), as (module, module
# it imports) -> why they stay.
_ALLOWED: dict[tuple[str, str], str] = {}


def _node(module: str) -> str:
  """The subpackage-graph node of a module of the package."""
  for package in _PACKAGES:
    if package != _PACKAGE and (module == package or
                                module.startswith(package + ".")):
      return package
  return ".".join(module.split(".")[:2])


def _named_imports(path: pathlib.Path,
                   modules: dict[str, pathlib.Path]) -> set[str]:
  """The modules of the package a module names in strings and loads with
  `importlib.import_module` (lazy tables): deferred imports too."""
  source = path.read_text()
  if "import_module" not in source:
    return set()
  return {n.value for n in ast.walk(ast.parse(source))
          if isinstance(n, ast.Constant) and n.value in modules}


def _subpackage_edges(graph: dict[str, list[_Import]]
                      ) -> dict[str, dict[str, list[tuple[str, str, str]]]]:
  """Node -> node it imports -> the imports that make the edge, as (module,
  module imported, where). Every import counts, deferred and named ones
  included, except the package's own deferred and named ones (`_LAYERS`)."""
  modules = _modules()
  edges: dict[str, dict[str, list[tuple[str, str, str]]]] = {}
  for module, imports in graph.items():
    found = [(i.target, f"{module}:{i.line}") for i in imports
             if module != _PACKAGE or not i.deferred]
    if module != _PACKAGE:
      found += [(t, f"{module} (named)")
                for t in sorted(_named_imports(modules[module], modules))]
    for target, where in found:
      if target not in graph or _node(target) == _node(module):
        continue
      edges.setdefault(_node(module), {}).setdefault(
          _node(target), []).append((module, target, where))
  return edges


def _counted(subpackages: dict[str, dict[str, list[tuple[str, str, str]]]]
             ) -> dict[str, set[str]]:
  """The subpackage edges made by an import `_ALLOWED` does not list."""
  return {a: {b for b, imports in targets.items()
              if any((m, t) not in _ALLOWED for m, t, _ in imports)}
          for a, targets in subpackages.items()}


def _explain(subpackages, a: str, b: str) -> str:
  return f"{a} -> {b}: " + ", ".join(
      f"{where} -> {t}" for m, t, where in subpackages[a][b]
      if (m, t) not in _ALLOWED)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
  """Every cycle `_cycle` finds, one at a time: each found cycle's last
  edge is removed and the search run again."""
  edges = {a: set(b) for a, b in edges.items()}
  found = []
  while (cycle := _cycle(edges)) is not None:
    found.append(cycle)
    edges[cycle[-2]].discard(cycle[-1])
  return found


def _upward(edges: dict[str, set[str]],
            layers: tuple[tuple[str, ...], ...]) -> list[tuple[str, str]]:
  """The edges that go from a layer to a higher one (a node in no layer
  counts as above every layer)."""
  level = {node: i for i, layer in enumerate(layers) for node in layer}
  return sorted((a, b) for a, targets in edges.items() for b in targets
                if level.get(b, len(layers)) > level.get(a, len(layers)))


@pytest.mark.parametrize("edges,layers,expected", [
    # Down and sideways are fine: a -> b (0 -> 0), c -> a (1 -> 0).
    ({"a": {"b"}, "c": {"a"}}, (("a", "b"), ("c",)), []),
    # b (layer 0) imports c (layer 1): up.
    ({"b": {"c"}, "c": {"a"}}, (("a", "b"), ("c",)), [("b", "c")]),
    # d is in no layer: above every one.
    ({"a": {"d"}, "d": {"a"}}, (("a",),), [("a", "d")]),
])
def test_layer_checker(edges, layers, expected):
  assert _upward(edges, layers) == expected


def test_cycles_lists_each_cycle():
  # a <-> b and b -> c -> b: two cycles, each reported once.
  edges = {"a": {"b"}, "b": {"a", "c"}, "c": {"b"}}
  assert _cycles(edges) == [["a", "b", "a"], ["b", "c", "b"]]


@pytest.fixture(scope="module")
def subpackages(graph) -> dict[str, dict[str, list[str]]]:
  return _subpackage_edges(graph)


def test_the_subpackage_graph_sees_the_package(subpackages):
  nodes = set(subpackages) | {b for t in subpackages.values() for b in t}
  assert {"intune_tf.ops", "intune_tf.tuning", "intune_tf.agent",
          "intune_tf.cli", "intune_tf.sim"} <= nodes
  # A named import (the policies' lazy table) and a deferred one count.
  assert ("intune_tf.live.registry", "intune_tf.agent.ranked",
          "intune_tf.live.registry (named)") in (
              subpackages["intune_tf.live"]["intune_tf.agent"])
  assert any(w.startswith("intune_tf.observe.status:")
             for _, _, w in subpackages["intune_tf.observe"]["intune_tf.ops"])


def test_every_node_has_a_layer(subpackages):
  layered = [n for layer in _LAYERS for n in layer]
  assert len(layered) == len(set(layered))
  nodes = set(subpackages) | {b for t in subpackages.values() for b in t}
  assert nodes <= set(layered), sorted(nodes - set(layered))


def test_no_subpackage_cycle(subpackages):
  """Over every import, deferred and named ones included, but those
  `_ALLOWED` lists."""
  cycles = _cycles(_counted(subpackages))
  assert not cycles, "\n".join(
      [" -> ".join(c) for c in cycles] +
      [_explain(subpackages, c[i], c[i + 1])
       for c in cycles for i in range(len(c) - 1)])


@pytest.mark.parametrize("layer", range(len(_LAYERS)),
                         ids=[layer[0] for layer in _LAYERS])
def test_layer_order_holds(subpackages, layer):
  """No node of the layer imports from a layer above it."""
  counted = _counted(subpackages)
  up = _upward({a: counted.get(a, set()) for a in _LAYERS[layer]}, _LAYERS)
  assert not up, "\n".join(_explain(subpackages, a, b) for a, b in up)


def test_every_allowed_import_exists(subpackages):
  # An import removed from the code is removed from `_ALLOWED` too.
  made = {(m, t) for targets in subpackages.values()
          for imports in targets.values() for m, t, _ in imports}
  assert not set(_ALLOWED) - made, sorted(set(_ALLOWED) - made)


def test_each_allowed_import_closes_a_cycle(subpackages):
  """Without its allowed imports the graph has no cycle (the test above);
  with them, each closes one, so none is listed without need."""
  counted = _counted(subpackages)
  for module, target in _ALLOWED:
    a, b = _node(module), _node(target)
    edges = {n: set(t) for n, t in counted.items()}
    edges.setdefault(a, set()).add(b)
    assert _cycles(edges), f"{module} -> {target} closes no cycle"


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
               "intune_tf.agent.allocator",
               "intune_tf.tuning.policies", "intune_tf.tuning.search",
               "intune_tf.tuning.mdp", "intune_tf.tuning.env",
               "intune_tf.tuning.change", "intune_tf.observe.inspect",
               "intune_tf.live.registry", "intune_tf.host",
               "intune_tf.arbiter", "intune_tf.service",
               "intune_tf.service.controllers")


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
      "from intune_tf.live import registry; "
      "registry.check_name('climb'); "
      "print('intune_tf.tuning.search' in sys.modules); "
      "o = intune_tf.IntuneOptions(policy='climb'); "
      "print(type(registry.create(o)).__name__); "
      f"{_PRINT_HEAVY}"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines()[-3:] == ["False", "ClimbPolicy", "[]"]


@pytest.mark.slow
def test_every_built_in_policy_is_made_by_its_listed_class(tmp_path):
  result = _fresh(tmp_path, (
      "import json; from intune_tf.live import registry; "
      "from intune_tf.options import IntuneOptions; "
      "table = dict(registry._BUILT_IN); "
      "made = {n: [type(p).__module__, type(p).__name__] for n in table "
      "for p in [registry.create(IntuneOptions(policy=n, config={'a': 1}))]}; "
      "print(json.dumps([table, made]))"))
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
