"""Tests of intune_tf.criteo.convert: TFRecord everywhere, Parquet on compat."""

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
    convert._tfio()  # pylint: disable=protected-access
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
def test_import_does_not_load_tensorflow_io(tmp_path):
  code = ("import sys, intune_tf.criteo\n"
          "assert 'tensorflow_io' not in sys.modules\n")
  # Run outside the checkout so that the installed package is imported.
  done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
