"""Where Criteo data comes from: a cached synthetic set and the real sample."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import tempfile
from typing import Callable

from intune_tf.criteo import synthetic

REAL_DATA_ENV = "INTUNE_CRITEO_DATA"
CACHE_ENV = "INTUNE_CRITEO_CACHE"
_DONE = "DONE"


def default_cache_dir() -> pathlib.Path:
  """`$INTUNE_CRITEO_CACHE`, else `~/.cache/intune_tf/criteo`."""
  env = os.environ.get(CACHE_ENV)
  if env:
    return pathlib.Path(env)
  return pathlib.Path.home() / ".cache" / "intune_tf" / "criteo"


def cached_folder(base: pathlib.Path, name: str,
                  write: Callable[[pathlib.Path], None]) -> pathlib.Path:
  """`base / name`, written once by `write`.

  `write` fills a temporary folder beside the target, which is renamed into
  place when done: readers never see half a set, and of two processes
  writing the same set one wins and the other uses its result.

  Args:
    base: The cache folder (made if missing).
    name: The set's folder name; it should change when the contents would.
    write: Fills the folder it is given.

  Returns:
    `base / name`.
  """
  target = base / name
  if not (target / _DONE).exists():
    base.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".tmp-", dir=base))
    try:
      write(tmp)
      (tmp / _DONE).write_text("ok\n")
      try:
        os.replace(tmp, target)
      except OSError:  # Another process made it first.
        if not (target / _DONE).exists():
          raise
    finally:
      if tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
  return target


def default_files(rows: int = 200_000,
                  cache_dir: str | os.PathLike | None = None,
                  *,
                  seed: int = 0,
                  rows_per_file: int = 50_000) -> list[str]:
  """Files of a small synthetic set, generated once into a cache directory.

  The set is keyed by its arguments and the packaged generator parameters; a
  second call returns the cached files. No download.

  Args:
    rows: Rows in the set (default 200,000, about 50 MB).
    cache_dir: Where to keep it (default None: `default_cache_dir()`).
    seed: Generator seed (default 0).
    rows_per_file: Rows per file (default 50,000).

  Returns:
    The sorted file paths.
  """
  base = pathlib.Path(cache_dir) if cache_dir else default_cache_dir()
  digest = hashlib.sha256(synthetic.STATS_PATH.read_bytes()).hexdigest()[:8]
  target = cached_folder(
      base, f"synthetic-r{rows}-s{seed}-f{rows_per_file}-{digest}",
      lambda out: synthetic.generate(rows, out, seed=seed,
                                     rows_per_file=rows_per_file))
  return sorted(str(p) for p in target.glob("part-*.tsv"))


def real_data_dir() -> pathlib.Path | None:
  """The folder of the real Criteo sample, if there is one.

  Looked for in order: `$INTUNE_CRITEO_DATA`, `../shared/data/criteo` from the
  working directory, and `shared/data/criteo` beside the source checkout
  (for an editable install).

  Returns:
    The folder, or None.
  """
  candidates = []
  env = os.environ.get(REAL_DATA_ENV)
  if env:
    candidates.append(pathlib.Path(env))
  candidates.append(pathlib.Path.cwd().parent / "shared" / "data" / "criteo")
  candidates.append(pathlib.Path(__file__).resolve().parents[2] / "shared"
                    / "data" / "criteo")
  for path in candidates:
    if path.is_dir() and any(path.glob("*.tsv")):
      return path
  return None


def real_sample_files() -> list[str] | None:
  """The real sample's data files (`*.tsv`, sorted), or None when absent."""
  folder = real_data_dir()
  if folder is None:
    return None
  return sorted(str(p) for p in folder.glob("*.tsv"))
