"""Tests of intune_tf.criteo.synthetic (generator and fitting) and plots."""

import json

import numpy as np
import pytest

from intune_tf.criteo import plots
from intune_tf.criteo import reader
from intune_tf.criteo import schema
from intune_tf.criteo import synthetic

FIDELITY_ROWS = 20_000


def _one_row_chunk():
  dense = np.arange(13, dtype=np.int64) * 10 - 20  # -20, -10, 0, ..., 100
  dense[4] = 1234567890
  dense_missing = np.zeros((1, 13), bool)
  dense_missing[0, 3] = True
  sparse = np.full((1, 26), 0xABC, np.uint64)
  sparse[0, 0] = 0xFFFFFFFF
  sparse_missing = np.zeros((1, 26), bool)
  sparse_missing[0, 25] = True
  return {"label": np.array([1]), "dense": dense[None],
          "dense_missing": dense_missing, "sparse": sparse,
          "sparse_missing": sparse_missing}


def test_format_rows_hand_computed():
  line = synthetic.format_rows(_one_row_chunk()).decode()
  # I1..I13 = -20, -10, 0, (missing), 1234567890, 30, 40, ..., 100;
  # C1 = 0xffffffff, C2..C25 = 0xabc zero-padded to 8 digits, C26 missing.
  dense = ["-20", "-10", "0", "", "1234567890"] + [str(v) for v in
                                                  range(30, 101, 10)]
  sparse = ["ffffffff"] + ["00000abc"] * 24 + [""]
  assert line == "\t".join(["1", *dense, *sparse]) + "\n"


def test_category_id_is_stable_32_bit_and_distinct():
  ids = synthetic.category_id(3, np.arange(100_000, dtype=np.uint64))
  assert ids.max() < 2**32
  # 32-bit ids collide by the birthday bound: about n^2 / 2^33 =
  # 1e10 / 8.6e9 = 1.2 expected collisions among 100,000 ranks.
  assert np.unique(ids).size >= 100_000 - 10
  np.testing.assert_array_equal(
      ids[:5], synthetic.category_id(3, np.arange(5, dtype=np.uint64)))
  assert (synthetic.category_id(4, np.arange(5, dtype=np.uint64))
          != ids[:5]).all()


def test_zipf_exponent_recovers_a_power_law():
  # counts = 10000 / r^1.5 for r = 1..50 (rounded) -> slope -1.5.
  counts = np.round(10_000 / np.arange(1, 51) ** 1.5)
  assert synthetic.zipf_exponent(counts) == pytest.approx(1.5, abs=0.02)
  assert synthetic.zipf_exponent(np.array([5, 1, 1])) == 1.0  # Too few.


def test_generate_is_deterministic_and_chunked(tmp_path):
  a = synthetic.generate(5000, tmp_path / "a", seed=7, rows_per_file=2000,
                         chunk_rows=700)
  b = synthetic.generate(5000, tmp_path / "b", seed=7, rows_per_file=2000,
                         chunk_rows=700)
  c = synthetic.generate(5000, tmp_path / "c", seed=8, rows_per_file=2000,
                         chunk_rows=700)
  assert [p.rsplit("/", 1)[1] for p in a] == [
      "part-00000.tsv", "part-00001.tsv", "part-00002.tsv"]
  for x, y in zip(a, b):
    assert open(x, "rb").read() == open(y, "rb").read()
  assert open(a[0], "rb").read() != open(c[0], "rb").read()
  lines = [l for p in a for l in open(p).read().splitlines()]
  assert len(lines) == 5000  # 2000 + 2000 + 1000.
  assert {len(l.split("\t")) for l in lines} == {40}


def test_generated_files_read_without_bad_rows(tmp_path):
  paths = synthetic.generate(3000, tmp_path, seed=1, rows_per_file=3000,
                             compress=True)
  assert paths[0].endswith(".tsv.gz")
  ds = reader.read(paths, batch_size=1024, on_bad_row="skip")
  rows = sum(int(y.shape[0]) for _, y in ds)
  assert rows == 3000 and int(ds.bad_rows.numpy()) == 0


def test_packaged_stats_hold_aggregates_only():
  stats = synthetic.load_stats()
  text = synthetic.STATS_PATH.read_text()
  assert stats["format"] == synthetic.STATS_FORMAT
  assert len(stats["dense"]) == 13 and len(stats["sparse"]) == 26
  # No categorical value of the data: no 8-hex-digit string anywhere.
  assert not any(len(tok) == 8 and all(ch in "0123456789abcdef" for ch in tok)
                 for tok in text.replace('"', " ").split())


def _generated_missing_rates(tmp_path, rows=FIDELITY_ROWS):
  path = synthetic.generate(rows, tmp_path, seed=0)[0]
  _, dense, sparse = synthetic.load_columns(path)
  return synthetic.missing_rates(dense, sparse)


def test_missing_rates_follow_the_packaged_parameters(tmp_path):
  stats = synthetic.load_stats()
  want = np.array([c["missing_rate"] for c in stats["dense"] + stats["sparse"]])
  got = _generated_missing_rates(tmp_path)
  assert np.abs(got - want).max() < 0.03


@pytest.mark.slow
def test_missing_rates_within_3_points_of_the_real_sample(tmp_path,
                                                          criteo_real_dir):
  _, dense, sparse = synthetic.load_columns(
      str(criteo_real_dir / "criteo_sample_10k.tsv"))
  real = synthetic.missing_rates(dense, sparse)
  got = _generated_missing_rates(tmp_path)
  gaps = np.abs(got - real)
  names = schema.DENSE_NAMES + schema.SPARSE_NAMES
  assert gaps.max() < 0.03, dict(zip(names, gaps.round(4)))


@pytest.mark.slow
def test_packaged_stats_are_the_fit_of_the_real_sample(criteo_real_dir):
  fitted = synthetic.fit_stats(str(criteo_real_dir / "criteo_sample_10k.tsv"))
  assert json.loads(json.dumps(fitted)) == synthetic.load_stats()
  assert fitted["rows"] == 10_000 and fitted["label_rate"] == 0.251


def test_vocabulary_and_label_rate_follow_the_real_sample(tmp_path,
                                                          criteo_real_dir):
  real = str(criteo_real_dir / "criteo_sample_10k.tsv")
  r_label, _, r_sparse = synthetic.load_columns(real)
  path = synthetic.generate(10_000, tmp_path, seed=0)[0]
  s_label, _, s_sparse = synthetic.load_columns(path)
  assert abs(s_label.mean() - r_label.mean()) < 0.02
  for j in range(26):  # Distinct ids in 10k rows within 25% (or 3 ids).
    r = synthetic.rank_counts(r_sparse[:, j]).size
    s = synthetic.rank_counts(s_sparse[:, j]).size
    assert abs(s - r) <= max(3, 0.25 * r), (schema.SPARSE_NAMES[j], r, s)


@pytest.mark.slow
def test_compare_writes_a_png(tmp_path, criteo_real_dir):
  out = tmp_path / "compare.png"
  summary = plots.compare(str(criteo_real_dir / "criteo_sample_10k.tsv"), out)
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert summary["max_missing_rate_gap"] < 0.03


def test_generate_rejects_bad_sizes(tmp_path):
  with pytest.raises(ValueError):
    synthetic.generate(10, tmp_path, rows_per_file=0)


@pytest.mark.parametrize("ids, expected", [
    ([0x2a], [b"0000002a"]),
    ([[0, 0xdeadbeef]], [[b"00000000", b"deadbeef"]]),
    ([0x1_0000_0001], [b"00000001"]),  # the low 32 bits only
])
def test_hex_digits(ids, expected):
  digits = synthetic.hex_digits(np.array(ids, np.int64))
  assert digits.shape == np.array(ids).shape + (8,)
  assert digits.view("S8")[..., 0].tolist() == expected
