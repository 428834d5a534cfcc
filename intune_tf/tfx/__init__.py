"""InTune in TFX pipelines (compat stack: tfx 1.16, TensorFlow 2.16).

    from intune_tf import tfx as intune_tfx
    tuner = intune_tfx.IntuneTuner(examples=example_gen.outputs["examples"],
                                   module_file=MODULE, tune_seconds=60)
    trainer = intune_tfx.Trainer(
        examples=example_gen.outputs["examples"],
        tuned_input_config=tuner.outputs["tuned_input_config"],
        module_file=MODULE, train_args=..., eval_args=...)

    # in the module file's run_fn:
    ds = intune_tfx.apply_tuned_config(
        input_fn(intune_tfx.read_records(fn_args.train_files, repeat=True),
                 batch_size), fn_args)

See docs/tfx.md. `import intune_tf` never imports this package (nor tfx).
"""

try:
  import tfx as _tfx  # noqa: F401
except ImportError as e:
  raise ImportError(
      "intune_tf.tfx needs the tfx package (tfx 1.16 with TensorFlow 2.16 on "
      "Python 3.10: the project's compat stack, .venv-compat). "
      f"It does not import here: {e}") from e

from intune_tf.tfx.artifacts import TunedInputConfig
from intune_tf.tfx.component import IntuneTuner
from intune_tf.tfx.component import Trainer
from intune_tf.tfx.tuned_config import TUNED_INPUT_CONFIG_KEY
from intune_tf.tfx.tuned_config import apply_tuned_config
from intune_tf.tfx.tuned_config import load_tuned_config
from intune_tf.tfx.tuned_config import map_config
from intune_tf.tfx.tuned_config import read_records

__all__ = [
    "IntuneTuner",
    "TUNED_INPUT_CONFIG_KEY",
    "Trainer",
    "TunedInputConfig",
    "apply_tuned_config",
    "load_tuned_config",
    "map_config",
    "read_records",
]
