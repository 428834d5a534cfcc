"""Tests of intune_tf.criteo.reader on real rows and real-world variants."""

import functools
import gzip
import pathlib
import re
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from intune_tf.criteo import reader
from intune_tf.criteo import schema

HEADER = ",".join(["Id", "Label", *schema.DENSE_NAMES, *schema.SPARSE_NAMES])
TEST_HEADER = ",".join(["Id", *schema.DENSE_NAMES, *schema.SPARSE_NAMES])
VARIANT_ROWS = 300


def _read_all(paths, **kwargs):
  """All batches of `reader.read` concatenated into numpy arrays."""
  ds = reader.read(paths, batch_size=kwargs.pop("batch_size", 128), **kwargs)
  dense, sparse, label = [], [], []
  for features, y in ds:
    dense.append(features["dense"].numpy())
    sparse.append(features["sparse"].numpy())
    label.append(y.numpy())
  return (np.concatenate(dense), np.concatenate(sparse), np.concatenate(label),
          ds)


def _row(label="1", dense=None, sparse=None):
  """A made-up (not real) dac row."""
  dense = dense if dense is not None else [str(i) for i in range(13)]
  sparse = sparse if sparse is not None else ["0000000a"] * 26
  return "\t".join([label, *dense, *sparse])


@pytest.mark.parametrize("name,rows", [("criteo_sample_10k.tsv", 10_000),
                                       ("criteo_train_head_1999.tsv", 1_999)])
def test_real_files_exact_row_counts_and_no_bad_rows(criteo_real_dir, name,
                                                     rows):
  dense, sparse, label, ds = _read_all(str(criteo_real_dir / name),
                                       batch_size=4096, on_bad_row="skip")
  assert dense.shape == (rows, 13) and dense.dtype == np.float32
  assert sparse.shape == (rows, 26) and sparse.dtype == np.int64
  assert label.shape == (rows,) and label.dtype == np.float32
  assert int(ds.bad_rows.numpy()) == 0
  assert set(np.unique(label)) <= {0.0, 1.0}
  assert sparse.min() >= -1 and sparse.max() < 2**32


def test_real_sample_label_rate(criteo_real_dir):
  # README: the 10k sample is labelled; 2,510 of its labels are 1.
  _, _, label, _ = _read_all(str(criteo_real_dir / "criteo_sample_10k.tsv"),
                             batch_size=4096)
  assert label.sum() == 2510


def test_parse_hex_hand_computed():
  got = reader.parse_hex(tf.constant(["0a1b2c3d", "", "ff", "FFFFFFFF", "0"]))
  # 0x0a1b2c3d = 10*16^6 + 1*16^5 + 11*16^4 + 2*16^3 + 12*16^2 + 3*16 + 13
  #            = 167772160 + 1048576 + 720896 + 8192 + 3072 + 48 + 13
  #            = 169552957; "" is missing (-1); 0xff = 255; 16^8 - 1.
  np.testing.assert_array_equal(got.numpy(),
                                [169552957, -1, 255, 4294967295, 0])


def test_decodes_one_row_exactly(tmp_path):
  dense = ["", "-2", "7"] + ["1"] * 10
  sparse = ["0000001f", ""] + ["00000100"] * 24
  path = tmp_path / "one.tsv"
  path.write_text(_row("1", dense, sparse) + "\n")
  d, s, y, _ = _read_all(str(path))
  np.testing.assert_array_equal(d[0, :4], [0.0, -2.0, 7.0, 1.0])  # "" -> 0.0
  # 0x1f = 31, missing -> -1, 0x100 = 256.
  np.testing.assert_array_equal(s[0, :3], [31, -1, 256])
  np.testing.assert_array_equal(y, [1.0])


def _strip_trailing(fields, keep=schema.MIN_FIELDS):
  fields = list(fields)
  while len(fields) > keep and fields[-1] == "":
    fields.pop()
  return fields


def _write_variant(kind: str, lines: list[str], path: pathlib.Path) -> None:
  """Writes `lines` (dac rows) as the real-world variant `kind`."""
  if kind == "tsv_gzip":
    with gzip.open(path, "wt") as f:
      f.write("\n".join(lines) + "\n")
  elif kind == "gzip_named_txt":  # gzip detected by magic, not name.
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
  elif kind == "no_final_newline":
    path.write_text("\n".join(lines))
  elif kind == "crlf_tsv":
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
  elif kind == "stripped_trailing":
    path.write_text("\n".join("\t".join(_strip_trailing(l.split("\t")))
                              for l in lines) + "\n")
  elif kind == "kaggle_csv_crlf":
    body = [f"{10000000 + i}," + l.replace("\t", ",")
            for i, l in enumerate(lines)]
    path.write_bytes(("\r\n".join([HEADER] + body) + "\r\n").encode())
  elif kind == "test_tsv":
    path.write_text("\n".join(l.split("\t", 1)[1] for l in lines) + "\n")
  elif kind == "test_tsv_stripped":
    path.write_text("\n".join(
        "\t".join(_strip_trailing(l.split("\t")[1:], schema.MIN_FIELDS - 1))
        for l in lines) + "\n")
  elif kind == "test_csv":
    body = [f"{60000000 + i}," + l.split("\t", 1)[1].replace("\t", ",")
            for i, l in enumerate(lines)]
    path.write_text("\n".join([TEST_HEADER] + body) + "\n")
  elif kind.startswith("bom_"):  # a UTF-8 byte order mark, as Excel writes
    _write_variant(kind[len("bom_"):], lines, path)
    data = _BOM + path.read_bytes()
    if kind.endswith("gzip"):
      data = _BOM + gzip.decompress(path.read_bytes())
      data = gzip.compress(data)
    path.write_bytes(data)
  else:
    raise ValueError(kind)


_BOM = b"\xef\xbb\xbf"
VARIANTS = ["tsv_gzip", "gzip_named_txt", "no_final_newline", "crlf_tsv",
            "stripped_trailing", "kaggle_csv_crlf", "test_tsv",
            "test_tsv_stripped", "test_csv", "bom_no_final_newline",
            "bom_kaggle_csv_crlf", "bom_tsv_gzip", "bom_test_tsv"]


@pytest.fixture
def real_lines(criteo_real_dir):
  with open(criteo_real_dir / "criteo_sample_10k.tsv") as f:
    return [next(f).rstrip("\n") for _ in range(VARIANT_ROWS)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", VARIANTS)
def test_real_world_variants_read_like_the_original(tmp_path, real_lines,
                                                    kind):
  original = tmp_path / "original.tsv"
  original.write_text("\n".join(real_lines) + "\n")
  variant = tmp_path / "train.txt"
  _write_variant(kind, real_lines, variant)
  d0, s0, y0, _ = _read_all(str(original))
  d1, s1, y1, ds = _read_all(str(variant), on_bad_row="skip")
  assert int(ds.bad_rows.numpy()) == 0
  np.testing.assert_array_equal(d1, d0)
  np.testing.assert_array_equal(s1, s0)
  if "test_" in kind:  # Unlabelled layout: label reads as -1.
    np.testing.assert_array_equal(y1, np.full(VARIANT_ROWS, -1.0))
  else:
    np.testing.assert_array_equal(y1, y0)


def test_sniffed_layouts(tmp_path, real_lines):
  expected = {"kaggle_csv_crlf": (schema.LAYOUT_CSV, "", 1),
              "test_csv": (schema.LAYOUT_CSV_TEST, "", 1),
              "test_tsv": (schema.LAYOUT_TSV_TEST, "", 0),
              "test_tsv_stripped": (schema.LAYOUT_TSV_TEST, "", 0),
              "stripped_trailing": (schema.LAYOUT_TSV, "", 0),
              "gzip_named_txt": (schema.LAYOUT_TSV, "GZIP", 0)}
  for kind, (layout, compression, header) in expected.items():
    path = tmp_path / f"{kind}.txt"
    _write_variant(kind, real_lines, path)
    spec = reader.sniff(str(path))
    assert (spec.layout, spec.compression, spec.header_lines) == (
        layout, compression, header), kind


@pytest.mark.slow
def test_mixed_layouts_in_one_read_keep_file_order(tmp_path, real_lines):
  paths = []
  for kind in ["kaggle_csv_crlf", "test_tsv", "tsv_gzip"]:
    path = tmp_path / f"{kind}.data"
    _write_variant(kind, real_lines, path)
    paths.append(str(path))
  d, _, y, _ = _read_all(paths)
  d0, _, y0, _ = _read_all(paths[0])
  assert d.shape == (3 * VARIANT_ROWS, 13)
  np.testing.assert_array_equal(d, np.concatenate([d0, d0, d0]))
  np.testing.assert_array_equal(
      y, np.concatenate([y0, np.full(VARIANT_ROWS, -1.0), y0]))


def test_html_page_is_not_criteo_data(tmp_path):
  path = tmp_path / "train.txt"
  path.write_text("<!DOCTYPE html>\n<html><head><title>404 Not Found</title>"
                  "</head><body>Not Found</body></html>\n")
  with pytest.raises(reader.CriteoFormatError,
                     match=r"train\.txt: not Criteo data: .*HTML"):
    reader.read(str(path), batch_size=8)


def test_other_text_is_not_criteo_data(tmp_path):
  path = tmp_path / "notes.txt"
  path.write_text("hello world\nsecond line\n")
  with pytest.raises(reader.CriteoFormatError,
                     match=r"notes\.txt: not Criteo data: line 1 has 1 "):
    reader.read(str(path), batch_size=8)


GOOD = _row("0")


@pytest.mark.parametrize("bad_line,reason", [
    ("\t".join(GOOD.split("\t")[:30]), r"has 30 fields, expected 40"),
    (GOOD + "\textra", r"has 41 fields, expected 40"),
    (_row("1", ["1", "x7"] + ["1"] * 11),
     r"field 3 \(I2\) `x7` is not an integer"),
    (_row("1", ["1.5"] + ["1"] * 12),
     r"field 2 \(I1\) `1.5` is not an integer"),
    (_row("2"), r"label `2` is not 0 or 1"),
    (_row("1", None, ["zz000000"] + ["0000000a"] * 25),
     r"field 15 \(C1\) `zz000000` is not a categorical id"),
    (_row("1", None, ["0000000a"] * 25 + ["123456789"]),
     r"field 40 \(C26\) `123456789` is not a categorical id"),
])
def test_bad_row_error_names_file_line_and_reason(tmp_path, bad_line, reason):
  path = tmp_path / "day_0"
  # The bad row is line 3 of the file.
  path.write_text("\n".join([GOOD, GOOD, bad_line, GOOD]) + "\n")
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"Criteo bad row: \S*day_0:3: " + reason):
    _read_all(str(path))


def test_bad_row_line_number_counts_the_csv_header(tmp_path):
  path = tmp_path / "train.csv"
  good = "1," + GOOD.replace("\t", ",")
  bad = "2," + _row("1", ["q"] + ["1"] * 12).replace("\t", ",")
  path.write_text("\n".join([HEADER, good, bad]) + "\n")
  # Header is line 1, so the bad row is line 3.
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"train\.csv:3: field 2 \(I1\) `q`"):
    _read_all(str(path))


def test_skip_drops_and_counts_bad_rows(tmp_path):
  path = tmp_path / "day_1"
  bad = [_row("1", ["oops"] + ["1"] * 12), "garbage", GOOD + "\tx"]
  path.write_text("\n".join([GOOD, bad[0], GOOD, bad[1], bad[2], GOOD]) + "\n")
  counter = tf.Variable(0, dtype=tf.int64)
  d, _, y, ds = _read_all(str(path), on_bad_row="skip", bad_rows=counter,
                          batch_size=4)
  assert ds.bad_rows is counter
  assert int(counter.numpy()) == 3  # 6 lines - 3 good rows.
  assert d.shape == (3, 13) and y.tolist() == [0.0, 0.0, 0.0]


def test_missing_file_is_named(tmp_path):
  missing = tmp_path / "nope.tsv"
  with pytest.raises(FileNotFoundError, match=r"nope\.tsv: no such file"):
    reader.read(str(missing), batch_size=8)
  with pytest.raises(FileNotFoundError, match=r"day_\*\.gz: no file matches"):
    reader.read(str(tmp_path / "day_*.gz"), batch_size=8)


def test_empty_file_is_named(tmp_path):
  path = tmp_path / "empty.tsv"
  path.write_text("")
  with pytest.raises(reader.CriteoFormatError,
                     match=r"empty\.tsv: the file is empty"):
    reader.read(str(path), batch_size=8)
  gz = tmp_path / "empty.tsv.gz"
  gz.write_bytes(gzip.compress(b""))
  with pytest.raises(
      reader.CriteoFormatError,
      match=r"empty\.tsv\.gz: the gzip-compressed file is empty"):
    reader.read(str(gz), batch_size=8)


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_unreadable_gzip_is_named(tmp_path, damage):
  data = gzip.compress(("\n".join([GOOD] * 200) + "\n").encode())
  if damage == "truncated":
    data = data[:len(data) // 2]
  else:
    data = data[:10] + b"\xff" * (len(data) - 10)
  path = tmp_path / "day_2.gz"
  path.write_bytes(data)
  with pytest.raises(reader.CriteoFormatError,
                     match=r"day_2\.gz: unreadable gzip data"):
    reader.read(str(path), batch_size=8)


GZIP_ROWS = 5_000
# The rows of the intact file read before a damaged one: 5 batches.
INTACT_ROWS = 1_000


@functools.cache
def _made_up_rows(n: int, seed: int = 0) -> bytes:
  """`n` made-up dac rows of varied values (GZIP_ROWS: about 0.8 MB of gzip
  data, so damage at a quarter of the file is far past the 64 KiB sniff);
  made once per (n, seed)."""
  rng = np.random.default_rng(seed)
  dense = rng.integers(0, 1000, size=(n, 13))
  sparse = rng.integers(0, 1 << 32, size=(n, 26))
  labels = rng.integers(0, 2, size=n)
  return "".join(
      "\t".join([str(labels[i]), *map(str, dense[i]),
                 *(f"{v:08x}" for v in sparse[i])]) + "\n"
      for i in range(n)).encode()


@functools.cache
def _gzipped(n: int, seed: int = 0) -> bytes:
  """`_made_up_rows(n, seed)` as one gzip member, compressed once."""
  return gzip.compress(_made_up_rows(n, seed))


def _flip_middle_byte(data: bytes) -> bytes:
  middle = len(data) // 2
  return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


_CUT = "the gzip data ends before its end marker: the file was cut short"
_CORRUPT = "corrupt compressed data, found reading bytes"
# name: (damage done to a whole gzip file, what the error says).
GZIP_DAMAGE = {
    "cut_at_a_quarter": (lambda d: d[:len(d) // 4], _CUT),
    "cut_at_half": (lambda d: d[:len(d) // 2], _CUT),
    "cut_at_nine_tenths": (lambda d: d[:len(d) * 9 // 10], _CUT),
    "cut_inside_the_trailer": (lambda d: d[:-4], _CUT),
    "last_byte_cut": (lambda d: d[:-1], _CUT),
    "byte_flipped_mid_stream": (_flip_middle_byte, _CORRUPT),
}


@pytest.mark.slow
@pytest.mark.parametrize("on_bad_row", ["error", "skip"])
@pytest.mark.parametrize("damage", sorted(GZIP_DAMAGE))
def test_damaged_gzip_is_an_error_naming_the_file_in_every_mode(
    tmp_path, on_bad_row, damage):
  damage_fn, what = GZIP_DAMAGE[damage]
  intact = tmp_path / "day_0.gz"
  intact.write_bytes(_gzipped(INTACT_ROWS, seed=0))
  damaged = tmp_path / "day_1.gz"
  damaged.write_bytes(damage_fn(_gzipped(GZIP_ROWS, seed=1)))
  ds = reader.read([str(intact), str(damaged)], batch_size=INTACT_ROWS // 5,
                   on_bad_row=on_bad_row)
  rows = 0
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    for _, label in ds:
      rows += int(label.shape[0])
  assert re.search(r"Criteo damaged gzip: \S*day_1\.gz \(\d+ bytes\): .*"
                   + re.escape(what),
                   raised.value.message), raised.value.message
  assert "leave it out of the inputs" in raised.value.message
  # Every batch of the intact file (5 whole ones), then the error: no row of
  # the damaged one, though its first quarter alone holds 6 batches.
  assert rows == INTACT_ROWS


@pytest.mark.slow
def test_a_utf8_byte_order_mark_is_not_a_bad_label(tmp_path):
  # Used to fail as "label 1 is not 0 or 1" (the mark is invisible).
  path = tmp_path / "excel.tsv"
  path.write_bytes(_BOM + (_row("1") + "\n" + _row("0") + "\n").encode())
  assert reader.sniff(str(path)).bom
  _, _, label, ds = _read_all(str(path), on_bad_row="error")
  np.testing.assert_array_equal(label, [1.0, 0.0])
  # Only line 1 may start with the mark: elsewhere it is a bad row.
  path.write_bytes(_BOM + (_row("1") + "\n").encode() + _BOM +
                   (_row("0") + "\n").encode())
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"excel\.tsv:2: label"):
    _read_all(str(path))


# name: the bytes appended after the gzip data.
APPENDED = {
    "text": b"<html>Service Unavailable</html>\n",
    "zeros": bytes(512),
    "one_byte": b"x",
}


@pytest.mark.slow
# In the sniff, past it; the reader's gzip handling is ours (Python's zlib),
# so past it runs on the main stack only.
@pytest.mark.parametrize("rows", [200, pytest.param(
    GZIP_ROWS, marks=pytest.mark.main_stack_only(covered_by=(
        "test_criteo_reader.py::"
        "test_bytes_appended_after_gzip_data_are_left_as_gzip_does",)))])
@pytest.mark.parametrize("appended", sorted(APPENDED))
def test_bytes_appended_after_gzip_data_are_left_as_gzip_does(
    tmp_path, caplog, rows, appended):
  # Used to refuse the whole file, blaming its data.
  data = _gzipped(rows, seed=4)
  intact = tmp_path / "intact.gz"
  intact.write_bytes(data)
  path = tmp_path / "day_9.gz"
  path.write_bytes(data + APPENDED[appended])
  # gzip itself warns and recovers every row.
  unpacked = subprocess.run(["gzip", "-dc", str(path)], capture_output=True,
                            check=False)
  assert unpacked.stdout.count(b"\n") == rows
  want = _read_all(str(intact), on_bad_row="error")
  for _ in range(2):  # a second read: told once
    got = _read_all(str(path), on_bad_row="error")
    for a, b in zip(got[:3], want[:3]):
      np.testing.assert_array_equal(a, b)
  told = [r.getMessage() for r in caplog.records
          if "day_9.gz" in r.getMessage()]
  size = len(data) + len(APPENDED[appended])
  assert told == [
      f"Criteo gzip {path} ({size} bytes): the {len(APPENDED[appended])} "
      f"bytes from byte {len(data)} on, after the end of its gzip data, are "
      "not gzip data (something was appended to the file); they are left, "
      "as `gzip -d` does, and the rows before them are read. Reported once "
      "per file."]


@pytest.mark.parametrize("on_bad_row", ["error", "skip"])
def test_gzip_of_several_members_reads_whole(tmp_path, on_bad_row):
  path = tmp_path / "day_0.gz"  # as `cat a.gz b.gz > day_0.gz` makes
  path.write_bytes(_gzipped(1000, seed=0)
                   + _gzipped(2000, seed=1))
  _, _, label, ds = _read_all(str(path), on_bad_row=on_bad_row,
                              batch_size=512)
  assert label.shape == (3000,)
  assert int(ds.bad_rows.numpy()) == 0


@pytest.mark.slow
def test_a_gzip_file_damaged_after_a_clean_read_fails_the_next(tmp_path):
  path = tmp_path / "day_0.gz"
  data = _gzipped(2000)
  path.write_bytes(data)
  assert reader.check_gzip(str(path)) == ""
  assert _read_all(str(path))[2].shape == (2000,)
  path.write_bytes(data[:len(data) // 2])  # cut short since
  assert _CUT in reader.check_gzip(str(path))
  with pytest.raises(tf.errors.InvalidArgumentError, match=_CUT):
    _read_all(str(path))


def _calls_python(ds: tf.data.Dataset) -> bool:
  graph = ds._as_serialized_graph().numpy()  # noqa: SLF001
  return b"EagerPyFunc" in graph


def test_only_inputs_with_gzip_files_call_python(tmp_path):
  plain = tmp_path / "day_0"
  plain.write_bytes(_made_up_rows(10))
  packed = tmp_path / "day_1.gz"
  packed.write_bytes(_gzipped(10))
  # A remote tf.data service worker can run the first, not the second.
  assert not _calls_python(reader.read(str(plain), batch_size=4))
  assert _calls_python(reader.read([str(plain), str(packed)], batch_size=4))


def test_bad_arguments():
  with pytest.raises(ValueError, match="on_bad_row"):
    reader.Parser([], on_bad_row="ignore")
  with pytest.raises(ValueError, match="layout"):
    reader.file_specs([], layout="xml")
