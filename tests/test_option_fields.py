"""The field table of the options (`intune_tf.option_fields`) against every
other place an option is declared: the C++ list of settings attributes
(read as text), the ops as TensorFlow registered them, `IntuneOptions`, the
rewrite layer's defaults, the attributes a pipeline's graph carries, and the
table of docs/options.md."""

import dataclasses
import inspect
import json
import os
import re

import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import op_def_registry

import intune_tf
from intune_tf import host
from intune_tf import option_fields
from intune_tf import rewrites
from intune_tf.ops import loader as _kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS_HEADER = os.path.join(ROOT, "intune_tf", "cc", "settings_fields.h")
OPTIONS_DOC = os.path.join(ROOT, "docs", "options.md")
# One row of INTUNE_SETTINGS_FIELDS: X(Constant, name, C++ type, attr type,
# default).
_ROW = re.compile(
    r"^\s*X\((\w+),\s*(\w+),\s*([\w:]+),\s*(\w+),\s*(.+?)\)\s*\\?$")
# The ops' own attributes, apart from the settings.
DATASET_ATTRS = {"output_types", "output_shapes", "metadata"}
OWN_ATTRS = {rewrites.OPTIONS_OP: DATASET_ATTRS,
             rewrites.ROOT_OP: DATASET_ATTRS | {"find_settings"},
             rewrites.LEGACY_ROOT_OP: DATASET_ATTRS | {"find_settings"}}
# The options that the rewrite layer takes, by its argument name.
REWRITE_ARGS = ("include_fixed", "insert_prefetch", "inner_stats",
                "interleave_buffer", "cache")


def _header_fields() -> dict[str, tuple[str, object]]:
  """{attribute: (TF attr type, default)} of settings_fields.h, in order."""
  with open(FIELDS_HEADER, encoding="utf-8") as f:
    rows = [_ROW.match(line) for line in f]
  fields = {}
  for row in filter(None, rows):
    constant, name, _, attr_type, text = row.groups()
    # The constant is the name in CamelCase (kInterleaveBuffer).
    assert constant == name.title().replace("_", ""), row.group(0)
    fields[name] = (attr_type, json.loads(text))
  return fields


def _attr_default(value: attr_value_pb2.AttrValue) -> object:
  kind = value.WhichOneof("value")
  return value.s.decode() if kind == "s" else getattr(value, kind)


def _registered(op: str) -> dict[str, tuple[str, object]]:
  """{attribute: (type, default)} of `op` as TF registered it."""
  _kernels.ops()
  op_def = op_def_registry.get(op)
  assert op_def is not None, f"{op} is not registered"
  return {a.name: (a.type, _attr_default(a.default_value))
          for a in op_def.attr if a.HasField("default_value")}


def _attr_defaults() -> dict[str, object]:
  """{attribute: value} that `IntuneOptions()` gives each option's
  attribute, by the field table."""
  return {f.attr: f.attr_value(f.default) for f in option_fields.FIELDS
          if f.attr is not None}


def _doc_rows() -> list[list[str]]:
  """The cells of the rows of the `IntuneOptions` table in options.md."""
  with open(OPTIONS_DOC, encoding="utf-8") as f:
    lines = f.read().split("## `IntuneOptions`", 1)[1].splitlines()
  start = lines.index("| field | type | default | meaning |")
  rows = []
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    rows.append([c.strip() for c in line.strip("|").split(" | ")])
  return rows


def _doc_default(value: object) -> str:
  return f"`{json.dumps(value)}`" if isinstance(value, str) else f"`{value!r}`"


def test_the_table_names_each_option_once():
  names = [f.name for f in option_fields.FIELDS]
  attrs = [f.attr for f in option_fields.FIELDS if f.attr is not None]
  assert len(set(names)) == len(names) and len(set(attrs)) == len(attrs)
  assert not set(attrs) & set(option_fields.NON_OPTION_ATTRS)
  # An attribute named after another option would read as that option.
  assert all(f.attr in (f.name, None) or f.attr not in names
             for f in option_fields.FIELDS)


def test_cc_list_carries_the_options_with_their_defaults():
  header = _header_fields()
  assert set(header) == set(_attr_defaults()) | set(
      option_fields.NON_OPTION_ATTRS)
  for attr, value in _attr_defaults().items():
    assert header[attr][1] == value, attr
    assert header[attr][0] == {bool: "bool", int: "int"}[type(value)], attr


@pytest.mark.parametrize("op", sorted(OWN_ATTRS))
def test_registered_ops_take_the_cc_list(op):
  registered = _registered(op)
  header = _header_fields()
  assert set(registered) - OWN_ATTRS[op] == set(header)
  assert {name: registered[name] for name in header} == header


def test_intune_options_fields_are_the_table():
  fields = dataclasses.fields(intune_tf.IntuneOptions)
  assert [f.name for f in fields] == [f.name for f in option_fields.FIELDS]
  for field in fields:
    assert field.default == option_fields.default(field.name), field.name
  # The docstring documents each, in the same order.
  documented = re.findall(r"^    (\w+): ", intune_tf.IntuneOptions.__doc__,
                          re.MULTILINE)
  assert documented == [f.name for f in option_fields.FIELDS]


def test_docs_table_lists_the_table():
  rows = _doc_rows()
  assert [r[0] for r in rows] == [
      f"`{f.name}`" for f in option_fields.FIELDS]
  for row, field in zip(rows, option_fields.FIELDS):
    assert row[1] == field.type_doc, field.name
    assert row[2] == _doc_default(field.default), field.name


@pytest.mark.parametrize("function", [rewrites.run_passes,
                                      rewrites.rewrite_graph,
                                      rewrites.rewriter_config])
def test_rewrite_layer_defaults_are_the_options(function):
  parameters = inspect.signature(function).parameters
  assert {name: parameters[name].default for name in REWRITE_ARGS} == {
      name: _attr_defaults()[name] for name in REWRITE_ARGS}


def test_rewrite_op_defaults_are_the_options():
  registered = _registered("IntuneRewriteGraph")
  assert {name: registered[name][1] for name in REWRITE_ARGS} == {
      name: _attr_defaults()[name] for name in REWRITE_ARGS}


@pytest.mark.parametrize("kwargs", [
    {},
    dict(max_cpus=2, include_fixed=True, insert_prefetch=True,
         inner_stats=True, interleave_buffer=None, ram_budget=2**20),
])
def test_the_graph_carries_each_option_in_its_attribute(kwargs):
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(**kwargs)
  ds = tf.data.Dataset.range(3).with_options(options)
  graph = tf.compat.v1.GraphDef.FromString(tf.raw_ops.DatasetToGraphV2(
      input_dataset=ds._variant_tensor,  # noqa: SLF001
      external_state_policy=1).numpy())
  (node,) = [n for n in graph.node if n.op == "IntuneOptionsDataset"]
  carried = {name: _attr_default(value) for name, value in node.attr.items()}
  opts = intune_tf.IntuneOptions(**kwargs)
  assert json.loads(carried["tag"]) == json.loads(opts.to_json())
  assert carried["enabled"] is True
  for field in option_fields.FIELDS:
    if field.attr is None:
      continue
    # ram_budget None travels as 0: nothing read from this machine.
    value = getattr(opts, field.name)
    assert carried[field.attr] == field.attr_value(value), field.name


def test_max_cpus_reaches_the_kernel_under_its_own_name():
  # One more than the machine's CPUs: not the size of TF's runner, and
  # within max_cpus' limit (4 x the machine's CPUs).
  cpus = host.machine_cpus() + 1
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      max_cpus=cpus, policy="manual", warm_start=False)
  ds = tf.data.Dataset.range(100).map(
      lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE).with_options(
          options)
  it = iter(ds)
  next(it)
  (knob,) = [k for k in intune_tf.session_of(it).knobs()
             if k.kind == "parallelism"]
  assert knob.max == cpus
  del it
