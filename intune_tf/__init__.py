"""InTune for TensorFlow: live tuning of tf.data input pipelines.

    import intune_tf
    options = tf.data.Options()
    options.experimental_intune = True   # or intune_tf.IntuneOptions(...)
    ds = ds.with_options(options)

Importing the package adds the option. The kernel library is loaded on first
use.
"""

# First: without TensorFlow, says what to install.
from intune_tf import _require_tf  # noqa: F401  the check itself
from intune_tf.agent import policy as _agent_policy  # noqa: F401  registers policy="intune-dqn"
from intune_tf.agent import ranked as _agent_ranked  # noqa: F401  registers policy="intune"
from intune_tf.ops import hooks as _tf_hooks
from intune_tf.ops.hooks import tune
from intune_tf.ops.loader import KernelLibraryError
from intune_tf.ops.session import Session
from intune_tf.ops.session import SessionGoneError
from intune_tf.ops.session import session_of
from intune_tf.ops.session import sessions
from intune_tf.options import IntuneOptions
from intune_tf.records import Knob
from intune_tf.records import Observation
from intune_tf.records import StageStats
from intune_tf.tuning import search as _search  # noqa: F401  registers "climb", "coordinate", "plumber"
from intune_tf.tuning.observer import report_step_time
from intune_tf.tuning.policies import Policy
from intune_tf.tuning.policies import register as register_policy
from intune_tf.tuning.tuner import global_tuner

__version__ = "0.1.0"

_tf_hooks.install()

__all__ = [
    "IntuneOptions",
    "Knob",
    "Observation",
    "KernelLibraryError",
    "Policy",
    "Session",
    "SessionGoneError",
    "StageStats",
    "global_tuner",
    "register_policy",
    "report_step_time",
    "session_of",
    "sessions",
    "tune",
]
