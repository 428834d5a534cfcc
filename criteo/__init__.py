"""The Criteo workload: reader, converters, generator, pipelines, DLRM.

    from intune_tf import criteo
    files = criteo.default_files()                # cached synthetic set
    ds = criteo.pipeline(4, files, batch_size=4096)
    model = criteo.dlrm("tiny")

Public surface:

* `read`, `CriteoFormatError`: Criteo text files in every layout seen in the
  wild -> `({"dense", "sparse"}, label)` batches (see `reader`).
* `convert_files`, `read_tfrecord`, `read_parquet`, `ParquetUnavailableError`:
  TFRecord and (compat stack only) Parquet copies (see `convert`).
* `generate`, `fit_stats`, `load_stats`, `compare`: the synthetic generator
  and its fidelity picture (see `synthetic`).
* `pipeline`, `STAGES`, `LEVELS`, `TUNABLE_STAGES`: the L1-L5 preprocessing
  pipelines (see `pipelines`).
* `default_files`, `real_sample_files`: data to run on.
* `dlrm`, `DLRMConfig`, `logistic_regression`, `compile_model`, `auc`.

Importing this package imports TensorFlow but never tensorflow_io (loaded
on first Parquet use); `plots` imports matplotlib only when drawing.
"""

from intune_tf.criteo.convert import ParquetUnavailableError
from intune_tf.criteo.convert import convert_files
from intune_tf.criteo.convert import read_parquet
from intune_tf.criteo.convert import read_tfrecord
from intune_tf.criteo.files import default_files
from intune_tf.criteo.files import real_sample_files
from intune_tf.criteo.models import DLRMConfig
from intune_tf.criteo.models import auc
from intune_tf.criteo.models import compile_model
from intune_tf.criteo.models import dlrm
from intune_tf.criteo.models import logistic_regression
from intune_tf.criteo.pipelines import LEVELS
from intune_tf.criteo.pipelines import STAGES
from intune_tf.criteo.pipelines import TUNABLE_STAGES
from intune_tf.criteo.pipelines import pipeline
from intune_tf.criteo.plots import compare
from intune_tf.criteo.reader import CriteoFormatError
from intune_tf.criteo.reader import read
from intune_tf.criteo.synthetic import fit_stats
from intune_tf.criteo.synthetic import generate
from intune_tf.criteo.synthetic import load_stats

__all__ = [
    "CriteoFormatError",
    "DLRMConfig",
    "LEVELS",
    "ParquetUnavailableError",
    "STAGES",
    "TUNABLE_STAGES",
    "auc",
    "compare",
    "compile_model",
    "convert_files",
    "default_files",
    "dlrm",
    "fit_stats",
    "generate",
    "load_stats",
    "logistic_regression",
    "pipeline",
    "read",
    "read_parquet",
    "read_tfrecord",
    "real_sample_files",
]
