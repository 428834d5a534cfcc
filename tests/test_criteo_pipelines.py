"""Tests of intune_tf.criteo.pipelines and the data-file helpers."""

import math

from _stages import parallel_calls
import numpy as np
import pytest
import tensorflow as tf

from intune_tf.criteo import files
from intune_tf.criteo import pipelines
from intune_tf.criteo import reader
from intune_tf.criteo import schema
from intune_tf.criteo import synthetic

ROWS = 3000


@pytest.fixture(scope="module")
def synthetic_files(tmp_path_factory):
  out = tmp_path_factory.mktemp("criteo_synthetic")
  return synthetic.generate(ROWS, out, seed=3, rows_per_file=1000)


def test_hash_sparse_hand_computed():
  ids = tf.constant([[schema.MISSING_SPARSE] + [1] * 25], tf.int64)
  got = pipelines.hash_sparse(ids, 11).numpy()[0]
  # Missing -> 0. Feature j, id 1: 1 + (0x9E3779B1 + j) mod 10, and
  # 0x9E3779B1 = 2654435761 = 10 * 265443576 + 1, so 1 + (1 + j) mod 10.
  assert got[0] == 0
  assert got[1] == 1 + (1 + 1) % 10 == 3
  assert got[9] == 1 + (1 + 9) % 10 == 1


def test_log_dense_hand_computed():
  x = tf.constant([0.0, math.e - 1, -(math.e ** 2 - 1)])
  # sign(x) * log1p(|x|): 0, log(e) = 1, -log(e^2) = -2.
  np.testing.assert_allclose(pipelines.log_dense(x).numpy(), [0, 1, -2],
                             rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("level", pipelines.LEVELS)
def test_each_level_reads_every_row_once(synthetic_files, level):
  ds = pipelines.pipeline(level, synthetic_files, batch_size=512, seed=0)
  assert ds.stages == pipelines.STAGES[level]
  rows = 0
  for element in ds:
    if level <= 2:
      assert set(element) == {"line", "file", "line_number"}
      rows += int(element["line"].shape[0])
    else:
      features, label = element
      keys = {"dense", "sparse"}
      if level >= 4:
        keys |= {"dense_buckets", "crosses", "vocab"}
      if level >= 5:
        keys |= {"heavy_crosses"}
      assert set(features) == keys
      assert features["dense"].dtype == tf.float32
      assert features["sparse"].dtype == tf.int64
      assert features["sparse"].shape[1] == 26
      rows += int(label.shape[0])
  assert rows == ROWS


@pytest.mark.slow
def test_level3_equals_reader_plus_transforms(synthetic_files):
  path = synthetic_files[0]
  (features, label), = list(pipelines.pipeline(
      3, path, batch_size=1000, shuffle_buffer=1, num_buckets=97))
  (raw, raw_label), = list(reader.read(path, batch_size=1000))
  np.testing.assert_array_equal(label, raw_label)
  np.testing.assert_allclose(features["dense"],
                             pipelines.log_dense(raw["dense"]))
  np.testing.assert_array_equal(features["sparse"],
                                pipelines.hash_sparse(raw["sparse"], 97))


@pytest.mark.slow
def test_level4_dictionary_hits_frequent_ids(synthetic_files):
  features, _ = next(iter(pipelines.pipeline(4, synthetic_files,
                                             batch_size=1000, seed=0)))
  vocab = features["vocab"].numpy()
  # The table holds each feature's most frequent synthetic ids.
  assert (vocab > 0).mean() > 0.5
  assert vocab.max() <= 1000
  assert features["dense_buckets"].numpy().max() <= len(
      pipelines.DENSE_BOUNDARIES)


def test_shuffle_is_seeded(synthetic_files):
  def first(seed):
    ds = pipelines.pipeline(2, synthetic_files, batch_size=64, seed=seed,
                            deterministic=True)
    return next(iter(ds))["line"].numpy()
  np.testing.assert_array_equal(first(5), first(5))
  assert not np.array_equal(first(5), first(6))


@pytest.mark.slow
def test_fixed_parallelism_replaces_autotune(synthetic_files):
  ds = pipelines.pipeline(5, synthetic_files, batch_size=64, parallelism={
      "read": 2, "batch": 1, "parse": 3, "features": 2, "heavy": 4,
      "prefetch": 5})
  values = [v for _, v in parallel_calls(ds)]
  # prefetch 5, heavy 4, features 2, parse 3, batch 1; shuffle buffer 16384.
  assert values[:6] == [5, 4, 2, 3, 1, 16_384]
  auto = [v for _, v in parallel_calls(pipelines.pipeline(
      5, synthetic_files, batch_size=64))]
  assert auto[:5] == [tf.data.AUTOTUNE] * 5
  next(iter(ds))


def test_bad_parallelism_and_level(synthetic_files):
  with pytest.raises(ValueError, match="unknown stage"):
    pipelines.pipeline(3, synthetic_files, parallelism={"shuffle": 2})
  with pytest.raises(ValueError, match=">= 1"):
    pipelines.pipeline(3, synthetic_files, parallelism={"parse": 0})
  with pytest.raises(ValueError, match="level"):
    pipelines.pipeline(6, synthetic_files)


def test_stage_names_grow_with_level():
  for level in pipelines.LEVELS[1:]:
    assert set(pipelines.STAGES[level - 1]) < set(pipelines.STAGES[level])
  assert pipelines.STAGES[5][-1] == "prefetch"


def test_default_files_are_generated_once(tmp_path):
  first = files.default_files(rows=2000, cache_dir=tmp_path, rows_per_file=500)
  assert len(first) == 4
  stamp = [p for p in first][0]
  mtime = __import__("os").path.getmtime(stamp)
  again = files.default_files(rows=2000, cache_dir=tmp_path, rows_per_file=500)
  assert again == first
  assert __import__("os").path.getmtime(stamp) == mtime


def test_cached_folder_is_written_once_and_never_half(tmp_path):
  calls = []

  def write(out):
    calls.append(out)
    (out / "part-0").write_text("x")

  def fail(out):
    (out / "part-0").write_text("half")
    raise OSError("disk full")

  with pytest.raises(OSError, match="disk full"):
    files.cached_folder(tmp_path, "set", fail)
  assert list(tmp_path.iterdir()) == []  # neither the set nor a temporary
  target = files.cached_folder(tmp_path, "set", write)
  assert files.cached_folder(tmp_path, "set", write) == target
  assert len(calls) == 1 and (target / "part-0").read_text() == "x"
  assert [p.name for p in tmp_path.iterdir()] == ["set"]


def test_real_sample_files(criteo_real_dir):
  found = files.real_sample_files()
  assert found is not None
  assert [p.rsplit("/", 1)[1] for p in found] == [
      "criteo_sample_10k.tsv", "criteo_train_head_1999.tsv"]


@pytest.mark.slow
def test_real_sample_through_level5(criteo_real_dir):
  ds = pipelines.pipeline(
      5, str(criteo_real_dir / "criteo_train_head_1999.tsv"),
      batch_size=500, seed=0)
  assert sum(int(y.shape[0]) for _, y in ds) == 1999


def _sorted_rows(ds) -> np.ndarray:
  """Every row of `ds`'s `(features, label)` batches as one float64 row
  (label, dense, sparse, crosses, vocab), sorted."""
  rows = []
  for features, label in ds:
    rows.append(np.concatenate([
        label.numpy()[:, None], features["dense_buckets"].numpy(),
        features["sparse"].numpy(), features["crosses"].numpy(),
        features["vocab"].numpy()], axis=1).astype(np.float64))
  rows = np.concatenate(rows)
  return rows[np.lexsort(rows.T[::-1])]


@pytest.mark.slow
@pytest.mark.parametrize("cache_records", [False, True])
def test_examples_pipeline_gives_the_text_pipelines_rows(
    synthetic_files, tmp_path, cache_records):
  # The same rows through the same level-4 stages, read from text and from
  # TFRecord Examples: the same rows (the noisy dense values aside), in
  # another order.
  from intune_tf.criteo import convert  # noqa: PLC0415  only this test
  records = convert.convert_files(synthetic_files, str(tmp_path / "tfr"))
  ds = pipelines.examples_pipeline(4, records, batch_size=512, seed=1,
                                   num_buckets=97,
                                   cache_records=cache_records)
  assert ds.stages == pipelines.STAGES[4]
  text = pipelines.pipeline(4, synthetic_files, batch_size=512, seed=1,
                            num_buckets=97)
  np.testing.assert_array_equal(_sorted_rows(ds), _sorted_rows(text))
