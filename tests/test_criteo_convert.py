"""Tests of intune_tf.criteo.convert: TFRecord everywhere, Parquet on compat."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from intune_tf.criteo import convert
from intune_tf.criteo import reader
from intune_tf.criteo import synthetic


def _tfio_loads() -> str | None:
  """None if tensorflow-io loads here, else why not."""
  try:
    convert._tfio()  # noqa: SLF001
    return None
  except convert.ParquetUnavailableError as e:
    return str(e)


def _all(ds):
  features, labels = [], []
  for f, y in ds:
    features.append({k: v.numpy() for k, v in f.items()})
    labels.append(y.numpy())
  return ({k: np.concatenate([f[k] for f in features]) for k in features[0]},
          np.concatenate(labels))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """Synthetic rows plus one unlabelled-layout file."""
  out = tmp_path_factory.mktemp("convert_src")
  path = synthetic.generate(2500, out, seed=4)[0]
  lines = open(path).read().splitlines()[:100]
  test = out / "test.txt"
  test.write_text("\n".join(l.split("\t", 1)[1] for l in lines) + "\n")
  return [path, str(test)]


@pytest.mark.slow
@pytest.mark.parametrize("compress", [False, True])
def test_tfrecord_roundtrip_equals_text_reader(tmp_path, source, compress):
  paths = convert.convert_files(source, tmp_path, "tfrecord",
                                rows_per_file=1000, compress=compress)
  suffix = ".tfrecord.gz" if compress else ".tfrecord"
  assert [p.rsplit("/", 1)[1] for p in paths] == [
      f"part-0000{i}{suffix}" for i in range(3)]  # 2600 rows / 1000 per file.
  want_x, want_y = _all(reader.read(source, batch_size=777))
  got_x, got_y = _all(convert.read_tfrecord(paths, batch_size=777))
  for key in ("dense", "sparse"):
    np.testing.assert_array_equal(got_x[key], want_x[key])
  np.testing.assert_array_equal(got_y, want_y)
  assert (got_y[-100:] == -1.0).all()  # The unlabelled rows.


def test_tfrecord_example_layout(tmp_path, source):
  path = convert.convert_files(source[0], tmp_path, rows_per_file=10**6)[0]
  record = next(iter(tf.data.TFRecordDataset(path))).numpy()
  example = tf.train.Example.FromString(record)
  feature = example.features.feature
  assert sorted(feature) == ["dense", "label", "sparse"]
  assert len(feature["dense"].float_list.value) == 13
  assert len(feature["sparse"].int64_list.value) == 26
  assert len(feature["label"].float_list.value) == 1


def test_unknown_format(tmp_path, source):
  with pytest.raises(ValueError, match="fmt"):
    convert.convert_files(source, tmp_path, "avro")


@pytest.mark.parametrize("rows_per_file", [0, -1, 2.5, True])
def test_rows_per_file_must_be_positive(tmp_path, source, rows_per_file):
  # 0 used to write empty files forever.
  out = tmp_path / "out"
  with pytest.raises(ValueError, match=r"rows_per_file must be a positive "
                     rf"int, got {rows_per_file!r}\."):
    convert.convert_files(source, out, rows_per_file=rows_per_file)
  assert not out.exists()


def test_a_non_empty_output_folder_is_refused_before_writing(tmp_path,
                                                             source):
  out = tmp_path / "out"
  out.mkdir()
  for name in ["part-00000.tfrecord", "part-00001.tfrecord", "a", "b", "c",
               "d"]:
    (out / name).write_bytes(b"stale")
  with pytest.raises(convert.OutputDirError) as error:
    convert.convert_files(source, out, rows_per_file=1000)
  assert str(error.value) == (
      f"output folder {out} is not empty: it holds a, b, c, d, "
      "part-00000.tfrecord and 1 more. Pass an empty or new folder: "
      "converting into this one would mix its files with the new parts.")
  assert all((out / n).read_bytes() == b"stale" for n in os.listdir(out))
  assert sorted(os.listdir(tmp_path)) == ["out"]  # No partial folder either.


def test_an_output_path_that_is_a_file_is_refused(tmp_path, source):
  out = tmp_path / "out"
  out.write_text("mine")
  with pytest.raises(convert.OutputDirError,
                     match=rf"output folder {out} is a file, not a folder"):
    convert.convert_files(source, out)
  assert out.read_text() == "mine"


def test_an_empty_output_folder_is_filled(tmp_path, source):
  out = tmp_path / "out"
  out.mkdir()
  paths = convert.convert_files(source, out, rows_per_file=1000)
  assert paths == [str(out / f"part-0000{i}.tfrecord") for i in range(3)]
  assert sorted(os.listdir(tmp_path)) == ["out"]
  assert sorted(os.listdir(out)) == [f"part-0000{i}.tfrecord" for i in range(3)]


@pytest.mark.parametrize("exists", [False, True])
def test_a_failed_conversion_leaves_no_output_that_looks_complete(
    tmp_path, source, exists, monkeypatch):
  # A bad row after two output files are written, in "error" mode.
  monkeypatch.setattr(convert, "_CONVERT_BATCH", 500)
  lines = open(source[0]).read().splitlines(keepends=True)
  bad = tmp_path / "bad.tsv"
  bad.write_text("".join(lines[:1500]) + "not\ta\tcriteo\trow\n" +
                 "".join(lines[1500:]))
  out = tmp_path / "out"
  if exists:
    out.mkdir()
  converted = []
  with pytest.raises(tf.errors.InvalidArgumentError, match="bad.tsv"):
    convert.convert_files([str(bad)], out, rows_per_file=1000,
                          progress=converted.append)
  assert sum(converted) == 1500  # Written, then removed.
  # No part file, and no hidden partial folder beside it.
  assert sorted(os.listdir(tmp_path)) == sorted(["bad.tsv"] +
                                                (["out"] if exists else []))
  assert not exists or os.listdir(out) == []


@pytest.mark.compat
def test_parquet_roundtrip_on_compat_stack(tmp_path, source):
  why = _tfio_loads()
  if why is not None:
    pytest.skip("Parquet runs on the compat stack only (TF 2.16 + "
                f"tensorflow-io): {why[:120]}")
  paths = convert.convert_files(source, tmp_path, "parquet",
                                rows_per_file=1000)
  assert len(paths) == 3 and paths[0].endswith(".parquet")
  want_x, want_y = _all(reader.read(source, batch_size=500))
  got_x, got_y = _all(convert.read_parquet(str(tmp_path / "*.parquet"),
                                           batch_size=500))
  for key in ("dense", "sparse"):
    np.testing.assert_array_equal(got_x[key], want_x[key])
  np.testing.assert_array_equal(got_y, want_y)


def test_parquet_fails_clearly_without_tensorflow_io(tmp_path, source):
  if _tfio_loads() is None:
    pytest.skip("tensorflow-io loads here (compat stack): nothing to refuse")
  with pytest.raises(convert.ParquetUnavailableError,
                     match=r"tensorflow-io.*compat stack"):
    convert.convert_files(source, tmp_path, "parquet")
  with pytest.raises(convert.ParquetUnavailableError, match="tensorflow-io"):
    convert.read_parquet(source, batch_size=8)


@pytest.mark.slow
@pytest.mark.compat
def test_import_does_not_load_tensorflow_io(tmp_path):
  if importlib.util.find_spec("tensorflow_io") is None:
    pytest.skip("tensorflow-io is not installed here, so nothing can load it "
                "(the compat stack installs it and runs this)")
  code = ("import sys, intune_tf.criteo\n"
          "assert 'tensorflow_io' not in sys.modules\n")
  # Run outside the checkout so that the installed package is imported.
  done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
