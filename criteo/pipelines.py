"""Online preprocessing pipelines of increasing cost: the scaling study.

    ds = intune_tf.criteo.pipeline(4, files, batch_size=4096)

| level | stages (`STAGES[level]`) | element |
|---|---|---|
| 1 | read, batch, prefetch | raw line batch `{"line", "file", "line_number"}` |
| 2 | read, shuffle, batch, prefetch | same, rows shuffled |
| 3 | ... batch, parse, prefetch | `({"dense", "sparse"}, label)` |
| 4 | ... parse, features, prefetch | plus `dense_buckets`, `crosses`, `vocab` |
| 5 | ... features, heavy, prefetch | plus `heavy_crosses` |

Each stage is its own tf.data transformation so a tuner sees it: `read` is an
`interleave` of `TextLineDataset`s over the files, `shuffle` a row-level
shuffle, `batch` a parallel batch, `parse` / `features` / `heavy` batch-level
vectorized `map`s, then `prefetch`. Every parallel stage runs with
`tf.data.AUTOTUNE` unless `parallelism` maps its name to a fixed int.

UDFs:

* parse (L3): decode the text (`reader.Parser`), signed log transform of the
  dense features, `sign(x) * log1p(|x|)`, and hash each categorical into
  `num_buckets` buckets per feature (missing -> bucket 0).
* features (L4): Gaussian noise augmentation of the dense features
  (`noise_std`), bucketization of the dense features (`DENSE_BOUNDARIES`),
  hashed feature crosses of categorical pairs (`CROSS_PAIRS`), and a
  per-feature dictionary lookup through one `tf.lookup.StaticHashTable` keyed
  by (feature, bucket) whose vocabulary is the `vocab_size` most frequent ids
  of the synthetic generator per feature (0 = out of vocabulary).
* heavy (L5): `heavy_rounds` rounds of string crosses of every adjacent
  categorical pair hashed with SipHash (`to_hash_bucket_strong`), enough CPU
  that the pipeline wants every core.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from intune_tf.criteo import convert
from intune_tf.criteo import reader
from intune_tf.criteo import schema
from intune_tf.criteo import synthetic

STAGES: dict[int, tuple[str, ...]] = {
    1: ("read", "batch", "prefetch"),
    2: ("read", "shuffle", "batch", "prefetch"),
    3: ("read", "shuffle", "batch", "parse", "prefetch"),
    4: ("read", "shuffle", "batch", "parse", "features", "prefetch"),
    5: ("read", "shuffle", "batch", "parse", "features", "heavy", "prefetch"),
}
LEVELS: tuple[int, ...] = tuple(STAGES)
# Stages whose parallelism (or prefetch buffer) `parallelism` can fix.
TUNABLE_STAGES: tuple[str, ...] = ("read", "batch", "parse", "features",
                                   "heavy", "prefetch")
# Pairs of categorical features (0 = C1) crossed at level 4.
CROSS_PAIRS: tuple[tuple[int, int], ...] = tuple(
    (i, i + 1) for i in range(0, schema.NUM_SPARSE, 2))
# Bucket boundaries of the log-transformed dense features at level 4.
DENSE_BOUNDARIES: tuple[float, ...] = tuple(
    float(x) for x in np.round(np.arange(-1.0, 16.0, 0.5), 2))
_MIX = 0x9E3779B1  # Odd multiplier for integer hashing.


def hash_sparse(ids: tf.Tensor, num_buckets: int) -> tf.Tensor:
  """Hashes int64 categorical ids `[B, 26]` into `[0, num_buckets)`.

  Missing ids (`schema.MISSING_SPARSE`) go to bucket 0; the others to
  `1 + (id * 0x9E3779B1 + feature) mod (num_buckets - 1)` (int64, wrapping),
  so the same id lands in different buckets in different features.

  Args:
    ids: int64 `[B, 26]`.
    num_buckets: Buckets per feature, >= 2.

  Returns:
    int64 `[B, 26]`.
  """
  feature = tf.range(schema.NUM_SPARSE, dtype=tf.int64)
  mixed = ids * _MIX + feature
  bucket = 1 + tf.math.floormod(mixed, num_buckets - 1)
  return tf.where(ids == schema.MISSING_SPARSE, tf.zeros_like(bucket), bucket)


def log_dense(dense: tf.Tensor) -> tf.Tensor:
  """The signed log transform `sign(x) * log1p(|x|)` (float32)."""
  return tf.sign(dense) * tf.math.log1p(tf.abs(dense))


class _Parse:
  """L3 UDF: decode, log-transform dense, hash categoricals."""

  def __init__(self, decode: Callable[[Any], Any], num_buckets: int):
    self._decode = decode
    self._num_buckets = num_buckets

  def __call__(self, batch):
    features, label = self._decode(batch)
    return {"dense": log_dense(features["dense"]),
            "sparse": hash_sparse(features["sparse"], self._num_buckets)}, label


def vocabulary_table(num_buckets: int, vocab_size: int,
                     stats: Mapping | None = None) -> tf.lookup.StaticHashTable:
  """The per-feature dictionary of level 4 as one static hash table.

  Keys are `feature * num_buckets + bucket` for the hashed buckets of the
  `vocab_size` most frequent synthetic ids of each feature (fewer where the
  feature's vocabulary is smaller); values are the 1-based frequency rank;
  any other key maps to 0.

  Args:
    num_buckets: The parse stage's buckets per feature.
    vocab_size: Entries per feature at most.
    stats: Generator parameters (default None: the packaged ones).

  Returns:
    The table (int64 -> int64).
  """
  stats = stats or synthetic.load_stats()
  keys, values = [], []
  for j, col in enumerate(stats["sparse"]):
    n = min(vocab_size, int(col.get("gen_vocab_size", col["vocab_size"])))
    ranks = np.arange(n, dtype=np.uint64)
    ids = np.full((n, schema.NUM_SPARSE), schema.MISSING_SPARSE, np.int64)
    ids[:, j] = synthetic.category_id(j, ranks).astype(np.int64)
    buckets = hash_sparse(tf.constant(ids), num_buckets)[:, j].numpy()
    keys.append(j * num_buckets + buckets)
    values.append(np.arange(1, n + 1, dtype=np.int64))
  keys = np.concatenate(keys)
  values = np.concatenate(values)
  # Keep the first (most frequent) entry of any colliding key.
  _, first = np.unique(keys, return_index=True)
  init = tf.lookup.KeyValueTensorInitializer(
      tf.constant(keys[first], tf.int64), tf.constant(values[first], tf.int64))
  return tf.lookup.StaticHashTable(init, default_value=0)


class _Features:
  """L4 UDF: noise, bucketization, crosses, dictionary lookups."""

  def __init__(self, table: tf.lookup.StaticHashTable, num_buckets: int,
               noise_std: float, seed: int | None):
    self._table = table
    self._num_buckets = num_buckets
    self._noise_std = noise_std
    self._seed = seed
    self._left = tf.constant([a for a, _ in CROSS_PAIRS], tf.int32)
    self._right = tf.constant([b for _, b in CROSS_PAIRS], tf.int32)

  def __call__(self, features, label):
    dense, sparse = features["dense"], features["sparse"]
    noisy = dense + tf.random.normal(tf.shape(dense), stddev=self._noise_std,
                                     seed=self._seed)
    buckets = tf.raw_ops.Bucketize(input=dense,
                                   boundaries=list(DENSE_BOUNDARIES))
    a = tf.gather(sparse, self._left, axis=1)
    b = tf.gather(sparse, self._right, axis=1)
    crosses = tf.math.floormod(a * 1_000_003 + b, self._num_buckets)
    feature = tf.range(schema.NUM_SPARSE, dtype=tf.int64)
    vocab = self._table.lookup(feature * self._num_buckets + sparse)
    out = dict(features)
    out.update(dense=noisy, dense_buckets=tf.cast(buckets, tf.int64),
               crosses=crosses, vocab=vocab)
    return out, label


class _Heavy:
  """L5 UDF: rounds of string crosses hashed with SipHash."""

  def __init__(self, rounds: int, num_buckets: int):
    self._rounds = rounds
    self._num_buckets = num_buckets

  def __call__(self, features, label):
    text = tf.strings.as_string(features["sparse"])
    nxt = tf.roll(text, shift=-1, axis=1)
    acc = tf.zeros_like(features["sparse"])
    for r in range(self._rounds):
      joined = tf.strings.join([text, nxt, tf.strings.as_string(acc)],
                               separator="_")
      acc = tf.strings.to_hash_bucket_strong(joined, self._num_buckets,
                                             key=[r + 1, 2 * r + 7])
    out = dict(features)
    out["heavy_crosses"] = acc
    return out, label


def fixed_parallelism(parallelism: Mapping[str, int] | None,
                      tunable: Sequence[str]) -> dict[str, int]:
  """Each tunable stage's parallelism: the value given, else AUTOTUNE.

  Args:
    parallelism: `{stage: parallelism}` (None: all AUTOTUNE).
    tunable: The stages a pipeline lets `parallelism` fix.

  Returns:
    `{stage: value}` for every stage of `tunable`.

  Raises:
    ValueError: an unknown stage, or a value below 1 (other than AUTOTUNE).
  """
  parallelism = dict(parallelism or {})
  unknown = set(parallelism) - set(tunable)
  if unknown:
    raise ValueError(f"unknown stage(s) {sorted(unknown)} in parallelism; "
                     f"tunable stages are {tuple(tunable)}")
  for name, value in parallelism.items():
    if value != tf.data.AUTOTUNE and int(value) < 1:
      raise ValueError(f"parallelism[{name!r}] must be >= 1 or AUTOTUNE")
  return {s: int(parallelism.get(s, tf.data.AUTOTUNE)) for s in tunable}


def _stage_parallelism(parallelism: Mapping[str, int] | None,
                       level: int) -> dict[str, int]:
  par = fixed_parallelism(parallelism, TUNABLE_STAGES)
  return {s: par[s] for s in STAGES[level] if s in par}


def pipeline(level: int,
             files: str | Iterable[str],
             *,
             batch_size: int = 4096,
             parallelism: Mapping[str, int] | None = None,
             shuffle_buffer: int = 16_384,
             seed: int | None = None,
             num_buckets: int = 1 << 20,
             vocab_size: int = 1000,
             noise_std: float = 0.05,
             heavy_rounds: int = 6,
             on_bad_row: str = "error",
             repeat: bool = False,
             deterministic: bool | None = None,
             drop_remainder: bool = False) -> tf.data.Dataset:
  """Builds the level-`level` preprocessing pipeline over Criteo text files.

  Args:
    level: 1..5, see the module docstring and `STAGES`.
    files: File names or glob patterns (any layout `reader.read` takes).
    batch_size: Rows per batch (default 4096).
    parallelism: Stage name -> fixed parallelism (the prefetch buffer for
      "prefetch") replacing AUTOTUNE, for fixed configurations (default None:
      all AUTOTUNE); names from `TUNABLE_STAGES` present at this level.
    shuffle_buffer: Rows in the shuffle buffer, levels >= 2 (default 16,384).
    seed: Shuffle and noise seed (default None: random).
    num_buckets: Hash buckets per categorical feature (default 2**20).
    vocab_size: Dictionary entries per feature at level >= 4 (default 1000).
    noise_std: Standard deviation of the dense noise (default 0.05).
    heavy_rounds: Hashing rounds of level 5 (default 6).
    on_bad_row: "error" (default) or "skip", as in `reader.read`; the skip
      counter is the returned dataset's `bad_rows` (levels >= 3).
    repeat: Cycle over the files forever (default False: one epoch).
    deterministic: Order guarantee of the parallel stages (default None: the
      `tf.data.Options` default).
    drop_remainder: Drop a last short batch (default False).

  Returns:
    The dataset; its attribute `stages` is `STAGES[level]`.
  """
  if level not in STAGES:
    raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
  par = _stage_parallelism(parallelism, level)
  specs = reader.file_specs(files)
  cpus = os.cpu_count() or 1
  read_par = par["read"]
  cycle = min(len(specs), max(cpus, read_par))
  ds = reader.lines_dataset(specs, cycle_length=cycle,
                            num_parallel_calls=read_par,
                            deterministic=deterministic, repeat=repeat)
  if level >= 2:
    ds = ds.shuffle(shuffle_buffer, seed=seed)
  ds = ds.batch(batch_size, drop_remainder=drop_remainder,
                num_parallel_calls=par["batch"], deterministic=deterministic)
  bad_rows = None
  if level >= 3:
    decode = reader.Parser(specs, on_bad_row)
    bad_rows = decode.bad_rows
    ds = ds.map(_Parse(decode, num_buckets), num_parallel_calls=par["parse"],
                deterministic=deterministic)
  if level >= 4:
    table = vocabulary_table(num_buckets, vocab_size)
    ds = ds.map(_Features(table, num_buckets, noise_std, seed),
                num_parallel_calls=par["features"],
                deterministic=deterministic)
  if level >= 5:
    ds = ds.map(_Heavy(heavy_rounds, num_buckets),
                num_parallel_calls=par["heavy"], deterministic=deterministic)
  ds = ds.prefetch(par["prefetch"])
  ds.stages = STAGES[level]
  ds.bad_rows = bad_rows
  return ds


def examples_pipeline(level: int,
                      files: str | Iterable[str],
                      *,
                      batch_size: int = 4096,
                      shuffle_buffer: int = 16_384,
                      seed: int | None = None,
                      num_buckets: int = 1 << 20,
                      vocab_size: int = 1000,
                      noise_std: float = 0.05,
                      heavy_rounds: int = 6,
                      cache_records: bool = False) -> tf.data.Dataset:
  """The level-`level` stages of `pipeline` over TFRecord files of
  `tf.train.Example` rows (as `convert.convert_files` writes them), in the
  shape of TensorFlow's performance guide:

  `interleave(TFRecordDataset) -> shuffle -> batch -> map(parse) ->
  map(features) -> map(heavy) -> prefetch`, every parallel stage on
  AUTOTUNE, where `parse` is `convert.parse_examples` (a `tf.io.parse_example`
  of the batch) followed by the same transforms as `pipeline`'s.

  Args:
    level: 1..5, as `pipeline` (`STAGES`).
    files: TFRecord file names or glob patterns.
    batch_size: Rows per batch (default 4096).
    shuffle_buffer: Rows in the shuffle buffer, levels >= 2 (default 16,384).
    seed: Shuffle and noise seed (default None: random).
    num_buckets: Hash buckets per categorical feature (default 2**20).
    vocab_size: Dictionary entries per feature at level >= 4 (default 1000).
    noise_std: Standard deviation of the dense noise (default 0.05).
    heavy_rounds: Hashing rounds of level 5 (default 6).
    cache_records: A `.cache()` right after the read, where a user would put
      one by hand (default False).

  Returns:
    The dataset; its attribute `stages` is `STAGES[level]`.
  """
  if level not in STAGES:
    raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
  paths = reader.expand_patterns(files)
  auto = tf.data.AUTOTUNE
  cycle = min(len(paths), os.cpu_count() or 1)
  ds = tf.data.Dataset.from_tensor_slices(paths).interleave(
      tf.data.TFRecordDataset, cycle_length=cycle, num_parallel_calls=auto)
  if cache_records:
    ds = ds.cache()
  if level >= 2:
    ds = ds.shuffle(shuffle_buffer, seed=seed)
  ds = ds.batch(batch_size, num_parallel_calls=auto)
  if level >= 3:
    ds = ds.map(_Parse(convert.parse_examples, num_buckets),
                num_parallel_calls=auto)
  if level >= 4:
    ds = ds.map(_Features(vocabulary_table(num_buckets, vocab_size),
                          num_buckets, noise_std, seed),
                num_parallel_calls=auto)
  if level >= 5:
    ds = ds.map(_Heavy(heavy_rounds, num_buckets), num_parallel_calls=auto)
  ds = ds.prefetch(auto)
  ds.stages = STAGES[level]
  return ds


def sharded_pipeline(files: str | Iterable[str],
                     *,
                     batch_size: int = 4096,
                     cycle_length: int | None = None,
                     num_buckets: int = 1 << 20,
                     repeat: bool = False,
                     deterministic: bool | None = None) -> tf.data.Dataset:
  """The shape of the TF Model Garden DLRM reader: shards interleaved, each
  shard's rows batched and parsed INSIDE the interleave's function.

  `interleave(lambda shard: lines(shard).batch(B).map(parse, AUTOTUNE),
  cycle_length, AUTOTUNE).prefetch(AUTOTUNE)`: the parse map runs once per
  open shard, so its parallelism is a knob of the inner pipeline (one knob
  shared by every instance, as TF's AUTOTUNE tunes it).

  Args:
    files: File names or glob patterns (any layout `reader.read` takes).
    batch_size: Rows per batch (default 4096).
    cycle_length: Shards read at once (default None: the CPU count, at most
      the number of files).
    num_buckets: Hash buckets per categorical feature (default 2**20).
    repeat: Cycle over the files forever (default False: one epoch).
    deterministic: Order guarantee of the parallel stages (default None: the
      `tf.data.Options` default).

  Returns:
    The dataset of parsed batches.
  """
  specs = reader.file_specs(files)
  parse = _Parse(reader.Parser(specs, "error"), num_buckets)
  cycle = max(1, min(cycle_length or os.cpu_count() or 1, len(specs)))

  check = reader.any_gzip(specs)

  def shard(*file):
    return reader.file_lines(*file, check=check).batch(batch_size).map(
        parse, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic)

  ds = reader.files_dataset(specs, repeat=repeat).interleave(
      shard, cycle_length=cycle, num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=deterministic)
  return ds.prefetch(tf.data.AUTOTUNE)
