"""Converts Criteo text files to TFRecord or Parquet, and reads those back.

Both readers yield exactly what `reader.read` yields, `({"dense": float32
[B, 13], "sparse": int64 [B, 26]}, label float32 [B])`, so every pipeline
and model takes any of the three formats. Values are stored as the text
reader decodes them (missing dense = 0.0, missing categorical = -1,
unlabelled = -1.0, see `schema`).

Use `convert_files` (or `intune criteo convert`). It writes into a new or
empty folder only, and into a hidden sibling folder first, renamed to the
output folder once every row is written: a failed conversion leaves no
output that looks complete.

* TFRecord: one `tf.train.Example` per row with features `label` (float, 1),
  `dense` (float, 13) and `sparse` (int64, 26) -- the common production
  layout. Files `part-00000.tfrecord[.gz]`.
* Parquet: columns `label` (float32), `I1..I13` (float32), `C1..C26` (int64).
  Written with pyarrow and read with `tensorflow_io.IODataset.from_parquet`,
  so it works on the compat stack (TF 2.16, tensorflow-io 0.37) only;
  elsewhere it fails with a `ParquetUnavailableError` saying so.
  `tensorflow_io` is imported on first Parquet use, never at import time.
"""

from __future__ import annotations

import numbers
import os
import pathlib
import secrets
import shutil
from typing import Any, Callable, Iterable

import numpy as np
import tensorflow as tf

from intune_tf.criteo import reader
from intune_tf.criteo import schema

FORMATS = ("tfrecord", "parquet")
_CONVERT_BATCH = 8192


class ParquetUnavailableError(RuntimeError):
  """Parquet support (tensorflow-io / pyarrow) does not load here."""


class OutputDirError(ValueError):
  """The output folder is not a new or empty folder."""


def _check_out_dir(out: pathlib.Path) -> None:
  """Raises OutputDirError unless `out` is missing or an empty folder."""
  if not out.exists():
    return
  if not out.is_dir():
    raise OutputDirError(f"output folder {out} is a file, not a folder. Pass "
                         "a new or empty folder.")
  found = sorted(p.name for p in out.iterdir())
  if found:
    shown = ", ".join(found[:5]) + (
        f" and {len(found) - 5} more" if len(found) > 5 else "")
    raise OutputDirError(
        f"output folder {out} is not empty: it holds {shown}. Pass an empty "
        "or new folder: converting into this one would mix its files with "
        "the new parts.")


def _publish(tmp: pathlib.Path, out: pathlib.Path) -> None:
  """Moves the finished `tmp` folder to `out` (missing or empty)."""
  try:
    os.rename(tmp, out)  # Atomic; replaces an empty folder.
    return
  except OSError:
    if not out.is_dir():
      raise
  # `out` is an empty mount point (or on another device): move each file.
  for part in sorted(tmp.iterdir()):
    os.replace(part, out / part.name)
  tmp.rmdir()


def _tfio():
  """Imports tensorflow_io, or explains why Parquet is unavailable."""
  try:
    # Deferred: compat stack only (tensorflow-io); the error says so.
    import tensorflow_io  # noqa: PLC0415
    return tensorflow_io
  except Exception as e:  # ImportError, or its op library failing to load.
    raise ParquetUnavailableError(
        "Parquet needs tensorflow-io, which does not load here "
        f"(TensorFlow {tf.__version__}: {type(e).__name__}: {e}). "
        "tensorflow-io 0.37 is built for TF 2.16: use the compat stack "
        "(.venv-compat), or convert to TFRecord instead.") from e


def _pyarrow():
  try:
    # Deferred: only for Parquet input.
    import pyarrow  # noqa: PLC0415

    # Deferred: only for Parquet input.
    import pyarrow.parquet  # noqa: PLC0415
    return pyarrow
  except Exception as e:
    raise ParquetUnavailableError(
        f"writing Parquet needs pyarrow, which does not load here ({e}); "
        "use the compat stack (.venv-compat), where tfx brings it") from e


def _examples(features: dict[str, np.ndarray],
              label: np.ndarray) -> Iterable[bytes]:
  dense, sparse = features["dense"], features["sparse"]
  for i in range(label.shape[0]):
    yield tf.train.Example(features=tf.train.Features(feature={
        "label": tf.train.Feature(
            float_list=tf.train.FloatList(value=[label[i]])),
        "dense": tf.train.Feature(
            float_list=tf.train.FloatList(value=dense[i])),
        "sparse": tf.train.Feature(
            int64_list=tf.train.Int64List(value=sparse[i])),
    })).SerializeToString()


class _Sink:
  """Writes batches into numbered files of at most `rows_per_file` rows."""

  def __init__(self, out_dir: pathlib.Path, fmt: str, rows_per_file: int,
               compress: bool):
    self.out_dir, self.fmt = out_dir, fmt
    self.rows_per_file, self.compress = rows_per_file, compress
    self.paths: list[str] = []
    self._writer: Any = None
    self._rows = 0

  def _open(self) -> None:
    i = len(self.paths)
    if self.fmt == "tfrecord":
      name = f"part-{i:05d}.tfrecord{'.gz' if self.compress else ''}"
      path = self.out_dir / name
      self._writer = tf.io.TFRecordWriter(
          str(path), options="GZIP" if self.compress else None)
    else:
      path = self.out_dir / f"part-{i:05d}.parquet"
      pa = _pyarrow()
      self._writer = pa.parquet.ParquetWriter(
          str(path), _arrow_schema(pa),
          compression="snappy" if self.compress else "none")
    self.paths.append(str(path))
    self._rows = 0

  def write(self, features: dict[str, np.ndarray], label: np.ndarray) -> None:
    start = 0
    while start < label.shape[0]:
      if self._writer is None or self._rows >= self.rows_per_file:
        self.close()
        self._open()
      n = min(self.rows_per_file - self._rows, label.shape[0] - start)
      part = {k: v[start:start + n] for k, v in features.items()}
      if self.fmt == "tfrecord":
        for record in _examples(part, label[start:start + n]):
          self._writer.write(record)
      else:
        self._writer.write_table(_arrow_table(part, label[start:start + n]))
      self._rows += n
      start += n

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None


def _arrow_schema(pa):
  fields = [pa.field("label", pa.float32())]
  fields += [pa.field(n, pa.float32()) for n in schema.DENSE_NAMES]
  fields += [pa.field(n, pa.int64()) for n in schema.SPARSE_NAMES]
  return pa.schema(fields)


def _arrow_table(features, label):
  pa = _pyarrow()
  columns = [pa.array(label.astype(np.float32))]
  columns += [pa.array(features["dense"][:, j].astype(np.float32))
              for j in range(schema.NUM_DENSE)]
  columns += [pa.array(features["sparse"][:, j].astype(np.int64))
              for j in range(schema.NUM_SPARSE)]
  return pa.Table.from_arrays(columns, schema=_arrow_schema(pa))


def convert_files(inputs: str | Iterable[str],
            out_dir: str | os.PathLike,
            fmt: str = "tfrecord",
            *,
            rows_per_file: int = 1_000_000,
            compress: bool = False,
            on_bad_row: str = "error",
            progress: Callable[[int], Any] | None = None) -> list[str]:
  """Converts Criteo text files (any layout `reader.read` takes).

  The parts are written into a hidden sibling folder of `out_dir`, which is
  renamed to `out_dir` once every row is written; on failure it is removed
  and `out_dir` is left as it was.

  Args:
    inputs: File names or glob patterns.
    out_dir: Output directory: a new or empty one, created if needed.
    fmt: "tfrecord" (default) or "parquet" (compat stack only).
    rows_per_file: Rows per output file, positive (default 1,000,000).
    compress: GZIP TFRecords / snappy Parquet (default False).
    on_bad_row: As in `reader.read` (default "error").
    progress: Called with the rows of each converted batch (default None).

  Returns:
    The written file paths.

  Raises:
    ParquetUnavailableError: Parquet asked for where it cannot work.
    OutputDirError: `out_dir` is a file or a folder that is not empty.
    ValueError: `fmt` or `rows_per_file` is invalid.
  """
  if fmt not in FORMATS:
    raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
  if fmt == "parquet":
    _tfio()  # Written files must be readable here too.
    _pyarrow()
  if (isinstance(rows_per_file, bool) or
      not isinstance(rows_per_file, numbers.Integral) or rows_per_file <= 0):
    raise ValueError(f"rows_per_file must be a positive int, got "
                     f"{rows_per_file!r}.")
  given = pathlib.Path(out_dir)
  out = given.resolve()
  _check_out_dir(out)
  batches = reader.read(inputs, batch_size=_CONVERT_BATCH,
                        on_bad_row=on_bad_row)  # Checks the inputs first.
  out.parent.mkdir(parents=True, exist_ok=True)
  # mkdir, not tempfile.mkdtemp: the folder gets the umask's mode, not 0700.
  tmp = out.parent / f".{out.name}.partial-{secrets.token_hex(4)}"
  tmp.mkdir()
  sink = _Sink(tmp, fmt, rows_per_file, compress)
  try:
    try:
      for features, label in batches:
        arrays = {k: v.numpy() for k, v in features.items()}
        sink.write(arrays, label.numpy())
        if progress is not None:
          progress(int(label.shape[0]))
    finally:
      sink.close()
    _check_out_dir(out)  # Nothing else wrote there meanwhile.
    _publish(tmp, out)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return [str(given / pathlib.Path(p).name) for p in sink.paths]


_EXAMPLE_SPEC = {
    "label": tf.io.FixedLenFeature([], tf.float32),
    "dense": tf.io.FixedLenFeature([schema.NUM_DENSE], tf.float32),
    "sparse": tf.io.FixedLenFeature([schema.NUM_SPARSE], tf.int64),
}


def parse_examples(serialized: tf.Tensor):
  """A batch of serialized rows as `convert_files` writes them (a string
  vector) -> `({"dense", "sparse"}, label)`, as `reader.read` yields them."""
  parsed = tf.io.parse_example(serialized, _EXAMPLE_SPEC)
  return {"dense": parsed["dense"], "sparse": parsed["sparse"]}, parsed["label"]


def read_tfrecord(patterns: str | Iterable[str],
                  *,
                  batch_size: int,
                  compression: str | None = None,
                  num_parallel_reads: int = 1,
                  drop_remainder: bool = False) -> tf.data.Dataset:
  """Reads TFRecord files written by `convert_files`.

  Args:
    patterns: File names or glob patterns.
    batch_size: Rows per batch.
    compression: None (default: "GZIP" for names ending in .gz, else none),
      "", or "GZIP".
    num_parallel_reads: Files read at once (default 1: in order).
    drop_remainder: Drop a last short batch (default False).

  Returns:
    Batches of `(features, label)` as `reader.read` yields them.
  """
  paths = reader.expand_patterns(patterns)
  if compression is None:
    kinds = {p.endswith(".gz") for p in paths}
    if len(kinds) > 1:
      raise ValueError("mixed compressed and plain TFRecords: pass compression")
    compression = "GZIP" if kinds.pop() else ""
  ds = tf.data.TFRecordDataset(paths, compression_type=compression,
                               num_parallel_reads=(num_parallel_reads
                                                   if num_parallel_reads != 1
                                                   else None))
  ds = ds.batch(batch_size, drop_remainder=drop_remainder)
  ds = ds.map(parse_examples, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.prefetch(tf.data.AUTOTUNE)


def _stack_columns(row: dict[str, tf.Tensor]):
  dense = tf.stack([tf.cast(row[n], tf.float32) for n in schema.DENSE_NAMES],
                   axis=-1)
  sparse = tf.stack([tf.cast(row[n], tf.int64) for n in schema.SPARSE_NAMES],
                    axis=-1)
  return {"dense": dense, "sparse": sparse}, tf.cast(row["label"], tf.float32)


def read_parquet(patterns: str | Iterable[str],
                 *,
                 batch_size: int,
                 drop_remainder: bool = False) -> tf.data.Dataset:
  """Reads Parquet files written by `convert_files` (compat stack only).

  Args:
    patterns: File names or glob patterns.
    batch_size: Rows per batch.
    drop_remainder: Drop a last short batch (default False).

  Returns:
    Batches of `(features, label)` as `reader.read` yields them.

  Raises:
    ParquetUnavailableError: tensorflow-io does not load here.
  """
  tfio = _tfio()
  paths = reader.expand_patterns(patterns)
  columns = ["label", *schema.DENSE_NAMES, *schema.SPARSE_NAMES]
  ds = None
  for path in paths:
    part = tfio.IODataset.from_parquet(path, columns=columns)
    part = part.map(lambda row: {k.decode() if isinstance(k, bytes) else k: v
                                 for k, v in row.items()})
    ds = part if ds is None else ds.concatenate(part)
  ds = ds.batch(batch_size, drop_remainder=drop_remainder)
  ds = ds.map(_stack_columns, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.prefetch(tf.data.AUTOTUNE)
