"""Throughput of the L1-L5 pipelines: warm-up, then the median of windows."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Iterable, Mapping, Sequence

from intune_tf.criteo import pipelines


@dataclasses.dataclass(frozen=True)
class BenchResult:
  """One level's throughput.

  Attributes:
    level: Pipeline level.
    stages: Its stage names.
    rows_per_s: Median over the windows.
    window_rows_per_s: Each window's rows/s.
  """
  level: int
  stages: tuple[str, ...]
  rows_per_s: float
  window_rows_per_s: tuple[float, ...]


def measure(level: int,
            files: Sequence[str],
            *,
            batch_size: int = 4096,
            warmup_batches: int = 10,
            window_batches: int = 10,
            windows: int = 5,
            parallelism: Mapping[str, int] | None = None) -> BenchResult:
  """Times one pipeline level over `files` (cycled forever).

  Args:
    level: 1..5.
    files: Criteo text files.
    batch_size: Rows per batch (default 4096).
    warmup_batches: Batches drawn before timing (default 10).
    window_batches: Batches per timed window (default 10).
    windows: Timed windows; the median is reported (default 5).
    parallelism: Fixed stage parallelism (default None: all AUTOTUNE).

  Returns:
    The `BenchResult`.
  """
  ds = pipelines.pipeline(level, files, batch_size=batch_size,
                          parallelism=parallelism, repeat=True, seed=0,
                          drop_remainder=True)
  it = iter(ds)
  for _ in range(warmup_batches):
    next(it)
  rates = []
  for _ in range(windows):
    start = time.perf_counter()
    for _ in range(window_batches):
      next(it)
    rates.append(window_batches * batch_size / (time.perf_counter() - start))
  return BenchResult(level, pipelines.STAGES[level], statistics.median(rates),
                     tuple(rates))


def markdown_table(results: Iterable[BenchResult], batch_size: int) -> str:
  """Formats results as a Markdown table."""
  lines = [
      f"| level | stages | rows/s (median) | min-max rows/s | ms/batch of "
      f"{batch_size} |",
      "|---|---|---:|---:|---:|",
  ]
  for r in results:
    lines.append(
        f"| L{r.level} | {' > '.join(r.stages)} | {r.rows_per_s:,.0f} | "
        f"{min(r.window_rows_per_s):,.0f}-{max(r.window_rows_per_s):,.0f} | "
        f"{1000 * batch_size / r.rows_per_s:.1f} |")
  return "\n".join(lines)
