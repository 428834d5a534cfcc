"""Warm start: tuned configurations persist across runs of the same job.

A saved state is keyed by a fingerprint of the pipeline graph (the op types
of the dataset graph and its functions, so renamed tensors and new file
paths of the same job match) and of the machine (CPU count and memory size):
the next run of the same job on the same kind of machine starts at its tuned
configuration, with the fine-tuned agent. Files live in
`$INTUNE_WARMSTART_DIR` (default `~/.cache/intune_tf/warmstart`):
`<key>.json` (configuration, throughput, machine) and `<key>.npz` (agent
weights, numpy arrays only). The folder is untrusted: a file that is not a
regular file of this user, too large, corrupt, foreign, or whose
configuration does not fit the pipeline's knob ranges (`fitting`) is
ignored with one warning naming it; nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import stat
import time
from typing import Mapping, Sequence

from absl import logging
import numpy as np

from intune_tf import files
from intune_tf import host
from intune_tf import records
from intune_tf.agent import dqn
from intune_tf.observe import status

FORMAT_VERSION = 1


def directory() -> str:
  return os.environ.get("INTUNE_WARMSTART_DIR") or os.path.join(
      os.path.expanduser("~"), ".cache", "intune_tf", "warmstart")


def graph_fingerprint(graph_def) -> str:
  """A hash of the multiset of op types in a dataset GraphDef and its
  function library (independent of node names, paths and constants).

  Computed by the kernel library (`GraphFingerprint` in
  `rewrites/passes.h`, the one definition), which the root also reports
  for the graph it rewrites.
  """
  # Deferred: the kernel library loads TensorFlow, which reading the folder
  # (`load`, `fitting`) does not need.
  from intune_tf import rewrites  # noqa: PLC0415
  return rewrites.fingerprint(graph_def)


def machine() -> dict:
  """The machine part of the key: CPU count and memory size (GiB)."""
  return {"cpus": os.cpu_count() or 0,
          "memory_gib": round(host.total_memory() / 2**30)}


def key(fingerprint: str, machine_info: Mapping | None = None) -> str:
  machine_info = machine() if machine_info is None else machine_info
  text = json.dumps({"graph": fingerprint, "machine": dict(machine_info)},
                    sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclasses.dataclass(frozen=True)
class State:
  """A saved warm-start state.

  Attributes:
    config: knob values, `{knob name: value}`.
    rows_per_s: output elements/s measured under `config` (0 if unknown).
    weights: the fine-tuned agent's weights, or None.
    path: the file it was read from. Default "" (not read from a file).
  """
  config: dict[str, float]
  rows_per_s: float
  weights: list[np.ndarray] | None
  path: str = ""


def _fingerprint_of(session) -> str | None:
  fp = getattr(session, "fingerprint", "")
  return fp or None


def fine_tuned_weights(policy) -> list[np.ndarray] | None:
  """The weights of `policy`'s agent if online fine-tuning changed them (at
  least one gradient step), else None: saving unchanged weights beside a
  configuration would hide the ones the agent saved itself."""
  agent = getattr(policy, "agent", None)
  if agent is None or not getattr(agent, "gradient_steps", 0):
    return None
  return agent.get_weights()


def save(session, config: Mapping[str, float] | None = None,
         rows_per_s: float = 0.0,
         weights: Sequence[np.ndarray] | None = None) -> str | None:
  """Saves a session's configuration (default: its knobs now) and, when
  given, agent weights (see `fine_tuned_weights`). The knobs whose stages
  do not run now (below a cache that serves the epoch) keep the value they
  last had in this session, else in the file saved before, unless `config`
  names them: the next run's first epoch, which runs them, starts there.
  Returns the JSON path, or None when the session has no graph fingerprint
  (a dataset built inside a tf.function) or options turn warm start off."""
  fp = _fingerprint_of(session)
  if fp is None or not getattr(session.options, "warm_start", True):
    return None
  if config is None:
    config = session.config()["knobs"]
  base = os.path.join(directory(), key(fp))
  # No op call: a `fit` saves once its iterators are gone.
  listed = session._listed_names()  # noqa: SLF001
  kept = {**_saved_config(fp, base + ".json"),
          **session._known_values()}  # noqa: SLF001
  config = {**{n: v for n, v in kept.items() if n not in listed}, **config}
  os.makedirs(directory(), exist_ok=True)
  if weights is not None:
    dqn.save_weights(base + ".npz", weights, {"fingerprint": fp})
  data = {"version": FORMAT_VERSION, "fingerprint": fp, "machine": machine(),
          "config": {k: float(v) for k, v in config.items()},
          "rows_per_s": float(rows_per_s), "saved": time.time(),
          "weights": weights is not None}
  files.write_json(base + ".json", data)
  return base + ".json"


def _check(data, fp: str, path: str) -> dict[str, float]:
  if not isinstance(data, dict):
    raise ValueError("not a JSON object")
  if data.get("version") != FORMAT_VERSION:
    raise ValueError(f"format version {data.get('version')!r}, expected "
                     f"{FORMAT_VERSION}")
  if data.get("fingerprint") != fp or data.get("machine") != machine():
    raise ValueError("saved for another pipeline or machine "
                     f"({data.get('fingerprint')!r}, {data.get('machine')!r})")
  config = data.get("config")
  if not isinstance(config, dict) or not all(
      isinstance(k, str) and isinstance(v, (int, float)) and
      not isinstance(v, bool) and math.isfinite(v) for k, v in config.items()):
    raise ValueError("`config` is not a mapping of knob names to finite "
                     "numbers")
  rate = data.get("rows_per_s", 0.0)
  if (isinstance(rate, bool) or not isinstance(rate, (int, float)) or
      not math.isfinite(rate) or rate < 0):
    raise ValueError(f"`rows_per_s` is {rate!r:.40}, not a finite number "
                     ">= 0")
  del path
  return {k: float(v) for k, v in config.items()}


def _saved_config(fp: str, path: str) -> dict[str, float]:
  """The configuration in the file at `path`; {} for none, or for a file
  that `load` would ignore (it warns about that file itself)."""
  if not os.path.lexists(path):
    return {}
  try:
    return _check(status.read_json_file(path, max_bytes=1 << 20), fp, path)
  except (OSError, ValueError, TypeError):
    return {}


def load(session) -> State | None:
  """The saved state of this session's pipeline on this machine, or None
  (nothing saved, warm start off, or a corrupt/foreign file: warned)."""
  fp = _fingerprint_of(session)
  if fp is None or not getattr(session.options, "warm_start", True):
    return None
  base = os.path.join(directory(), key(fp))
  path = base + ".json"
  if not os.path.lexists(path):
    return None
  try:
    data = status.read_json_file(path, max_bytes=1 << 20)
    config = _check(data, fp, path)
    rate = float(data.get("rows_per_s") or 0.0)
  except (OSError, ValueError, TypeError) as e:
    logging.warning("InTune: ignoring warm-start file %s: %s.", path, e)
    return None
  weights = None
  if data.get("weights") is True and os.path.lexists(base + ".npz"):
    try:
      info = os.stat(base + ".npz")
      if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        # Never opened: a FIFO would block the reader.
        raise ValueError("not a regular file of this user")
      weights, _ = dqn.load_weights(base + ".npz")
    except (OSError, ValueError) as e:
      logging.warning("InTune: ignoring warm-start weights %s: %s.",
                      base + ".npz", e)
  return State(config=config, rows_per_s=rate, weights=weights, path=path)


def fitting(state: State, knobs: Sequence[records.Knob]
            ) -> dict[str, float] | None:
  """The values of `state.config` for the knobs the pipeline has now, or
  None when one of them is outside its knob's [min, max]: the file does not
  fit this pipeline (edited, or saved by another version), so the whole
  configuration is dropped, with one warning naming the file. Knobs the
  file names but the pipeline lacks are left out.

  Example: config {"Prefetch/buffer_size": 4.0, "Gone/parallelism": 2.0}
  and a knob "Prefetch/buffer_size" of range [1, 64] -> {"Prefetch/
  buffer_size": 4.0}; a buffer size of -5 -> None.
  """
  ranges = {k.name: (k.min, k.max) for k in knobs}
  values = {n: v for n, v in state.config.items() if n in ranges}
  outside = [(n, v) for n, v in values.items()
             if not ranges[n][0] <= v <= ranges[n][1]]
  if not outside:
    return values
  logging.warning(
      "InTune: ignoring warm-start file %s: it does not fit this pipeline's "
      "knobs (%s); tuning starts without it.",
      state.path or "(no file)", ", ".join(
          f"{n} = {v:g} is outside [{ranges[n][0]:g}, {ranges[n][1]:g}]"
          for n, v in outside))
  return None
