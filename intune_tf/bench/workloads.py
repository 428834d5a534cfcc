"""Benchmark workloads of other shapes than the Criteo text pipelines.

* `examples_pipeline` (scenario `tfrecord-examples`): TFRecord shards of
  serialized `tf.train.Example`s, one per Criteo-like row drawn by the
  Criteo synthetic generator: `label` and `I1`..`I13` int64, `C1`..`C26`
  bytes (8 hex digits); a missing value is an absent feature. Written once
  into the Criteo cache folder (`examples_files`). Stages
  (`EXAMPLES_STAGES`): `read` (interleave of `TFRecordDataset`s), `batch`,
  `parse` (`tf.io.parse_example`), `features` (signed log of the dense
  features, `to_hash_bucket_fast` of the categoricals and of crosses of
  adjacent pairs), `prefetch`. Element: `({"dense": float32 [B, 13],
  "sparse": int64 [B, 26], "crosses": int64 [B, 13]}, label float32 [B])`,
  B = 4096.
* `images_pipeline` (scenario `image-augment`): smooth random 96x96 RGB
  images encoded as JPEG, held in memory (`jpeg_images`). Stages
  (`IMAGES_STAGES`): `decode` (one map: `decode_jpeg`, random 80x80 crop,
  random left-right flip, random brightness, per-channel normalization;
  stateless random ops seeded by the seed and the element's index), `batch`,
  `prefetch`. Element: `(images float32 [B, 80, 80, 3], labels int64 [B])`,
  B = 128.

Each pipeline takes `parallelism={stage: int}` for its tunable stages
(`EXAMPLES_TUNABLE`, `IMAGES_TUNABLE`; for "prefetch", the buffer size); the
others stay AUTOTUNE. `batch` is a plain (sequential) batch in both.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
from typing import Iterable, Iterator, Mapping

import numpy as np
import tensorflow as tf

from intune_tf.criteo import files
from intune_tf.criteo import pipelines
from intune_tf.criteo import schema
from intune_tf.criteo import synthetic

# --- tfrecord-examples -----------------------------------------------------

EXAMPLES_STAGES: tuple[str, ...] = ("read", "batch", "parse", "features",
                                    "prefetch")
EXAMPLES_TUNABLE: tuple[str, ...] = ("read", "parse", "features", "prefetch")
EXAMPLES_BATCH = 4096
# The cached set: 8 shards of 16,384 rows, about 84 MB.
EXAMPLES_ROWS = 131_072
EXAMPLES_ROWS_PER_FILE = 16_384
# Part of the cache folder's name: change it when the records change.
_EXAMPLES_VERSION = b"tf-examples/1"


def _serialized_examples(chunk: Mapping[str, np.ndarray]) -> Iterator[bytes]:
  """One serialized `tf.train.Example` per row of a `synthetic.sample_chunk`:
  `label` and `I1`..`I13` int64, `C1`..`C26` bytes; missing -> absent."""
  feature, int64s, strings = (tf.train.Feature, tf.train.Int64List,
                              tf.train.BytesList)
  rows = zip(chunk["label"].tolist(), chunk["dense"].tolist(),
             chunk["dense_missing"].tolist(),
             synthetic.hex_digits(chunk["sparse"]).view("S8")[..., 0]
             .tolist(),
             chunk["sparse_missing"].tolist())
  for label, dense, dense_missing, sparse, sparse_missing in rows:
    values = {"label": feature(int64_list=int64s(value=[label]))}
    for name, value, missing in zip(schema.DENSE_NAMES, dense, dense_missing):
      if not missing:
        values[name] = feature(int64_list=int64s(value=[value]))
    for name, value, missing in zip(schema.SPARSE_NAMES, sparse,
                                    sparse_missing):
      if not missing:
        values[name] = feature(bytes_list=strings(value=[value]))
    yield tf.train.Example(features=tf.train.Features(
        feature=values)).SerializeToString()


def _write_examples(out_dir: pathlib.Path, rows: int, rows_per_file: int,
                    seed: int) -> None:
  stats = synthetic.load_stats()
  for f, start in enumerate(range(0, rows, rows_per_file)):
    rng = np.random.default_rng([seed, f])
    chunk = synthetic.sample_chunk(stats, min(rows_per_file, rows - start),
                                   rng)
    path = out_dir / f"part-{f:05d}.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
      for record in _serialized_examples(chunk):
        writer.write(record)


def examples_files(rows: int | None = None,
                   cache_dir: str | os.PathLike | None = None,
                   *,
                   seed: int = 0,
                   rows_per_file: int | None = None) -> list[str]:
  """TFRecord shards of `tf.train.Example`s, generated once and cached.

  Rows come from the Criteo synthetic generator (`synthetic.sample_chunk`,
  shard `f` seeded with `[seed, f]`), so a set is the same on every machine
  with the same generator parameters. They go beside `files.default_files`'
  set, keyed by the arguments and the generator parameters.

  Args:
    rows: Rows in the set (default None: `EXAMPLES_ROWS`, about 84 MB).
    cache_dir: Where to keep it (default None: `files.default_cache_dir()`).
    seed: Generator seed (default 0).
    rows_per_file: Rows per shard (default None: `EXAMPLES_ROWS_PER_FILE`).

  Returns:
    The sorted shard paths (`part-NNNNN.tfrecord`).
  """
  rows = rows or EXAMPLES_ROWS
  rows_per_file = rows_per_file or EXAMPLES_ROWS_PER_FILE
  base = pathlib.Path(cache_dir) if cache_dir else files.default_cache_dir()
  digest = hashlib.sha256(synthetic.STATS_PATH.read_bytes() +
                          _EXAMPLES_VERSION).hexdigest()[:8]
  target = files.cached_folder(
      base, f"examples-r{rows}-s{seed}-f{rows_per_file}-{digest}",
      lambda out: _write_examples(out, rows, rows_per_file, seed))
  return sorted(str(p) for p in target.glob("part-*.tfrecord"))


def example_spec() -> dict[str, tf.io.FixedLenFeature]:
  """The `parse_example` spec: absent int64s read 0, absent strings ""."""
  spec = {"label": tf.io.FixedLenFeature([], tf.int64, default_value=0)}
  for name in schema.DENSE_NAMES:
    spec[name] = tf.io.FixedLenFeature([], tf.int64, default_value=0)
  for name in schema.SPARSE_NAMES:
    spec[name] = tf.io.FixedLenFeature([], tf.string, default_value="")
  return spec


class _ExampleFeatures:
  """The features stage: signed log of the dense features, hashed
  categoricals (missing -> bucket 0) and hashed crosses of pairs."""

  def __init__(self, num_buckets: int):
    self._num_buckets = num_buckets
    self._left = tf.constant([a for a, _ in pipelines.CROSS_PAIRS], tf.int32)
    self._right = tf.constant([b for _, b in pipelines.CROSS_PAIRS],
                              tf.int32)

  def __call__(self, parsed):
    dense = tf.stack([parsed[n] for n in schema.DENSE_NAMES], axis=1)
    text = tf.stack([parsed[n] for n in schema.SPARSE_NAMES], axis=1)
    hashed = 1 + tf.strings.to_hash_bucket_fast(text, self._num_buckets - 1)
    sparse = tf.where(text == "", tf.zeros_like(hashed), hashed)
    pairs = tf.strings.join([tf.gather(text, self._left, axis=1),
                             tf.gather(text, self._right, axis=1)],
                            separator="_")
    crosses = tf.strings.to_hash_bucket_fast(pairs, self._num_buckets)
    features = {"dense": pipelines.log_dense(tf.cast(dense, tf.float32)),
                "sparse": sparse, "crosses": crosses}
    return features, tf.cast(parsed["label"], tf.float32)


def examples_pipeline(paths: Iterable[str],
                      *,
                      batch_size: int = EXAMPLES_BATCH,
                      parallelism: Mapping[str, int] | None = None,
                      num_buckets: int = 1 << 20,
                      last_stage: str = "features") -> tf.data.Dataset:
  """The `tfrecord-examples` pipeline, repeated forever.

  `from_tensor_slices(paths).repeat()` -> `interleave(TFRecordDataset)`
  (`read`) -> `batch` -> `map(parse_example)` (`parse`) -> `map(features)`
  (`features`) -> `prefetch`.

  Args:
    paths: TFRecord shards (`examples_files()`).
    batch_size: Rows per batch (default 4096); short batches are dropped.
    parallelism: `{stage: value}` fixing stages of `EXAMPLES_TUNABLE`
      (default None: all AUTOTUNE).
    num_buckets: Hash buckets of the categoricals and crosses (default 2**20).
    last_stage: Build up to this stage of `EXAMPLES_STAGES` (then prefetch):
      the prefixes of the work ceiling (default "features": all).

  Returns:
    The dataset; see the module docstring for its elements.
  """
  if last_stage not in EXAMPLES_STAGES:
    raise ValueError(f"last_stage must be one of {EXAMPLES_STAGES}, got "
                     f"{last_stage!r}")
  stages = EXAMPLES_STAGES[:EXAMPLES_STAGES.index(last_stage) + 1]
  par = pipelines.fixed_parallelism(parallelism, EXAMPLES_TUNABLE)
  paths = list(paths)
  read = par["read"]
  cycle = max(1, min(len(paths), max(os.cpu_count() or 1, read)))
  if read != tf.data.AUTOTUNE:
    read = min(read, cycle)
  ds = tf.data.Dataset.from_tensor_slices(paths).repeat().interleave(
      tf.data.TFRecordDataset, cycle_length=cycle, num_parallel_calls=read)
  ds = ds.batch(batch_size, drop_remainder=True)
  if "parse" in stages:
    spec = example_spec()
    ds = ds.map(lambda serialized: tf.io.parse_example(serialized, spec),
                num_parallel_calls=par["parse"])
  if "features" in stages:
    ds = ds.map(_ExampleFeatures(num_buckets),
                num_parallel_calls=par["features"])
  return ds.prefetch(par["prefetch"])


# --- image-augment ---------------------------------------------------------

IMAGES_STAGES: tuple[str, ...] = ("decode", "batch", "prefetch")
IMAGES_TUNABLE: tuple[str, ...] = ("decode", "prefetch")
IMAGES_BATCH = 128
IMAGES_COUNT = 1024
IMAGE_SIZE = 96
IMAGE_CROP = 80
NUM_CLASSES = 10
# Per-channel mean and standard deviation (ImageNet's, of [0, 1] values).
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


@functools.cache
def jpeg_images(count: int = IMAGES_COUNT, size: int = IMAGE_SIZE,
                seed: int = 0) -> tuple[tuple[bytes, ...], tuple[int, ...]]:
  """Smooth random RGB images encoded as JPEG, and their labels.

  Each image is 6x6 uniform random colours upsampled bicubically to
  `size` x `size`, plus Gaussian noise (std 6 of 255), encoded at quality
  90: about 5 KB each. Made once per process (numpy seed `seed`).

  Args:
    count: Images (default `IMAGES_COUNT`).
    size: Height and width (default `IMAGE_SIZE`).
    seed: Generator seed (default 0).

  Returns:
    `(jpegs, labels)`: the encoded images, labels in [0, NUM_CLASSES).
  """
  rng = np.random.default_rng(seed)
  jpegs = []
  for start in range(0, count, 128):
    n = min(128, count - start)
    coarse = rng.uniform(0.0, 255.0, (n, 6, 6, 3)).astype(np.float32)
    smooth = tf.image.resize(coarse, [size, size], method="bicubic").numpy()
    noisy = smooth + rng.normal(0.0, 6.0, smooth.shape)
    pixels = np.clip(np.round(noisy), 0, 255).astype(np.uint8)
    jpegs.extend(tf.io.encode_jpeg(p, quality=90).numpy() for p in pixels)
  labels = rng.integers(0, NUM_CLASSES, count)
  return tuple(jpegs), tuple(int(x) for x in labels)


class _Augment:
  """The decode stage: decode, random crop and flip, random brightness,
  normalize; random ops are stateless, seeded by `(seed, index)`."""

  def __init__(self, crop: int, seed: int):
    self._crop = crop
    self._seed = seed

  def __call__(self, index, element):
    jpeg, label = element
    seeds = tf.random.experimental.stateless_split(
        tf.stack([tf.constant(self._seed, tf.int64), index]), num=3)
    image = tf.io.decode_jpeg(jpeg, channels=3)
    image = tf.image.stateless_random_crop(
        image, [self._crop, self._crop, 3], seed=seeds[0])
    image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    image = tf.image.convert_image_dtype(image, tf.float32)
    image = tf.image.stateless_random_brightness(image, 0.1, seed=seeds[2])
    return (image - _MEAN) / _STD, label


def images_pipeline(jpegs: Iterable[bytes] | None = None,
                    labels: Iterable[int] | None = None,
                    *,
                    batch_size: int = IMAGES_BATCH,
                    crop: int = IMAGE_CROP,
                    parallelism: Mapping[str, int] | None = None,
                    seed: int = 0) -> tf.data.Dataset:
  """The `image-augment` pipeline, repeated forever.

  `from_tensor_slices((jpegs, labels)).repeat().enumerate()` ->
  `map(decode and augment)` (`decode`) -> `batch` -> `prefetch`. Element i
  of the repeated stream gets the same augmentation in every build with the
  same seed, whatever the parallelism.

  Args:
    jpegs: Encoded images, all at least `crop` pixels high and wide (default
      None: `jpeg_images()`, with its labels).
    labels: int64 labels, one per image (with `jpegs`).
    batch_size: Images per batch (default 128); short batches are dropped.
    crop: Height and width of the random crop (default 80).
    parallelism: `{stage: value}` fixing stages of `IMAGES_TUNABLE`
      (default None: all AUTOTUNE).
    seed: Augmentation seed (default 0).

  Returns:
    The dataset of `(images float32 [B, crop, crop, 3], labels int64 [B])`.
  """
  if jpegs is None:
    jpegs, labels = jpeg_images()
  par = pipelines.fixed_parallelism(parallelism, IMAGES_TUNABLE)
  ds = tf.data.Dataset.from_tensor_slices((
      tf.constant(list(jpegs), tf.string),
      tf.constant(list(labels), tf.int64))).repeat().enumerate()
  ds = ds.map(_Augment(crop, seed), num_parallel_calls=par["decode"])
  ds = ds.batch(batch_size, drop_remainder=True)
  return ds.prefetch(par["prefetch"])
