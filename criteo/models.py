"""DLRM (Naumov et al., 2019) and a logistic-regression baseline in Keras.

    model = intune_tf.criteo.dlrm("tiny")          # compiled: BCE + AUC
    model.fit(intune_tf.criteo.read(files, batch_size=4096), epochs=1)

Inputs are the reader's features, `{"dense": float32 [B, 13], "sparse":
int64 [B, 26]}` (other keys are ignored). Categorical ids are hashed into
`num_buckets` rows of a per-feature embedding table (`id mod num_buckets`;
missing ids, -1, land in the last row); the dense features pass through the
signed log `sign(x) * log1p(|x|)` when `log_dense` (turn it off for the
already-transformed output of `pipeline(level >= 3)`) and a bottom MLP whose
last width is the embedding width; the pairwise dot products of the 27
vectors and the bottom output feed the top MLP and a sigmoid: the output is a
click probability of shape `[B]`.

Written against `tf.keras`, so it runs on whichever Keras that is: Keras 3
on the main stack (TF 2.21) and on the compat stack (TF 2.16 with Keras 3;
with TF_USE_LEGACY_KERAS=1, tf_keras 2.16).

`"tiny"` makes model time near zero so that the input pipeline is the
bottleneck; `"small"` is a more realistic, still CPU-friendly size.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from intune_tf.criteo import schema

keras = tf.keras


@dataclasses.dataclass(frozen=True)
class DLRMConfig:
  """DLRM sizes and training settings.

  Attributes:
    num_buckets: Rows of each categorical feature's embedding table (default
      10,000).
    embedding_dim: Embedding width, also the bottom MLP's last width (default
      8).
    bottom_mlp: Hidden widths of the bottom MLP before its last layer
      (default (32,)).
    top_mlp: Hidden widths of the top MLP (default (32,)).
    log_dense: Apply the signed log to the dense input (default True: raw
      reader values).
    l2: L2 penalty on the embeddings (default 1e-4).
    dropout: Dropout before the top MLP's output (default 0.0).
    learning_rate: Adam learning rate of `compile_model` (default 1e-3).
  """
  num_buckets: int = 10_000
  embedding_dim: int = 8
  bottom_mlp: tuple[int, ...] = (32,)
  top_mlp: tuple[int, ...] = (32,)
  log_dense: bool = True
  l2: float = 1e-4
  dropout: float = 0.0
  learning_rate: float = 1e-3


CONFIGS: dict[str, DLRMConfig] = {
    "tiny": DLRMConfig(num_buckets=1000, embedding_dim=4, bottom_mlp=(8,),
                       top_mlp=(8,)),
    "small": DLRMConfig(num_buckets=100_000, embedding_dim=16,
                        bottom_mlp=(64, 32), top_mlp=(64, 32)),
}


def _config(config: str | DLRMConfig) -> DLRMConfig:
  if isinstance(config, DLRMConfig):
    return config
  if config not in CONFIGS:
    raise ValueError(f"config must be one of {sorted(CONFIGS)} or a "
                     f"DLRMConfig, got {config!r}")
  return CONFIGS[config]


def signed_log(x: tf.Tensor) -> tf.Tensor:
  """`sign(x) * log1p(|x|)`."""
  return tf.sign(x) * tf.math.log1p(tf.abs(x))


class DLRM(keras.Model):
  """Bottom MLP, per-feature embeddings, dot interaction, top MLP.

  Args:
    config: The sizes (see `DLRMConfig`).
  """

  def __init__(self, config: DLRMConfig, **kwargs):
    super().__init__(**kwargs)
    self.config = config
    reg = keras.regularizers.l2(config.l2) if config.l2 else None
    self.embeddings = [
        keras.layers.Embedding(config.num_buckets, config.embedding_dim,
                               embeddings_regularizer=reg, name=f"emb_{name}")
        for name in schema.SPARSE_NAMES
    ]
    self.bottom = [keras.layers.Dense(w, activation="relu", name=f"bottom_{i}")
                   for i, w in enumerate(config.bottom_mlp)]
    self.bottom.append(keras.layers.Dense(config.embedding_dim,
                                          activation="relu",
                                          name="bottom_out"))
    self.top = [keras.layers.Dense(w, activation="relu", name=f"top_{i}")
                for i, w in enumerate(config.top_mlp)]
    self.drop = keras.layers.Dropout(config.dropout)
    self.out = keras.layers.Dense(1, activation="sigmoid", name="top_out")
    n = schema.NUM_SPARSE + 1
    rows, cols = np.triu_indices(n, k=1)
    self._pairs = tf.constant(rows * n + cols, tf.int32)

  def call(self, inputs, training=None):
    dense = tf.cast(inputs["dense"], tf.float32)
    if self.config.log_dense:
      dense = signed_log(dense)
    x = dense
    for layer in self.bottom:
      x = layer(x)
    ids = tf.math.floormod(tf.cast(inputs["sparse"], tf.int64),
                           self.config.num_buckets)
    vectors = [x] + [emb(ids[:, i]) for i, emb in enumerate(self.embeddings)]
    stacked = tf.stack(vectors, axis=1)  # [B, 27, d]
    dots = tf.matmul(stacked, stacked, transpose_b=True)  # [B, 27, 27]
    flat = tf.reshape(dots, [-1, (schema.NUM_SPARSE + 1) ** 2])
    h = tf.concat([x, tf.gather(flat, self._pairs, axis=1)], axis=1)
    for layer in self.top:
      h = layer(h)
    h = self.drop(h, training=training)
    return tf.squeeze(self.out(h), axis=-1)


class LogisticRegression(keras.Model):
  """Logistic regression on the DLRM's features (the baseline).

  Signed-log dense features with a weight each, plus one learned weight per
  hashed bucket of each categorical feature (a one-hot linear model), L2
  regularized.

  Args:
    num_buckets: Buckets per categorical feature (default 10,000).
    l2: L2 penalty on the categorical weights (default 1e-4).
    log_dense: As in `DLRMConfig` (default True).
  """

  def __init__(self, num_buckets: int = 10_000, l2: float = 1e-4,
               log_dense: bool = True, **kwargs):
    super().__init__(**kwargs)
    self.num_buckets = num_buckets
    self.log_dense = log_dense
    self.weights_sparse = keras.layers.Embedding(
        num_buckets * schema.NUM_SPARSE, 1,
        embeddings_initializer="zeros",
        embeddings_regularizer=keras.regularizers.l2(l2) if l2 else None,
        name="sparse_weights")
    self.linear = keras.layers.Dense(1, kernel_initializer="zeros",
                                     name="dense_weights")
    self._offsets = tf.range(schema.NUM_SPARSE, dtype=tf.int64) * num_buckets

  def call(self, inputs, training=None):
    dense = tf.cast(inputs["dense"], tf.float32)
    if self.log_dense:
      dense = signed_log(dense)
    ids = tf.math.floormod(tf.cast(inputs["sparse"], tf.int64),
                           self.num_buckets) + self._offsets
    logit = (tf.squeeze(self.linear(dense), -1)
             + tf.reduce_sum(tf.squeeze(self.weights_sparse(ids), -1), -1))
    return tf.sigmoid(logit)


def compile_model(model: keras.Model, learning_rate: float = 1e-3
                  ) -> keras.Model:
  """Compiles with Adam, binary cross-entropy and an `auc` metric.

  Args:
    model: A `DLRM` or `LogisticRegression`.
    learning_rate: Adam's (default 1e-3).

  Returns:
    The model.
  """
  model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                loss=keras.losses.BinaryCrossentropy(),
                metrics=[keras.metrics.AUC(name="auc", num_thresholds=1000)])
  return model


def dlrm(config: str | DLRMConfig = "tiny", compile: bool = True) -> DLRM:
  """Builds a DLRM.

  Args:
    config: "tiny" (default), "small", or a `DLRMConfig`.
    compile: Compile it with `compile_model` at the config's learning rate
      (default True).

  Returns:
    The model (built on first call).
  """
  cfg = _config(config)
  model = DLRM(cfg, name="dlrm")
  return compile_model(model, cfg.learning_rate) if compile else model


def logistic_regression(num_buckets: int = 10_000, l2: float = 1e-4,
                        learning_rate: float = 1e-2,
                        log_dense: bool = True) -> LogisticRegression:
  """A compiled `LogisticRegression` (Adam at `learning_rate`, default 1e-2)."""
  return compile_model(LogisticRegression(num_buckets, l2, log_dense),
                       learning_rate)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
  """The exact ROC AUC (Mann-Whitney U, ties counted half).

  Args:
    labels: 0/1 labels.
    scores: Scores, higher meaning positive.

  Returns:
    The probability that a random positive outscores a random negative.
  """
  labels = np.asarray(labels).astype(bool).ravel()
  scores = np.asarray(scores, np.float64).ravel()
  n_pos, n_neg = labels.sum(), (~labels).sum()
  if n_pos == 0 or n_neg == 0:
    raise ValueError("AUC needs both positive and negative labels")
  order = np.argsort(scores, kind="mergesort")
  ranks = np.empty(scores.size, np.float64)
  sorted_scores = scores[order]
  # Average ranks over ties (1-based).
  _, start, counts = np.unique(sorted_scores, return_index=True,
                               return_counts=True)
  avg = start + (counts + 1) / 2.0
  ranks[order] = np.repeat(avg, counts)
  u = ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0
  return float(u / (n_pos * n_neg))
