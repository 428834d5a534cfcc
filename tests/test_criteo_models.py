"""Tests of intune_tf.criteo.models: shapes, AUC, and real training."""

import numpy as np
import pytest
import tensorflow as tf

from intune_tf.criteo import models
from intune_tf.criteo import pipelines
from intune_tf.criteo import reader
from intune_tf.criteo import synthetic


def test_auc_hand_computed():
  # Positives 0.35, 0.8 against negatives 0.1, 0.4: 0.35 beats 0.1 only,
  # 0.8 beats both: 3 of 4 pairs.
  assert models.auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
  assert models.auc([0, 1], [0.5, 0.5]) == 0.5  # A tie counts half.
  assert models.auc([1, 0, 1], [3, 2, 1]) == 0.5  # 1 of 2 pairs.
  with pytest.raises(ValueError):
    models.auc([1, 1], [0.1, 0.2])


def _features(batch):
  rng = np.random.default_rng(0)
  return {"dense": tf.constant(rng.integers(-2, 1000, (batch, 13)),
                               tf.float32),
          "sparse": tf.constant(rng.integers(-1, 2**32, (batch, 26)),
                                tf.int64)}


@pytest.mark.slow
@pytest.mark.parametrize("config", ["tiny", "small",
                                    models.DLRMConfig(num_buckets=50,
                                                    embedding_dim=3,
                                                    bottom_mlp=(),
                                                    top_mlp=(4, 4))])
def test_output_is_a_probability_per_row(config):
  model = models.dlrm(config)
  out = model(_features(7)).numpy()
  assert out.shape == (7,)
  assert ((out > 0) & (out < 1)).all()


@pytest.mark.slow
def test_embedding_tables_are_per_feature_with_configured_buckets():
  model = models.dlrm(models.DLRMConfig(num_buckets=123, embedding_dim=5))
  model(_features(2))
  tables = [w for w in model.weights if "emb_" in w.name or
            "embeddings" in w.name]
  assert len(tables) == 26
  assert {tuple(w.shape) for w in tables} == {(123, 5)}


def test_unknown_config():
  with pytest.raises(ValueError, match="tiny"):
    models.dlrm("huge")


@pytest.mark.slow
def test_trains_on_a_pipeline(tmp_path):
  files = synthetic.generate(2048, tmp_path, seed=0)
  ds = pipelines.pipeline(4, files, batch_size=512, seed=0)
  model = models.dlrm(models.DLRMConfig(num_buckets=1000, embedding_dim=4,
                                    log_dense=False))
  history = model.fit(ds, epochs=1, verbose=0)
  assert np.isfinite(history.history["loss"][0])
  assert "auc" in history.history


def _best_validation_auc(model, train, valid, epochs):
  (xt, yt), (xv, yv) = train, valid
  aucs = []
  for _ in range(epochs):
    model.fit(xt, yt, batch_size=256, epochs=1, verbose=0)
    aucs.append(models.auc(yv, model.predict(xv, batch_size=2000, verbose=0)))
  return max(aucs), aucs


@pytest.mark.slow
def test_dlrm_and_logistic_regression_auc_on_real_sample(criteo_real_dir):
  path = str(criteo_real_dir / "criteo_sample_10k.tsv")
  x, y = next(iter(reader.read(path, batch_size=10_000)))
  train = ({k: v[:8000] for k, v in x.items()}, y[:8000])
  valid = ({k: v[8000:] for k, v in x.items()}, y[8000:].numpy())
  tf.keras.utils.set_random_seed(0)
  dlrm_best, dlrm_aucs = _best_validation_auc(models.dlrm(models.DLRMConfig()),
                                              train, valid, epochs=5)
  tf.keras.utils.set_random_seed(0)
  lr_best, lr_aucs = _best_validation_auc(models.logistic_regression(),
                                          train, valid, epochs=8)
  print(f"\nvalidation AUC per epoch: DLRM {np.round(dlrm_aucs, 4)}, "
        f"logistic regression {np.round(lr_aucs, 4)}")
  print(f"best: DLRM {dlrm_best:.4f}, logistic regression {lr_best:.4f}")
  assert dlrm_best >= 0.68
  assert lr_best >= 0.70
