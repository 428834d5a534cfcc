"""Tests of intune_tf.files (atomic writes)."""

import json
import os
import stat

import pytest

from intune_tf import files


def test_write_json_replaces_the_file_and_leaves_no_temporary(tmp_path):
  path = tmp_path / "sub" / "a.json"  # the folder is created
  files.write_json(path, {"b": 1, "a": 2})
  files.write_json(path, {"c": 3})
  assert json.loads(path.read_text()) == {"c": 3}
  assert os.listdir(path.parent) == ["a.json"]
  assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_failed_write_keeps_the_old_file(tmp_path):
  path = tmp_path / "w.bin"
  path.write_bytes(b"old")
  with pytest.raises(RuntimeError, match="disk"):
    with files.atomic_write(path, binary=True) as f:
      f.write(b"half of the new")
      raise RuntimeError("disk full")
  assert path.read_bytes() == b"old"
  assert os.listdir(tmp_path) == ["w.bin"]


def test_two_open_writes_of_one_path_do_not_share_a_temporary(tmp_path):
  path = tmp_path / "x.txt"
  with files.atomic_write(path) as a, files.atomic_write(path) as b:
    assert a.name != b.name
    a.write("a")
    b.write("b")
  assert path.read_text() == "a"  # `b` closes first; `a` renames last

