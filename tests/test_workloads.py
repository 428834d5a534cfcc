"""The benchmark workloads and their scenarios (`tfrecord-examples`,
`image-augment`)."""

import json
import types

from _stages import parallel_calls
import numpy as np
import pytest
import tensorflow as tf

from intune_tf.bench import harness
from intune_tf.bench import scenarios
from intune_tf.bench import workloads
from intune_tf.criteo import schema
from intune_tf.criteo import synthetic

ROWS, ROWS_PER_FILE = 8192, 2048
AUTO = tf.data.AUTOTUNE


@pytest.fixture(autouse=True, scope="module")
def small_examples(tmp_path_factory):
  """A small TFRecord set in a temporary cache (not ~/.cache)."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("INTUNE_CRITEO_CACHE", str(tmp_path_factory.mktemp("cache")))
    patch.setattr(workloads, "EXAMPLES_ROWS", ROWS)
    patch.setattr(workloads, "EXAMPLES_ROWS_PER_FILE", ROWS_PER_FILE)
    yield


def _take(ds, n):
  """The first `n` elements as numpy (nested structures kept)."""
  return [tf.nest.map_structure(lambda t: t.numpy(), x) for x in ds.take(n)]


def _assert_same(a, b):
  tf.nest.map_structure(np.testing.assert_array_equal, a, b)


def test_examples_files_are_cached_and_complete(tmp_path):
  paths = workloads.examples_files(rows=300, cache_dir=tmp_path,
                                   rows_per_file=100)
  assert [p.rsplit("/", 1)[1] for p in paths] == [
      "part-00000.tfrecord", "part-00001.tfrecord", "part-00002.tfrecord"]
  mtimes = [tf.io.gfile.stat(p).mtime_nsec for p in paths]
  again = workloads.examples_files(rows=300, cache_dir=tmp_path,
                                   rows_per_file=100)
  assert again == paths
  assert [tf.io.gfile.stat(p).mtime_nsec for p in again] == mtimes
  # Nothing left over but the set itself.
  assert [p.name for p in tmp_path.iterdir()] == [
      paths[0].split("/")[-2]]
  assert sum(1 for _ in tf.data.TFRecordDataset(paths)) == 300


def test_examples_hold_the_generator_rows(tmp_path):
  paths = workloads.examples_files(rows=64, cache_dir=tmp_path,
                                   rows_per_file=64)
  chunk = synthetic.sample_chunk(synthetic.load_stats(), 64,
                                 np.random.default_rng([0, 0]))
  ds = tf.data.TFRecordDataset(paths).batch(64).map(
      lambda s: tf.io.parse_example(s, workloads.example_spec()))
  parsed = next(iter(ds))
  np.testing.assert_array_equal(parsed["label"], chunk["label"])
  for j, name in enumerate(schema.DENSE_NAMES):
    want = np.where(chunk["dense_missing"][:, j], 0, chunk["dense"][:, j])
    np.testing.assert_array_equal(parsed[name], want)
  for j, name in enumerate(schema.SPARSE_NAMES):
    want = [b"" if missing else f"{int(v):08x}".encode()
            for v, missing in zip(chunk["sparse"][:, j],
                                  chunk["sparse_missing"][:, j])]
    assert parsed[name].numpy().tolist() == want
  # The set has missing values of both kinds.
  assert chunk["dense_missing"].any() and chunk["sparse_missing"].any()


@pytest.mark.slow
def test_examples_scenario_batches():
  scenario = scenarios.get("tfrecord-examples")
  batch = workloads.EXAMPLES_BATCH
  assert scenario.rows_per_element == batch
  ds = scenario.make(None)
  features, label = ds.element_spec
  assert {k: (v.shape.as_list(), v.dtype) for k, v in features.items()} == {
      "dense": ([batch, 13], tf.float32), "sparse": ([batch, 26], tf.int64),
      "crosses": ([batch, 13], tf.int64)}
  assert (label.shape.as_list(), label.dtype) == ([batch], tf.float32)
  first = _take(ds, 3)
  for features, label in first:
    assert set(np.unique(label)) <= {0.0, 1.0}
    assert np.isfinite(features["dense"]).all()
    for key in ("sparse", "crosses"):
      assert (features[key] >= 0).all() and (features[key] < 1 << 20).all()
    # Missing categoricals (absent features) hash to bucket 0, others not.
    assert 0 < np.mean(features["sparse"] == 0) < 0.5
  _assert_same(_take(scenario.make(None), 3), first)


@pytest.mark.slow
def test_examples_fixed_parallelism():
  scenario = scenarios.get("tfrecord-examples")
  fixed = scenario.make({"read": 1, "parse": 1, "features": 2,
                         "prefetch": 3})
  # prefetch 3, features 2, parse 1, read (interleave) 1.
  assert [v for _, v in parallel_calls(fixed)] == [3, 2, 1, 1]
  auto = scenario.make(None)
  assert [v for _, v in parallel_calls(auto)] == [AUTO] * 4
  _assert_same(_take(fixed, 2), _take(auto, 2))
  with pytest.raises(ValueError, match="unknown stage"):
    scenario.make({"decode": 1})
  with pytest.raises(ValueError, match=">= 1"):
    scenario.make({"parse": 0})


@pytest.mark.slow
def test_examples_prefixes_add_one_stage_each():
  scenario = scenarios.get("tfrecord-examples")
  assert [s for s, _ in scenario.prefixes] == ["read+batch", "parse",
                                               "features"]
  specs = [make().element_spec for _, make in scenario.prefixes]
  assert specs[0].shape.as_list() == [workloads.EXAMPLES_BATCH]
  assert set(specs[1]) == set(schema.FIELD_NAMES)
  assert specs[2] == scenario.make(None).element_spec
  last = scenario.prefixes[-1][1]()
  assert all(v == 1 for _, v in parallel_calls(last))


@pytest.mark.slow
def test_image_scenario_batches():
  scenario = scenarios.get("image-augment")
  batch, crop = workloads.IMAGES_BATCH, workloads.IMAGE_CROP
  assert scenario.rows_per_element == batch
  ds = scenario.make(None)
  images, labels = ds.element_spec
  assert (images.shape.as_list(), images.dtype) == ([batch, crop, crop, 3],
                                                    tf.float32)
  assert (labels.shape.as_list(), labels.dtype) == ([batch], tf.int64)
  first = _take(ds, 2)
  for images, labels in first:
    assert np.isfinite(images).all()
    # Normalized: roughly zero mean, unit spread (not [0, 255] or [0, 1]).
    assert abs(images.mean()) < 1.0 and 0.3 < images.std() < 2.0
    assert ((labels >= 0) & (labels < workloads.NUM_CLASSES)).all()
  _assert_same(_take(scenario.make(None), 2), first)
  other = _take(workloads.images_pipeline(seed=1), 1)[0]
  np.testing.assert_array_equal(other[1], first[0][1])
  assert not np.array_equal(other[0], first[0][0])


def test_image_augmentation_varies_per_element():
  jpegs, labels = workloads.jpeg_images(count=4, size=32)
  assert workloads.jpeg_images(count=4, size=32) == (jpegs, labels)
  assert all(j[:2] == b"\xff\xd8" for j in jpegs)  # JPEG start of image.
  decoded = tf.io.decode_jpeg(jpegs[0]).numpy()
  assert decoded.shape == (32, 32, 3)
  # Smooth: neighbouring pixels differ far less than random ones would.
  assert np.abs(np.diff(decoded.astype(float), axis=1)).mean() < 40
  ds = workloads.images_pipeline(jpegs[:1], labels[:1], batch_size=8,
                                 crop=16)
  images, _ = _take(ds, 1)[0]
  # One image, eight crops/flips: not all the same.
  assert len({im.tobytes() for im in images}) > 1


@pytest.mark.slow
def test_image_fixed_parallelism():
  scenario = scenarios.get("image-augment")
  fixed = scenario.make({"decode": 1, "prefetch": 2})
  assert [v for _, v in parallel_calls(fixed)] == [2, 1]
  auto = scenario.make(None)
  assert [v for _, v in parallel_calls(auto)] == [AUTO, AUTO]
  _assert_same(_take(fixed, 2), _take(auto, 2))
  with pytest.raises(ValueError, match="unknown stage"):
    scenario.make({"batch": 1})
  (name, make), = scenario.prefixes
  assert name == "decode+batch"
  assert [v for _, v in parallel_calls(make())] == [1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tfrecord-examples", "image-augment"])
def test_bench_runs_on_the_scenario(name, tmp_path):
  args = types.SimpleNamespace(
      policies="even", scenarios=name, repeats=1, seconds=1.0, warmup=0.5,
      cpu_budget=None, ram_budget=None, json=str(tmp_path / "out.json"),
      plots=None, trace=None, oracle_seconds=1.5, oracle_repeats=1,
      oracle_cpus=None, warm_start=False)
  assert harness.main(args) == 0
  entry = json.loads((tmp_path / "out.json").read_text())["scenarios"][name]
  assert entry["policies"]["even"]["rows_per_s"] > 0
  assert entry["ceiling_rows_per_s"] > 0
  assert set(entry["stage_seconds_per_row"]) == {
      s for s, _ in scenarios.get(name).prefixes}
