"""Shared test fixtures."""

import os
import pathlib
import tempfile

import pytest

# Each test process shares the host only with the processes it starts: the
# suites that other checkouts or the other stack run at the same time keep
# their own leases (`intune_tf.arbiter`).
os.environ.setdefault("INTUNE_HOST_DIR",
                      tempfile.mkdtemp(prefix="intune-host-test-"))
# Nor do they share warm-start state or status files, with each other or with
# the user's own jobs (~/.cache/intune_tf).
os.environ.setdefault("INTUNE_WARMSTART_DIR",
                      tempfile.mkdtemp(prefix="intune-warmstart-test-"))
os.environ.setdefault("INTUNE_STATUS_DIR",
                      tempfile.mkdtemp(prefix="intune-status-test-"))

# The real Criteo sample lives beside the repository, never inside it.
CRITEO_REAL_DIR = (pathlib.Path(__file__).resolve().parents[1].parent
                   / "shared" / "data" / "criteo")


@pytest.fixture
def criteo_real_dir() -> pathlib.Path:
  """../shared/data/criteo, or skip when this checkout has no shared data."""
  if not (CRITEO_REAL_DIR / "criteo_sample_10k.tsv").is_file():
    pytest.skip(f"real Criteo sample not found at {CRITEO_REAL_DIR} (it sits "
                "beside the repository, in ../shared/data/criteo)")
  return CRITEO_REAL_DIR
