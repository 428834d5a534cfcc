"""The field table of `IntuneOptions`: one declaration per option.

Each option's type, range, default, graph attribute and one doc line live
here and nowhere else in Python: `IntuneOptions` takes its defaults and its
type checks from `FIELDS`, and `intune_tf.tfdata.dataset` builds the attributes
of the `IntuneOptionsDataset` op with `graph_attrs`. The C++ side declares
the same attributes once, in `intune_tf/cc/settings_fields.h`;
tests/test_option_fields.py checks that this table, that list, the op
registry, the rewrite layer's defaults and the table of docs/options.md
agree.

A leaf module: it imports nothing of the package.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

# Default period of the background tuner, in seconds.
DEFAULT_PERIOD_S = 0.5
# Default results each input of a parallel interleave of records buffers.
DEFAULT_INTERLEAVE_BUFFER = 16
# Records per interleave input that `interleave_buffer` may ask for.
MAX_INTERLEAVE_BUFFER = 256
# The most CPUs `max_cpus` may name: the private runner pool starts one thread
# per CPU, and Linux supports at most 8192 CPUs (NR_CPUS with MAXSMP).
MAX_CPUS = 8192
# Shortest `period_s`: the tuner thread never waits less between steps
# (`live.tuner`), and a step's op calls take about as long.
MIN_PERIOD_S = 0.005
# The largest `host_weight` (`intune_tf.arbiter.MAX_WEIGHT`).
MAX_HOST_WEIGHT = 1e6
# The largest `cpu_budget` and `ram_budget`: they travel as int64.
INT64_MAX = 2**63 - 1


def _none_as_zero(value: int | None) -> int:
  """An optional count as the graph carries it: None is 0."""
  return 0 if value is None else int(value)


@dataclasses.dataclass(frozen=True)
class Field:
  """One option of `IntuneOptions`.

  Attributes:
    name: the option's name (the `IntuneOptions` attribute).
    kind: its Python type: bool, int, float, str, or dict (a mapping).
    optional: whether None is a valid value.
    default: its default.
    low: the smallest valid value of an int or float (excluded for a float
      of low 0: `host_weight` is in (0, 1e6]), or None for no bound.
    high: the largest valid value of an int or float, or None for none.
    type_doc: the type and range as docs/options.md's table shows them.
    doc: one line saying what it does.
    attr: the attribute of `IntuneOptionsDataset` that carries it in the
      graph, or None when it travels only in the `tag` (the options' JSON).
    to_attr: the attribute's value for a value of the option. Default
      `bool` for bool options, else the value unchanged.
    none_doc: what None stands for, for optional options ("TF's own
      runner"), as error messages say it. Default "".
  """
  name: str
  kind: type
  optional: bool
  default: Any
  low: float | None
  high: float | None
  type_doc: str
  doc: str
  attr: str | None = None
  to_attr: Callable[[Any], Any] | None = None
  none_doc: str = ""

  def attr_value(self, value: Any) -> Any:
    """The value of `attr` for the option's `value`."""
    if self.to_attr is not None:
      return self.to_attr(value)
    return bool(value) if self.kind is bool else value


FIELDS: tuple[Field, ...] = (
    Field("cpu_budget", int, True, None, 1, INT64_MAX,
          "positive int or `None`",
          "CPUs the pipeline may keep busy; None: the usable CPUs.",
          none_doc="the CPUs the process may use"),
    Field("ram_budget", int, True, None, 1, INT64_MAX,
          "positive int (bytes) or `None`",
          "Bytes the pipeline's buffers may hold; None: a share of RAM.",
          attr="ram_budget", to_attr=_none_as_zero,
          none_doc="half of the available memory"),
    Field("policy", str, False, "intune", None, None, "str",
          "Name of the tuning policy."),
    Field("config", dict, True, None, None, None,
          "mapping `{knob name: number}` or `None`",
          'Knob values for the "fixed" policy.'),
    Field("period_s", float, False, DEFAULT_PERIOD_S, MIN_PERIOD_S, None,
          "finite number >= 0.005",
          "Seconds between tuning steps of the background tuner."),
    Field("max_cpus", int, True, None, 1, MAX_CPUS, "positive int or `None`",
          "Size of a private runner pool; None: TF's runner.",
          attr="max_cpus", to_attr=_none_as_zero,
          none_doc="TF's own runner"),
    Field("include_fixed", bool, False, False, None, None, "bool",
          "Also tune stages with a fixed parallelism or buffer size.",
          attr="include_fixed"),
    Field("insert_prefetch", bool, False, False, None, None, "bool",
          "Add a prefetch after parallel stages that have none.",
          attr="insert_prefetch"),
    Field("inner_stats", bool, False, False, None, None, "bool",
          "Record statistics inside an interleave's per-input datasets.",
          attr="inner_stats"),
    Field("interleave_buffer", int, True, DEFAULT_INTERLEAVE_BUFFER, 1,
          MAX_INTERLEAVE_BUFFER, "positive int or `None`",
          "Records each input of a parallel interleave buffers ahead.",
          attr="interleave_buffer", to_attr=_none_as_zero,
          none_doc="TF's default"),
    Field("name", str, False, "", None, None, "str",
          "A label for the pipeline, shown in session listings."),
    Field("warm_start", bool, False, True, None, None, "bool",
          "Start from the configuration saved by earlier runs."),
    Field("host_share", bool, False, True, None, None, "bool",
          "Share one CPU and one RAM budget with this host's processes."),
    Field("host_weight", float, False, 1.0, 0.0, MAX_HOST_WEIGHT,
          "finite number in (0, 1e6]",
          "This pipeline's weight in the host's split."),
    Field("cache", bool, False, True, None, None, "bool",
          "Cache where the pipeline stops changing between epochs.",
          attr="cache"),
)
BY_NAME: Mapping[str, Field] = {field.name: field for field in FIELDS}

# The attributes of the settings that are not options: the options' JSON, the
# on/off switch, and the guard's period (fixed), with the values the graph
# carries for options that are on.
NON_OPTION_ATTRS = ("tag", "enabled", "guard_period_us")


def default(name: str) -> Any:
  """The default of the option `name` (a KeyError names an unknown one)."""
  return BY_NAME[name].default


def names(kind: type) -> tuple[str, ...]:
  """The options of Python type `kind`, in table order."""
  return tuple(field.name for field in FIELDS if field.kind is kind)


def graph_attrs(values: Mapping[str, Any]) -> dict[str, Any]:
  """The `IntuneOptionsDataset` attributes of option values.

  Args:
    values: the value of every option that has an `attr`, by option name.
      `ram_budget` None travels as 0: unset, resolved on the machine that
      makes the iterator (`ops.session.set_default_ram_budget`), never
      baked into the graph.

  Returns:
    {attribute name: value}, for the options that travel in the graph.
  """
  return {field.attr: field.attr_value(values[field.name])
          for field in FIELDS if field.attr is not None}
