"""A picture comparing real and synthetic Criteo statistics."""

from __future__ import annotations

import os
import tempfile
from typing import Sequence

import numpy as np

from intune_tf.criteo import schema
from intune_tf.criteo import synthetic

DEFAULT_DENSE = ("I1", "I2", "I5", "I13")
DEFAULT_SPARSE = ("C3", "C6", "C16")


def _signed_log(x: np.ndarray) -> np.ndarray:
  return np.sign(x) * np.log1p(np.abs(x))


def compare(real: str,
            out_png: str | os.PathLike,
            synthetic_file: str | None = None,
            *,
            seed: int = 0,
            dense_columns: Sequence[str] = DEFAULT_DENSE,
            sparse_columns: Sequence[str] = DEFAULT_SPARSE) -> dict[str, float]:
  """Plots real against synthetic distributions into a PNG.

  Panels: per-column missing rates; histograms of `sign(x) * log1p(|x|)` for
  `dense_columns`; rank-frequency curves (log-log) for `sparse_columns`.

  Args:
    real: A real labelled dac-layout file.
    out_png: The PNG to write.
    synthetic_file: A synthetic file to compare (default None: generate as
      many rows as `real` has from the packaged parameters).
    seed: Generator seed when generating (default 0).
    dense_columns: Integer columns to plot (default I1, I2, I5, I13).
    sparse_columns: Categorical columns to plot (default C3, C6, C16).

  Returns:
    `{"max_missing_rate_gap": ..., "real_label_rate": ...,
    "synthetic_label_rate": ...}`.
  """
  # Deferred: optional, from the [bench] extra.
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  # Deferred: optional, from the [bench] extra.
  import matplotlib.pyplot as plt  # noqa: PLC0415

  r_label, r_dense, r_sparse = synthetic.load_columns(real)
  if synthetic_file is None:
    with tempfile.TemporaryDirectory() as tmp:
      path = synthetic.generate(r_label.size, tmp, seed=seed)[0]
      s_label, s_dense, s_sparse = synthetic.load_columns(path)
  else:
    s_label, s_dense, s_sparse = synthetic.load_columns(
        synthetic_file, max_rows=r_label.size)
  r_missing = synthetic.missing_rates(r_dense, r_sparse)
  s_missing = synthetic.missing_rates(s_dense, s_sparse)

  panels = 1 + len(dense_columns) + len(sparse_columns)
  cols = 4
  rows = -(-panels // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows))
  axes = np.asarray(axes).ravel()
  names = list(schema.DENSE_NAMES) + list(schema.SPARSE_NAMES)
  x = np.arange(len(names))
  ax = axes[0]
  ax.bar(x - 0.2, r_missing, 0.4, label="real")
  ax.bar(x + 0.2, s_missing, 0.4, label="synthetic")
  ax.set_xticks(x[::3], names[::3], rotation=90, fontsize=7)
  ax.set_title("missing rate per column")
  ax.legend(fontsize=7)
  i = 1
  for name in dense_columns:
    j = schema.DENSE_NAMES.index(name)
    rv = _signed_log(r_dense[:, j][~np.isnan(r_dense[:, j])])
    sv = _signed_log(s_dense[:, j][~np.isnan(s_dense[:, j])])
    lo = min(rv.min(initial=0), sv.min(initial=0))
    hi = max(rv.max(initial=1), sv.max(initial=1))
    bins = np.linspace(lo, hi, 40)
    axes[i].hist(rv, bins, density=True, alpha=0.5, label="real")
    axes[i].hist(sv, bins, density=True, alpha=0.5, label="synthetic")
    axes[i].set_title(f"{name}: sign(x) log1p|x|")
    axes[i].legend(fontsize=7)
    i += 1
  for name in sparse_columns:
    j = schema.SPARSE_NAMES.index(name)
    rc = synthetic.rank_counts(r_sparse[:, j])
    sc = synthetic.rank_counts(s_sparse[:, j])
    axes[i].loglog(np.arange(1, rc.size + 1), rc, label=f"real ({rc.size} ids)")
    axes[i].loglog(np.arange(1, sc.size + 1), sc,
                   label=f"synthetic ({sc.size} ids)")
    axes[i].set_title(f"{name}: rank-frequency")
    axes[i].set_xlabel("rank")
    axes[i].legend(fontsize=7)
    i += 1
  for ax in axes[i:]:
    ax.axis("off")
  fig.suptitle(f"Criteo real ({os.path.basename(real)}, {r_label.size} rows, "
               f"label rate {r_label.mean():.3f}) vs synthetic "
               f"({s_label.size} rows, label rate {s_label.mean():.3f})")
  fig.tight_layout()
  fig.savefig(out_png, dpi=90)
  plt.close(fig)
  return {"max_missing_rate_gap": float(np.abs(r_missing - s_missing).max()),
          "real_label_rate": float(r_label.mean()),
          "synthetic_label_rate": float(s_label.mean())}
