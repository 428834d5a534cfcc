"""Synthetic Criteo data whose statistics follow the real click logs.

`fit_stats(path)` measures a real dac-layout file and returns aggregate
parameters only (rates, quantiles, rank-frequency shapes; never a row or a
categorical value). `generate(rows, out_dir)` writes dac-layout TSV files
from such parameters, by default from `data/criteo_stats.json`, which was
made with

    intune criteo fit --real ../shared/data/criteo/criteo_sample_10k.tsv \\
        --out criteo/data/criteo_stats.json

Model, per column, independently:

* label: Bernoulli(`label_rate`).
* I1..I13: missing with probability `missing_rate`, else an inverse-CDF draw
  through the empirical quantiles (`quantile_levels` -> `quantiles`, a finer
  grid in the upper tail, negatives included), stochastically rounded to an
  integer.
* C1..C26: missing with probability `missing_rate`, else a rank: the `head`
  ranks with their measured probabilities, then a Zipf-like power-law tail
  (`zipf_exponent`, fitted by least squares on log count vs log rank) up to
  `gen_vocab_size` ids (times `vocab_scale`): the vocabulary whose draws, as
  many as the sample's rows, show the sample's distinct count
  (`vocab_size`). Rank r of column c becomes a synthetic 8-hex id by a fixed
  64-bit mix of (c, r) (`category_id`), so ids are stable across files and
  runs.

Rows are produced in chunks by vectorized numpy and formatted without
per-row Python, deterministically from (seed, file, chunk).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import pathlib
from typing import Any, Callable, Iterator

import numpy as np

from intune_tf import files
from intune_tf.criteo import schema

STATS_PATH = (pathlib.Path(__file__).resolve().parent / "data" /
              "criteo_stats.json")
STATS_FORMAT = "intune_tf.criteo.stats/1"
HEAD_RANKS = 100
QUANTILE_LEVELS = tuple(np.round(np.concatenate([
    np.linspace(0.0, 0.9, 91), np.linspace(0.91, 0.99, 9),
    [0.995, 0.999, 1.0]]), 4).tolist())
_DIGITS = 11  # Sign and 10 decimal digits per integer field.
_MAX_INT = 10**(_DIGITS - 1) - 1
_ROW_WIDTH = 2 + schema.NUM_DENSE * (_DIGITS + 1) + schema.NUM_SPARSE * 9
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


# --------------------------------------------------------------------------
# Reading a real file for fitting and comparing (Python, small files only).


def load_columns(path: str, max_rows: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Loads a labelled dac-layout TSV file (plain or gzip) into numpy arrays.

  Meant for fitting and comparing statistics of small files; training data
  goes through `reader.read`.

  Args:
    path: The file.
    max_rows: Read at most this many rows (default None: all).

  Returns:
    `(label float64 [N], dense float64 [N, 13] with NaN for missing,
    sparse object [N, 26] of str with "" for missing)`.
  """
  opener = gzip.open if _is_gzip(path) else open
  labels, dense, sparse = [], [], []
  with opener(path, "rt", newline="") as f:
    for i, line in enumerate(f):
      if max_rows is not None and i >= max_rows:
        break
      fields = line.rstrip("\r\n").split("\t")
      fields += [""] * (schema.NUM_FIELDS - len(fields))
      labels.append(float(fields[0]))
      dense.append([float(v) if v else np.nan
                    for v in fields[1:1 + schema.NUM_DENSE]])
      sparse.append(fields[1 + schema.NUM_DENSE:schema.NUM_FIELDS])
  return (np.asarray(labels), np.asarray(dense, np.float64).reshape(-1, 13),
          np.asarray(sparse, dtype=object).reshape(-1, 26))


def _is_gzip(path: str) -> bool:
  with open(path, "rb") as f:
    return f.read(2) == b"\x1f\x8b"


def missing_rates(dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
  """Per-column missing rates, I1..I13 then C1..C26 (float64 [39])."""
  return np.concatenate([np.isnan(dense).mean(axis=0),
                         (sparse == "").mean(axis=0)])


def rank_counts(values: np.ndarray) -> np.ndarray:
  """Counts of the distinct non-empty values, largest first."""
  values = values[values != ""]
  if values.size == 0:
    return np.zeros(0, np.int64)
  _, counts = np.unique(values.astype(str), return_counts=True)
  return np.sort(counts)[::-1]


def zipf_exponent(counts: np.ndarray) -> float:
  """Least-squares slope of log count on log rank (counts >= 2), negated.

  Args:
    counts: Value counts, largest first.

  Returns:
    The exponent s of count ~ rank^-s, clipped to [0.05, 4]; 1.0 when fewer
    than three values repeat.
  """
  repeated = counts[counts >= 2]
  if repeated.size < 3:
    return 1.0
  x = np.log(np.arange(1, repeated.size + 1))
  y = np.log(repeated)
  slope = np.polyfit(x, y, 1)[0]
  return float(np.clip(-slope, 0.05, 4.0))


def _calibrate_vocab(counts: np.ndarray, total: int, column: int) -> int:
  """The vocabulary size whose draws show the sample's distinct count.

  The power-law tail is sampled `total` times for vocabularies of 1x to 64x
  the sample's distinct count; the one closest in distinct values wins.
  """
  if counts.size <= HEAD_RANKS:
    return int(counts.size)
  head = counts[:HEAD_RANKS] / total
  col = {"head_probs": head.tolist(), "vocab_size": int(counts.size),
         "zipf_exponent": zipf_exponent(counts)}
  best, best_err = int(counts.size), None
  for scale in 2.0 ** np.arange(0, 6.5, 0.5):
    rng = np.random.default_rng([column, 7])
    ranks = _sample_ranks(rng, total, col, float(scale))
    err = abs(np.unique(ranks).size - counts.size)
    if best_err is None or err < best_err:
      best, best_err = int(round(counts.size * scale)), err
  return best


def fit_stats(path: str) -> dict[str, Any]:
  """Fits the generator's parameters to a real labelled dac-layout file.

  Args:
    path: A TSV file with labels (e.g. criteo_sample_10k.tsv).

  Returns:
    A JSON-able dict of aggregate parameters (see the module docstring); it
    holds no row and no categorical value of the input.
  """
  labels, dense, sparse = load_columns(path)
  rates = missing_rates(dense, sparse)
  levels = np.asarray(QUANTILE_LEVELS)
  dense_stats = []
  for j, name in enumerate(schema.DENSE_NAMES):
    present = dense[:, j][~np.isnan(dense[:, j])]
    quantiles = (np.quantile(present, levels) if present.size
                 else np.zeros_like(levels))
    dense_stats.append({
        "name": name,
        "missing_rate": round(float(rates[j]), 6),
        "quantiles": [round(float(q), 3) for q in quantiles],
    })
  sparse_stats = []
  for j, name in enumerate(schema.SPARSE_NAMES):
    counts = rank_counts(sparse[:, j])
    total = max(int(counts.sum()), 1)
    head = counts[:HEAD_RANKS] / total
    sparse_stats.append({
        "name": name,
        "missing_rate": round(float(rates[schema.NUM_DENSE + j]), 6),
        "vocab_size": int(counts.size),
        "zipf_exponent": round(zipf_exponent(counts), 4),
        "gen_vocab_size": _calibrate_vocab(counts, total, j),
        "head_probs": [round(float(p), 6) for p in head],
        "singleton_share": round(float((counts == 1).sum() / total), 6),
    })
  return {
      "format": STATS_FORMAT,
      "source": os.path.basename(path),
      "rows": int(labels.size),
      "label_rate": round(float(labels.mean()), 6),
      "quantile_levels": list(QUANTILE_LEVELS),
      "dense": dense_stats,
      "sparse": sparse_stats,
  }


def load_stats(path: str | os.PathLike | None = None) -> dict[str, Any]:
  """Loads fitted parameters (default None: the packaged criteo_stats.json)."""
  with open(path or STATS_PATH) as f:
    stats = json.load(f)
  if stats.get("format") != STATS_FORMAT:
    raise ValueError(f"{path or STATS_PATH}: not a {STATS_FORMAT} file")
  return stats


# --------------------------------------------------------------------------
# Sampling.


def category_id(column: int | np.ndarray, rank: np.ndarray) -> np.ndarray:
  """The synthetic 32-bit id of `rank` (0-based) in categorical `column`.

  A splitmix64 finalizer over `(column + 1) << 40 | rank`, low 32 bits.

  Args:
    column: 0-based categorical column (0 = C1), scalar or broadcastable.
    rank: 0-based frequency ranks.

  Returns:
    uint64 ids in [0, 2**32).
  """
  with np.errstate(over="ignore"):
    z = ((np.uint64(1) + np.asarray(column, np.uint64)) << np.uint64(40)
         ) | np.asarray(rank, np.uint64)
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
  return z & np.uint64(0xFFFFFFFF)


def _sample_ranks(rng: np.random.Generator, n: int, col: dict[str, Any],
                  vocab_scale: float) -> np.ndarray:
  head = np.asarray(col["head_probs"], np.float64)
  vocab = max(int(round(col.get("gen_vocab_size", col["vocab_size"])
                        * vocab_scale)), head.size, 1)
  tail_mass = max(0.0, 1.0 - head.sum())
  u = rng.random(n)
  cdf = np.cumsum(head)
  ranks = np.searchsorted(cdf, u, side="right").astype(np.int64)
  in_tail = u >= cdf[-1] if head.size else np.ones(n, bool)
  k = head.size
  if vocab > k and tail_mass > 0:
    v = rng.random(int(in_tail.sum()))
    s = float(col["zipf_exponent"])
    lo, hi = k + 1.0, vocab + 1.0
    if abs(1.0 - s) < 1e-6:
      r = lo * np.exp(v * np.log(hi / lo))
    else:
      a, b = lo ** (1 - s), hi ** (1 - s)
      r = (a + v * (b - a)) ** (1.0 / (1 - s))
    ranks[in_tail] = np.clip(np.floor(r) - 1, k, vocab - 1).astype(np.int64)
  else:
    ranks = np.minimum(ranks, max(k - 1, 0))
  return ranks


def sample_chunk(stats: dict[str, Any], n: int, rng: np.random.Generator,
                 vocab_scale: float = 1.0) -> dict[str, np.ndarray]:
  """Draws `n` synthetic rows as arrays.

  Args:
    stats: Fitted parameters (`fit_stats` / `load_stats`).
    n: Rows.
    rng: The random generator.
    vocab_scale: Multiplies each column's vocabulary size (default 1.0).

  Returns:
    `{"label": int64 [n], "dense": int64 [n, 13], "dense_missing": bool
    [n, 13], "sparse": uint64 [n, 26], "sparse_missing": bool [n, 26]}`.
  """
  levels = np.asarray(stats["quantile_levels"], np.float64)
  label = (rng.random(n) < stats["label_rate"]).astype(np.int64)
  dense = np.empty((n, schema.NUM_DENSE), np.int64)
  dense_missing = np.empty((n, schema.NUM_DENSE), bool)
  for j, col in enumerate(stats["dense"]):
    dense_missing[:, j] = rng.random(n) < col["missing_rate"]
    q = np.interp(rng.random(n), levels, np.asarray(col["quantiles"]))
    dense[:, j] = np.floor(q + rng.random(n)).astype(np.int64)
  np.clip(dense, -_MAX_INT, _MAX_INT, out=dense)  # Fits the 11-char field.
  sparse = np.empty((n, schema.NUM_SPARSE), np.uint64)
  sparse_missing = np.empty((n, schema.NUM_SPARSE), bool)
  for j, col in enumerate(stats["sparse"]):
    sparse_missing[:, j] = rng.random(n) < col["missing_rate"]
    sparse[:, j] = category_id(j, _sample_ranks(rng, n, col, vocab_scale))
  return {"label": label, "dense": dense, "dense_missing": dense_missing,
          "sparse": sparse, "sparse_missing": sparse_missing}


def hex_digits(ids: np.ndarray) -> np.ndarray:
  """The low 32 bits of each id as 8 lower-case hexadecimal ASCII digits.

  Example: 0x2a -> b"0000002a" (the last axis holds the 8 digits).

  Args:
    ids: Integer ids of any shape.

  Returns:
    uint8 array of shape `ids.shape + (8,)`.
  """
  shifts = np.arange(28, -1, -4, dtype=np.uint32)
  return _HEX[(ids.astype(np.uint32)[..., None] >> shifts) & np.uint32(15)]


def format_rows(chunk: dict[str, np.ndarray]) -> bytes:
  """Formats sampled rows as dac-layout TSV lines, vectorized.

  Each field is written right-aligned into a fixed-width byte grid padded
  with NUL bytes, which are then dropped.

  Args:
    chunk: As returned by `sample_chunk`.

  Returns:
    The lines, each ending in "\\n".
  """
  n = chunk["label"].shape[0]
  grid = np.zeros((n, _ROW_WIDTH), np.uint8)
  grid[:, 0] = 48 + chunk["label"].astype(np.uint8)
  grid[:, 1] = 9
  stop = 2 + schema.NUM_DENSE * (_DIGITS + 1)
  # Integers: 11 characters (sign and digits, right-aligned) and a tab each.
  dense = grid[:, 2:stop].reshape(n, schema.NUM_DENSE, _DIGITS + 1)
  value = chunk["dense"]
  present = ~chunk["dense_missing"]
  rest = np.abs(value)
  ndig = np.ones(value.shape, np.int64)
  for p in range(1, _DIGITS - 1):
    ndig += rest >= 10 ** p
  minus = (value < 0) & present
  for k in range(_DIGITS):  # k-th digit from the right sits at 10 - k.
    digit = (48 + rest % 10).astype(np.uint8)
    rest //= 10
    char = np.where((k < ndig) & present, digit, np.uint8(0))
    char[(k == ndig) & minus] = 45
    dense[:, :, _DIGITS - 1 - k] = char
  dense[:, :, _DIGITS] = 9
  # Categoricals: 8 hexadecimal characters and a tab each.
  sparse = grid[:, stop:].reshape(n, schema.NUM_SPARSE, 9)
  sparse[:, :, :8] = hex_digits(chunk["sparse"])
  sparse[chunk["sparse_missing"], :8] = 0
  sparse[:, :, 8] = 9
  sparse[:, -1, 8] = 10
  return grid[grid != 0].tobytes()


def iter_chunks(stats: dict[str, Any], rows: int, seed: int, file_index: int,
                chunk_rows: int, vocab_scale: float = 1.0
                ) -> Iterator[bytes]:
  """Formatted chunks of one file, deterministic in (seed, file, chunk)."""
  for c, start in enumerate(range(0, rows, chunk_rows)):
    rng = np.random.default_rng([seed, file_index, c])
    yield format_rows(sample_chunk(stats, min(chunk_rows, rows - start), rng,
                                   vocab_scale))


def generate(rows: int,
             out_dir: str | os.PathLike,
             seed: int = 0,
             rows_per_file: int = 1_000_000,
             *,
             stats: dict[str, Any] | str | None = None,
             compress: bool = False,
             chunk_rows: int = 65_536,
             vocab_scale: float = 1.0,
             prefix: str = "part",
             progress: Callable[[int], Any] | None = None) -> list[str]:
  """Writes `rows` synthetic rows as dac-layout TSV files.

  Memory stays bounded by `chunk_rows` (about 0.5 KB per row of scratch).

  Args:
    rows: Total rows.
    out_dir: Directory, created if needed.
    seed: Random seed (default 0); same arguments, same bytes.
    rows_per_file: Rows per file (default 1,000,000).
    stats: Parameters, or a path to a stats JSON (default None: the packaged
      `data/criteo_stats.json`).
    compress: Write gzip files, `.tsv.gz` (default False).
    chunk_rows: Rows sampled and written at a time (default 65,536).
    vocab_scale: Multiplies every categorical vocabulary (default 1.0).
    prefix: File name prefix (default "part": part-00000.tsv, ...).
    progress: Called with the rows of each written chunk (default None), e.g.
      a tqdm bar's `update`.

  Returns:
    The file paths, in order.
  """
  if rows < 0 or rows_per_file <= 0 or chunk_rows <= 0:
    raise ValueError("rows must be >= 0, rows_per_file and chunk_rows > 0")
  if stats is None or isinstance(stats, (str, os.PathLike)):
    stats = load_stats(stats)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = []
  for i, start in enumerate(range(0, rows, rows_per_file)):
    n = min(rows_per_file, rows - start)
    path = out / f"{prefix}-{i:05d}.tsv{'.gz' if compress else ''}"
    with files.atomic_write(path, binary=True) as raw, (
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1)
        if compress else contextlib.nullcontext(raw)) as f:
      for c, data in enumerate(iter_chunks(stats, n, seed, i, chunk_rows,
                                           vocab_scale)):
        f.write(data)
        if progress is not None:
          progress(min(chunk_rows, n - c * chunk_rows))
    paths.append(str(path))
  return paths
