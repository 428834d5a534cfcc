"""`TunedInputConfig`: the artifact `IntuneTuner` writes.

Layout of the artifact's uri directory:

* `config.json`: the tuned knob configuration, exactly as
  `intune_tf.TuningSession.config()` returns it (`{"format":
  "intune_tf.config/1", "knobs": {knob name: value}}`), so
  `TuningSession.apply_config` and
  `IntuneOptions(policy="fixed", config=...)` take it as it is.
* `benchmark.json`: the figures of the tuning run (rows/s under the tuned
  configuration and under plain AUTOTUNE, per interleaved repeat and their
  medians, the speedup, and the settings of the run).
* `agent/` (when `intune_tf.agent.warmstart` saved a state for the pipeline,
  see `executor.export_agent`): `<key>.json` (the warm-start configuration)
  and `<key>.npz` (the fine-tuned agent's weights, when the agent learned):
  copy them into `$INTUNE_WARMSTART_DIR` to warm-start the same pipeline on
  the same kind of machine.
"""

from __future__ import annotations

from tfx.types import artifact
from tfx.types import artifact_property

CONFIG_FILE = "config.json"
BENCHMARK_FILE = "benchmark.json"
AGENT_DIR = "agent"
BENCHMARK_FORMAT = "intune_tf.tfx.benchmark/1"

_FLOAT = artifact_property.Property(type=artifact_property.PropertyType.FLOAT)
_INT = artifact_property.Property(type=artifact_property.PropertyType.INT)
_STRING = artifact_property.Property(
    type=artifact_property.PropertyType.STRING)


class TunedInputConfig(artifact.Artifact):
  """The tuned input-pipeline configuration of an `IntuneTuner` run.

  Properties (stored in ML Metadata with the artifact):
    rows_per_s: median rows/s of the pipeline under the tuned configuration.
    autotune_rows_per_s: median rows/s of the same pipeline under AUTOTUNE,
      measured interleaved with the tuned runs.
    speedup: rows_per_s / autotune_rows_per_s.
    num_knobs: knobs in the tuned configuration.
    policy: the InTune policy that tuned it.
    split: the Examples split it was tuned on.
  """
  TYPE_NAME = "TunedInputConfig"
  PROPERTIES = {
      "rows_per_s": _FLOAT,
      "autotune_rows_per_s": _FLOAT,
      "speedup": _FLOAT,
      "num_knobs": _INT,
      "policy": _STRING,
      "split": _STRING,
  }
