"""Reads Criteo click logs as found in the wild into a `tf.data.Dataset`.

    ds = intune_tf.criteo.read("day_*.gz", batch_size=4096)
    for features, label in ds:  # dense f32 [B,13], sparse i64 [B,26], f32 [B]
      ...

Each file is sniffed in Python first (its first 64 KiB): gzip is detected by
its magic bytes whatever the file is called, the layout from the first lines
(`schema.LAYOUTS`): the dac / 1TB TSV layout (40 fields), the unlabelled test
TSV layout (39 fields), the Kaggle CSV with an `Id,Label,I1..C26` header, and
the Kaggle test CSV (`Id,I1..C26`). A file that is empty, an unreadable gzip,
or not Criteo data at all (an HTML error page saved as `train.txt`) fails
there with a `CriteoFormatError` naming it. Rows themselves are parsed by TF
ops only, a batch at a time: CRLF endings, a missing final newline and
stripped trailing empty fields (37-39 of the 40 fields) are all accepted.

Bad rows (a wrong field count, a label other than 0/1, a non-integer in
I1..I13, a categorical that is not 1-8 hexadecimal digits):

* `on_bad_row="error"` (default): iterating fails with
  `tf.errors.InvalidArgumentError` whose message contains
  `Criteo bad row: <file>:<line>: <what was wrong>`.
* `on_bad_row="skip"`: the row is dropped and counted in an int64
  `tf.Variable`, readable as `ds.bad_rows.numpy()` on the returned dataset (or
  pass your own variable as `bad_rows=`).

Missing values and unlabelled rows read as documented in `schema`. A UTF-8
byte order mark at the start of a file (as Excel writes) is stripped.

Bytes after the end of a gzip file's data that are not gzip data (something
appended to the file) are left, as `gzip -d` does: the rows before them are
read, with one warning naming the file and the byte they start at. Those
files are read through Python's `zlib` (`inflate`) rather than TensorFlow's
reader, which fails on such bytes.

A gzip file damaged beyond the sniff (cut short, a corrupt byte) is an
error in both `on_bad_row` modes,
raised before any of its rows: iterating fails with
`tf.errors.InvalidArgumentError` whose message contains `Criteo damaged gzip:
<file> (<size> bytes): <what is wrong>` and what to do. TensorFlow's own
reader ends a cut gzip file early without an error, and fails on the other
damage with a `DataLossError` that does not name the file, so the pipeline
reads each gzip file through once with Python's `zlib` when it opens it
(`check_gzip`); an intact file is not checked again in the same process.

Limit: that check is one more decompression of each gzip file (a small part
of what parsing its rows costs, but with one file read at a time the
pipeline waits for it at each new file), and it calls Python
(`tf.py_function`), so a pipeline that reads gzip files does not run on a
remote tf.data service worker (one without gzip files has no such call).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
from typing import BinaryIO, Iterable, Iterator, Sequence
import zlib

from absl import logging
import numpy as np
import tensorflow as tf

from intune_tf.criteo import schema

_SNIFF_BYTES = 1 << 16
_SNIFF_LINES = 20
_GLOB_CHARS = re.compile(r"[*?\[]")
_HEX8 = re.compile(r"[0-9a-fA-F]{8}")
_INT = re.compile(r"-?[0-9]+")
_LAYOUT_CODE = {name: i for i, name in enumerate(schema.LAYOUTS)}
_BAD_ROW_MODES = ("error", "skip")
# Compressed bytes read, and most bytes decompressed, at a time by `check_gzip`.
_CHECK_CHUNK = 1 << 20
# Gzip files found readable by `check_gzip`, by (path, size, modification
# time): -1, or where the bytes after their gzip data start.
_intact_gzip: dict[tuple[str, int, int], int] = {}
_intact_gzip_lock = threading.Lock()
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = "\ufeff"
_BOM_BYTES = _BOM.encode()


class CriteoFormatError(ValueError):
  """A file that cannot be read as Criteo data; the message names the file."""


@dataclasses.dataclass(frozen=True)
class FileSpec:
  """How to read one file.

  Attributes:
    path: The file name, any filesystem `tf.io.gfile` knows.
    layout: One of `schema.LAYOUTS`.
    compression: `"GZIP"` or `""` (as `tf.data.TextLineDataset` takes it).
    header_lines: Lines to skip before the first row (1 for the CSV layouts).
    bom: The file starts with a UTF-8 byte order mark, which the parser
      strips (default False).
  """
  path: str
  layout: str
  compression: str = ""
  header_lines: int = 0
  bom: bool = False


def expand_patterns(patterns: str | Iterable[str]) -> list[str]:
  """Expands file names and glob patterns, in the order given.

  Args:
    patterns: A file name or glob pattern, or a sequence of them. Each glob is
      expanded with `tf.io.gfile.glob` and sorted; a plain name is kept as is.

  Returns:
    The file names.

  Raises:
    FileNotFoundError: A pattern matches nothing or a plain name is missing.
  """
  if isinstance(patterns, (str, bytes)):
    patterns = [patterns]
  files: list[str] = []
  for pattern in patterns:
    pattern = pattern.decode() if isinstance(pattern, bytes) else str(pattern)
    if _GLOB_CHARS.search(pattern):
      matched = sorted(tf.io.gfile.glob(pattern))
      if not matched:
        raise FileNotFoundError(f"{pattern}: no file matches this pattern")
      files.extend(matched)
    else:
      if not tf.io.gfile.exists(pattern):
        raise FileNotFoundError(f"{pattern}: no such file")
      files.append(pattern)
  if not files:
    raise FileNotFoundError("no input files given")
  return files


@dataclasses.dataclass
class GzipScan:
  """What `inflate` found in a gzip file.

  Attributes:
    members: Complete gzip members read.
    trailing_at: None, or the offset of bytes after the last complete
      member that are not a gzip member (something appended to the file),
      which `inflate` leaves, as `gzip -d` does.
    problem: "" or what is wrong (corrupt or cut-short data).
  """
  members: int = 0
  trailing_at: int | None = None
  problem: str = ""


def inflate(f: BinaryIO, scan: GzipScan,
            chunk: int = _CHECK_CHUNK) -> Iterator[bytes]:
  """The decompressed bytes of the gzip members in `f`, as `gzip -d` reads
  them: members one after the other (`cat a.gz b.gz`), and bytes after the
  last complete member that do not start like one are left
  (`scan.trailing_at`).

  Args:
    f: The compressed file, open for binary reading.
    scan: Filled in as the file is read; check `scan.problem` once the
      iteration ends (it ends at the first problem).
    chunk: Compressed bytes read, and most bytes decompressed, at a time
      (default 1 MiB).

  Yields:
    Decompressed bytes, at most `chunk` at a time.
  """
  data, pos, end_of_file = b"", 0, False  # `data` starts at offset `pos`
  member = None
  while True:
    if member is None:
      if len(data) < len(_GZIP_MAGIC) and not end_of_file:
        more = f.read(chunk)
        end_of_file = not more
        data += more
        continue
      if not data:
        return
      if scan.members and not data.startswith(_GZIP_MAGIC):
        scan.trailing_at = pos
        return
      member = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif not data and not end_of_file:
      data = f.read(chunk)
      end_of_file = not data
      continue
    try:
      # At the end of the file (no data), what zlib still holds.
      out = member.decompress(data, chunk)
    except zlib.error as e:
      scan.problem = (f"corrupt compressed data, found reading bytes "
                      f"{pos}..{pos + len(data)} ({e})")
      return
    rest = member.unused_data if member.eof else member.unconsumed_tail
    pos += len(data) - len(rest)
    data = rest
    if out:
      yield out
    if member.eof:
      scan.members += 1
      member = None
    elif not out and not data and end_of_file:
      scan.problem = ("the gzip data ends before its end marker: the file "
                      "was cut short (an interrupted download or copy)")
      return


def _read_head(path: str) -> tuple[bytes, str, bool]:
  """Returns (first bytes, compression, whole file read) of `path`."""
  with tf.io.gfile.GFile(path, "rb") as f:
    magic = f.read(2)
  if magic != _GZIP_MAGIC:
    with tf.io.gfile.GFile(path, "rb") as f:
      data = f.read(_SNIFF_BYTES + 1)
    return data[:_SNIFF_BYTES], "", len(data) <= _SNIFF_BYTES
  scan, head = GzipScan(), bytearray()
  with tf.io.gfile.GFile(path, "rb") as f:
    for out in inflate(f, scan, chunk=_SNIFF_BYTES + 1):
      head += out
      if len(head) > _SNIFF_BYTES:
        break
  if scan.problem and len(head) <= _SNIFF_BYTES:
    raise CriteoFormatError(
        f"{path}: unreadable gzip data (starts like gzip but cannot be "
        f"decompressed: {scan.problem})")
  return bytes(head[:_SNIFF_BYTES]), "GZIP", len(head) <= _SNIFF_BYTES


def _fits(fields: Sequence[str], labelled: bool) -> bool:
  """Whether one tab-split line is a plausible row of the given layout."""
  full = schema.NUM_FIELDS if labelled else schema.NUM_TEST_FIELDS
  if not full - (schema.NUM_FIELDS - schema.MIN_FIELDS) <= len(fields) <= full:
    return False
  fields = list(fields) + [""] * (full - len(fields))
  if labelled:
    if fields[0] not in ("0", "1"):
      return False
    fields = fields[1:]
  dense, sparse = fields[:schema.NUM_DENSE], fields[schema.NUM_DENSE:]
  return (all(not v or _INT.fullmatch(v) for v in dense)
          and all(not v or _HEX8.fullmatch(v) for v in sparse))


def _tsv_layout(lines: Sequence[str]) -> str | None:
  """The layout most of the sniffed lines fit, or None if none fits."""
  split = [l.split("\t") for l in lines]
  labelled = sum(_fits(f, True) for f in split)
  test = sum(_fits(f, False) for f in split)
  if labelled == test == 0:
    return None
  if labelled != test:
    return schema.LAYOUT_TSV if labelled > test else schema.LAYOUT_TSV_TEST
  full = sum(len(f) == schema.NUM_FIELDS for f in split)
  return schema.LAYOUT_TSV if full else schema.LAYOUT_TSV_TEST


def sniff(path: str) -> FileSpec:
  """Finds the compression and layout of one file from its first lines.

  Args:
    path: The file.

  Returns:
    Its `FileSpec`.

  Raises:
    FileNotFoundError: The file does not exist.
    CriteoFormatError: The file is empty, an unreadable gzip, or not Criteo
      data (e.g. an HTML page); the message names the file and says why.
  """
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"{path}: no such file")
  head, compression, whole = _read_head(path)
  what = "gzip-compressed file" if compression else "file"
  if not head.strip():
    raise CriteoFormatError(f"{path}: the {what} is empty: no Criteo rows")
  text = head.decode("utf-8", errors="replace")
  bom = text.startswith(_BOM)  # a UTF-8 byte order mark, as Excel writes
  if bom:
    text = text[len(_BOM):]
  lines = text.split("\n")
  if not whole and len(lines) > 1:
    lines = lines[:-1]  # The last line may be cut by the sniff window.
  lines = [l.rstrip("\r") for l in lines if l.strip()][:_SNIFF_LINES]
  first = lines[0]
  start = first.lstrip().lower()
  if start.startswith("<") or "<html" in start or "<!doctype" in start:
    raise CriteoFormatError(
        f"{path}: not Criteo data: line 1 looks like an HTML page "
        f"({first.strip()[:60]!r}), e.g. an error page saved under a data "
        "name; expected tab-separated `label, I1..I13, C1..C26` rows")
  if start.startswith("id,"):
    header = [h.strip().lower() for h in first.split(",")]
    if header[1:2] == ["label"] and len(header) == schema.NUM_FIELDS + 1:
      return FileSpec(path, schema.LAYOUT_CSV, compression, 1, bom)
    if header[1:2] == ["i1"] and len(header) == schema.NUM_FIELDS:
      return FileSpec(path, schema.LAYOUT_CSV_TEST, compression, 1, bom)
    raise CriteoFormatError(
        f"{path}: not Criteo data: line 1 is a CSV header with "
        f"{len(header)} columns, expected `Id,Label,I1..I13,C1..C26` (41) or "
        "`Id,I1..I13,C1..C26` (40)")
  layout = _tsv_layout(lines)
  if layout is None:
    n = len(first.split("\t"))
    raise CriteoFormatError(
        f"{path}: not Criteo data: line 1 has {n} tab-separated field(s) "
        f"({first[:60]!r}), expected {schema.NUM_FIELDS} (label, I1..I13, "
        f"C1..C26) or {schema.NUM_TEST_FIELDS} (unlabelled test layout), and "
        f"none of the first {len(lines)} line(s) reads as a Criteo row")
  return FileSpec(path, layout, compression, 0, bom)


def file_specs(patterns: str | Iterable[str],
               layout: str | None = None) -> list[FileSpec]:
  """Expands `patterns` and sniffs every file.

  Args:
    patterns: File names or glob patterns (see `expand_patterns`).
    layout: None (default) to detect the layout of each file, or one of
      `schema.LAYOUTS` to impose it (compression is still detected).

  Returns:
    One `FileSpec` per file, in order.
  """
  if layout is not None and layout not in schema.LAYOUTS:
    raise ValueError(f"layout must be one of {schema.LAYOUTS}, got {layout!r}")
  specs = []
  for path in expand_patterns(patterns):
    spec = sniff(path)
    if layout is not None:
      header = 1 if layout in (schema.LAYOUT_CSV, schema.LAYOUT_CSV_TEST) else 0
      spec = dataclasses.replace(spec, layout=layout, header_lines=header)
    specs.append(spec)
  return specs


def lines_dataset(specs: Sequence[FileSpec],
                  *,
                  cycle_length: int = 1,
                  num_parallel_calls: int | None = None,
                  deterministic: bool | None = None,
                  repeat: bool = False) -> tf.data.Dataset:
  """The read stage: one element per row line, interleaved over files.

  Args:
    specs: The files (from `file_specs`).
    cycle_length: Files read at once (default 1: one after the other, rows in
      file order). Capped at the number of files.
    num_parallel_calls: The interleave's parallelism (default None:
      sequential); `tf.data.AUTOTUNE` lets the tuner choose. Capped at
      `cycle_length`.
    deterministic: Passed to `interleave` (default None: the options').
    repeat: Read the files over and over (default False: once).

  Returns:
    Elements `{"line": string, "file": int32 index into specs,
    "line_number": int64, 1-based in the file}`.
  """
  specs = list(specs)
  cycle = max(1, min(int(cycle_length), len(specs)))
  calls = num_parallel_calls
  if calls is not None and calls != tf.data.AUTOTUNE:
    calls = max(1, min(int(calls), cycle))
  return files_dataset(specs, repeat=repeat).interleave(
      functools.partial(file_lines, check=any_gzip(specs)),
      cycle_length=cycle, block_length=1,
      num_parallel_calls=calls, deterministic=deterministic)


def files_dataset(specs: Sequence[FileSpec], *,
                  repeat: bool = False) -> tf.data.Dataset:
  """One element per file, `(index, path, compression, header lines)`, the
  arguments of `file_lines`; over and over with `repeat` (default False)."""
  specs = list(specs)
  files = tf.data.Dataset.from_tensor_slices((
      tf.range(len(specs), dtype=tf.int32),
      tf.constant([s.path for s in specs], tf.string),
      tf.constant([s.compression for s in specs], tf.string),
      tf.constant([s.header_lines for s in specs], tf.int64)))
  return files.repeat() if repeat else files


def _damaged(path: str, size: int, what: str) -> str:
  return (f"Criteo damaged gzip: {path} ({size} bytes): {what}. None of its "
          "rows were read. Copy or download the file again (`gzip -t FILE` "
          "checks a copy), or leave it out of the inputs")


def check_gzip(path: str) -> str:
  """Reads a whole gzip file through `zlib` to find damage that TensorFlow's
  reader would miss or not name.

  TensorFlow's gzip reader ends a file cut short without an error, and fails
  with an unnamed `DataLossError` on a corrupt byte or on bytes after the
  gzip data. Files of several gzip members (`cat a.gz b.gz`) are intact.
  Bytes after the gzip data that are not a gzip member (something appended
  to the file) are left, as `gzip -d` does: the file is readable, with one
  warning naming it and where those bytes start (`gzip_data_end`). A file
  found readable is remembered by its path, size and modification time and
  not read again.

  Args:
    path: The file, any filesystem `tf.io.gfile` knows.

  Returns:
    "" when the file is readable (or cannot be opened: the reader then
    names it); else a message `Criteo damaged gzip: <path> (<size> bytes):
    <what is wrong>` that says what to do.
  """
  return _check(path)[0]


def gzip_data_end(path: str) -> int:
  """Where the bytes after a gzip file's data start (-1: none; see
  `check_gzip`, whose reading of the file it shares)."""
  return _check(path)[1]


def _check(path: str) -> tuple[str, int]:
  """(`check_gzip`'s message, `gzip_data_end`) of `path`."""
  try:
    stat = tf.io.gfile.stat(path)
  except tf.errors.OpError:
    return "", -1
  key = (path, stat.length, stat.mtime_nsec)
  with _intact_gzip_lock:
    if key in _intact_gzip:
      return "", _intact_gzip[key]
  scan = GzipScan()
  with tf.io.gfile.GFile(path, "rb") as f:
    for _ in inflate(f, scan):
      pass  # output discarded
  if scan.problem:
    return _damaged(path, stat.length, scan.problem), -1
  end = -1 if scan.trailing_at is None else scan.trailing_at
  with _intact_gzip_lock:
    told = any(k[0] == path for k in _intact_gzip)
    _intact_gzip[key] = end
  if end >= 0 and not told:
    logging.warning(
        "Criteo gzip %s (%d bytes): the %d bytes from byte %d on, after the "
        "end of its gzip data, are not gzip data (something was appended to "
        "the file); they are left, as `gzip -d` does, and the rows before "
        "them are read. Reported once per file.", path, stat.length,
        stat.length - end, end)
  return "", end


def _check_gzip_op(path: tf.Tensor,
                   compression: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """(`check_gzip`, `gzip_data_end`) of a GZIP file (("", -1) for others),
  for `tf.py_function`."""
  if compression.numpy() != b"GZIP":
    return tf.constant(""), tf.constant(-1, tf.int64)
  problem, end = _check(path.numpy().decode())
  return tf.constant(problem), tf.constant(end, tf.int64)


def _lines_before(path: bytes, end: int) -> Iterator[np.ndarray]:
  """The lines of the gzip data of a file whose data ends at `end` (bytes
  after it were appended), as `tf.data.TextLineDataset` splits them, a
  vector of lines at a time; nothing when `end` < 0."""
  if end < 0:
    return
  scan, rest = GzipScan(), b""
  with tf.io.gfile.GFile(path.decode(), "rb") as f:
    for out in inflate(f, scan):
      lines = (rest + out).split(b"\n")
      rest = lines.pop()
      if lines:
        yield np.array(lines, dtype=object)
  if scan.problem:  # changed since `check_gzip` read it
    name = path.decode()
    raise ValueError(_damaged(name, tf.io.gfile.stat(name).length,
                              scan.problem))
  if rest:
    yield np.array([rest], dtype=object)


def any_gzip(specs: Sequence[FileSpec]) -> bool:
  """Whether any of the files is gzip-compressed (`file_lines`' `check`)."""
  return any(s.compression == "GZIP" for s in specs)


def file_lines(index: tf.Tensor, path: tf.Tensor, compression: tf.Tensor,
               header_lines: tf.Tensor, *,
               check: bool = True) -> tf.data.Dataset:
  """The rows of one file, as `lines_dataset` gives them.

  With `check` (default True), a damaged gzip file fails when it is opened,
  before its first row (see `check_gzip`), with
  `tf.errors.InvalidArgumentError`. `check=False` leaves the Python call out
  of the graph: for inputs without gzip files (`any_gzip`).
  """
  if check:
    problem, end = tf.py_function(_check_gzip_op, [path, compression],
                                  [tf.string, tf.int64])
    problem.set_shape([])
    end.set_shape([])
    assertion = tf.debugging.Assert(tf.equal(problem, ""), [problem])
    with tf.control_dependencies([assertion]):
      path = tf.identity(path)
    # A gzip file with bytes appended after its data is read up to them in
    # Python (TensorFlow's reader fails on them); the others by TensorFlow.
    whole = tf.reshape(end < 0, [1])
    lines = tf.data.TextLineDataset(
        tf.boolean_mask(tf.reshape(path, [1]), whole),
        compression_type=compression, buffer_size=1 << 20).concatenate(
            tf.data.Dataset.from_generator(
                _lines_before, args=(path, end),
                output_signature=tf.TensorSpec([None], tf.string)).unbatch())
  else:
    lines = tf.data.TextLineDataset(path, compression_type=compression,
                                    buffer_size=1 << 20)
  lines = lines.skip(header_lines)
  return tf.data.Dataset.zip({
      "line": lines,
      "file": tf.data.Dataset.from_tensors(index).repeat(),
      "line_number": tf.data.Dataset.range(header_lines + 1, tf.int64.max),
  })


def _strip_last_char(line: tf.Tensor, where: tf.Tensor) -> tf.Tensor:
  n = tf.strings.length(line)
  return tf.where(where,
                  tf.strings.substr(line, tf.zeros_like(n),
                                    tf.maximum(n - 1, 0)),
                  line)


def parse_hex(s: tf.Tensor) -> tf.Tensor:
  """Parses 1-8 hexadecimal digits to int64; "" -> `schema.MISSING_SPARSE`.

  Args:
    s: A string tensor of any shape, each element "" or 1-8 hex digits (either
      case; other strings give meaningless values, validate first).

  Returns:
    An int64 tensor of the same shape.
  """
  length = tf.cast(tf.strings.length(s), tf.int64)
  raw = tf.io.decode_raw(s, tf.uint8, fixed_length=schema.MAX_HEX_DIGITS)
  c = tf.cast(raw, tf.int64)
  digit = tf.where(c <= 57, c - 48, tf.bitwise.bitwise_or(c, 32) - 87)
  power = (tf.expand_dims(length, -1) - 1
           - tf.range(schema.MAX_HEX_DIGITS, dtype=tf.int64))
  shifted = tf.bitwise.left_shift(digit, 4 * tf.maximum(power, 0))
  value = tf.reduce_sum(tf.where(power >= 0, shifted, 0), axis=-1)
  return tf.where(length == 0, tf.constant(schema.MISSING_SPARSE, tf.int64),
                  value)


class Parser:
  """The batch-level parse UDF: row lines -> `(features, label)`.

  Args:
    specs: The files the lines come from (their layouts and names).
    on_bad_row: `"error"` (default) or `"skip"`, see the module docstring.
    bad_rows: The int64 variable counting skipped rows (default None: a new
      one, exposed as `self.bad_rows`).
    min_fields: Fewest fields (of the canonical 40) a row may have, the rest
      taken as stripped empty trailing fields (default `schema.MIN_FIELDS`).
  """

  def __init__(self, specs: Sequence[FileSpec], on_bad_row: str = "error",
               bad_rows: tf.Variable | None = None,
               min_fields: int = schema.MIN_FIELDS):
    if on_bad_row not in _BAD_ROW_MODES:
      raise ValueError(
          f"on_bad_row must be one of {_BAD_ROW_MODES}, got {on_bad_row!r}")
    self.on_bad_row = on_bad_row
    self.min_fields = int(min_fields)
    self._paths = [s.path for s in specs]
    self._layouts = [_LAYOUT_CODE[s.layout] for s in specs]
    self._any_csv = any(s.layout in (schema.LAYOUT_CSV, schema.LAYOUT_CSV_TEST)
                        for s in specs)
    self._any_test = any(
        s.layout in (schema.LAYOUT_TSV_TEST, schema.LAYOUT_CSV_TEST)
        for s in specs)
    self._boms = ([s.bom and s.header_lines == 0 for s in specs]
                  if any(s.bom for s in specs) else None)
    if bad_rows is None:
      bad_rows = tf.Variable(0, dtype=tf.int64, trainable=False,
                             name="criteo_bad_rows")
    self.bad_rows = bad_rows

  def __call__(self, batch: dict[str, tf.Tensor]):
    line = batch["line"]
    layout = tf.gather(tf.constant(self._layouts, tf.int32), batch["file"])
    is_test = tf.math.equal(tf.math.floormod(layout, 2), 1)
    # CRLF line endings: TextLineDataset keeps the '\r'.
    ends_cr = tf.strings.substr(
        line, tf.maximum(tf.strings.length(line) - 1, 0),
        tf.minimum(tf.strings.length(line), 1)) == "\r"
    line = _strip_last_char(line, ends_cr)
    if self._boms is not None:  # the byte order mark before line 1's row
      bom = (tf.gather(tf.constant(self._boms), batch["file"]) &
             (batch["line_number"] == 1))
      line = tf.strings.substr(line, tf.where(bom, len(_BOM_BYTES), 0),
                               tf.strings.length(line))
    if self._any_csv:
      is_csv = layout >= _LAYOUT_CODE[schema.LAYOUT_CSV]
      as_tsv = tf.strings.regex_replace(
          tf.strings.regex_replace(line, "^[^,]*,", ""), ",", "\t")
      line = tf.where(is_csv, as_tsv, line)
    if self._any_test:  # An empty label field in front: 40 fields.
      line = tf.where(is_test, tf.strings.join(["\t", line]), line)

    parts = tf.strings.split(line, "\t")
    n_fields = tf.cast(parts.row_lengths(), tf.int32)
    fields = parts.to_tensor(default_value="", shape=[None, schema.NUM_FIELDS])
    label_s = fields[:, 0]
    dense_s = fields[:, 1:1 + schema.NUM_DENSE]
    sparse_s = fields[:, 1 + schema.NUM_DENSE:]

    count_bad = (n_fields < self.min_fields) | (n_fields > schema.NUM_FIELDS)
    label_bad = tf.logical_not(is_test) & (label_s != "0") & (label_s != "1")
    dense_ok = tf.strings.regex_full_match(dense_s, "(?:-?[0-9]{1,15})?")
    sparse_ok = tf.strings.regex_full_match(sparse_s, "(?:[0-9a-fA-F]{1,8})?")
    dense_bad = tf.reduce_any(tf.logical_not(dense_ok), axis=1)
    sparse_bad = tf.reduce_any(tf.logical_not(sparse_ok), axis=1)
    bad = count_bad | label_bad | dense_bad | sparse_bad

    dense = tf.strings.to_number(
        tf.where(dense_ok & (dense_s != ""), dense_s, "0"), tf.float32)
    dense = tf.where(dense_s == "", schema.MISSING_DENSE, dense)
    sparse = parse_hex(tf.where(sparse_ok, sparse_s, ""))
    label = tf.strings.to_number(
        tf.where(label_bad | is_test, "0", label_s), tf.float32)
    label = tf.where(is_test, schema.UNLABELLED, label)
    features = {"dense": dense, "sparse": sparse}

    if self.on_bad_row == "error":
      any_bad = tf.reduce_any(bad)
      message = tf.cond(
          any_bad,
          lambda: self._message(batch, bad, n_fields, count_bad, label_bad,
                                label_s, dense_ok, dense_s, sparse_ok,
                                sparse_s, dense_bad),
          lambda: tf.constant(""))
      check = tf.debugging.Assert(tf.logical_not(any_bad), [message])
      with tf.control_dependencies([check]):
        label = tf.identity(label)
      return features, label

    keep = tf.logical_not(bad)
    count = self.bad_rows.assign_add(
        tf.reduce_sum(tf.cast(bad, tf.int64)), read_value=False)
    with tf.control_dependencies([count]):
      keep = tf.identity(keep)
    features = {k: tf.boolean_mask(v, keep) for k, v in features.items()}
    return features, tf.boolean_mask(label, keep)

  def _message(self, batch, bad, n_fields, count_bad, label_bad, label_s,
               dense_ok, dense_s, sparse_ok, sparse_s, dense_bad):
    """The error text for the first bad row of a batch."""
    i = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int32)
    path = tf.gather(tf.constant(self._paths), batch["file"][i])
    line_number = tf.strings.as_string(batch["line_number"][i])
    count_msg = tf.strings.format(
        "has {} fields, expected " + str(schema.NUM_FIELDS)
        + " (label, I1..I13, C1..C26; at least " + str(self.min_fields)
        + " when trailing empty fields are stripped)", [n_fields[i]])
    label_msg = tf.strings.join(
        ["label ", _quote(label_s[i]), " is not 0 or 1"])
    j = tf.argmax(tf.cast(tf.logical_not(dense_ok[i]), tf.int32),
                  output_type=tf.int32)
    dense_msg = tf.strings.join([
        "field ", tf.strings.as_string(j + 2), " (",
        tf.gather(tf.constant(schema.DENSE_NAMES), j), ") ",
        _quote(dense_s[i, j]), " is not an integer"])
    k = tf.argmax(tf.cast(tf.logical_not(sparse_ok[i]), tf.int32),
                  output_type=tf.int32)
    sparse_msg = tf.strings.join([
        "field ", tf.strings.as_string(k + 2 + schema.NUM_DENSE), " (",
        tf.gather(tf.constant(schema.SPARSE_NAMES), k), ") ",
        _quote(sparse_s[i, k]), " is not a categorical id (1-8 hex digits)"])
    reason = tf.where(count_bad[i], count_msg,
                      tf.where(label_bad[i], label_msg,
                               tf.where(dense_bad[i], dense_msg, sparse_msg)))
    return tf.strings.join(
        ["Criteo bad row: ", path, ":", line_number, ": ", reason])


def _quote(s: tf.Tensor) -> tf.Tensor:
  # Backticks: tf.debugging.Assert escapes quote characters in its message.
  return tf.strings.join(["`", tf.strings.substr(s, 0, 40), "`"])


def read(patterns: str | Iterable[str],
         *,
         batch_size: int,
         on_bad_row: str = "error",
         layout: str | None = None,
         bad_rows: tf.Variable | None = None,
         num_parallel_reads: int = 1,
         deterministic: bool | None = None,
         drop_remainder: bool = False,
         min_fields: int = schema.MIN_FIELDS) -> tf.data.Dataset:
  """Reads Criteo text files as batches of `(features, label)`.

  Args:
    patterns: File names or glob patterns, local or any filesystem TF knows;
      plain or gzip-compressed; each file's layout detected on its own.
    batch_size: Rows per batch (the last may be smaller, and with
      `on_bad_row="skip"` any batch that held bad rows).
    on_bad_row: `"error"` (default) or `"skip"`; see the module docstring.
    layout: None (default: detect per file) or one of `schema.LAYOUTS`.
    bad_rows: The int64 variable to add skipped rows to (default None: a new
      one). Either way it is attached as `bad_rows` to the returned dataset.
    num_parallel_reads: Files read at once (default 1: files in order, rows in
      file order); `tf.data.AUTOTUNE` or an int for more.
    deterministic: Element order guarantee of the parallel stages (default
      None: `tf.data.Options`' default, deterministic).
    drop_remainder: Drop a last batch smaller than `batch_size` (default
      False).
    min_fields: Fewest fields a labelled row may have (default 37).

  Returns:
    A dataset of `({"dense": float32 [B, 13], "sparse": int64 [B, 26]},
    label float32 [B])`, with attribute `bad_rows` (int64 `tf.Variable`).

  Raises:
    FileNotFoundError: A file is missing or a pattern matches nothing.
    CriteoFormatError: A file is empty, unreadable, or not Criteo data.
  """
  specs = file_specs(patterns, layout)
  parser = Parser(specs, on_bad_row, bad_rows, min_fields)
  cycle = (len(specs) if num_parallel_reads == tf.data.AUTOTUNE
           else num_parallel_reads)
  ds = lines_dataset(specs, cycle_length=cycle,
                     num_parallel_calls=(num_parallel_reads
                                         if cycle > 1 else None),
                     deterministic=deterministic)
  ds = ds.batch(batch_size, drop_remainder=drop_remainder)
  ds = ds.map(parser, num_parallel_calls=tf.data.AUTOTUNE,
              deterministic=deterministic)
  ds = ds.prefetch(tf.data.AUTOTUNE)
  ds.bad_rows = parser.bad_rows
  return ds
