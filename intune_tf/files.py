"""Atomic file writes: the one way intune_tf replaces a file.

A leaf module (standard library only) shared by the status files, warm-start
records, agent weights and the synthetic Criteo writer.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile
from typing import IO, Any, Iterator, Mapping


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, binary: bool = False
                 ) -> Iterator[IO[Any]]:
  """Opens a temporary file beside `path`; renames it over `path` on success.

  Readers see the old file or the new one, never half of one. The temporary
  file has a unique name (concurrent writers of one path never share it) and
  mode 0600, and is removed if the block raises. Missing parent folders are
  created.

  Args:
    path: The file to write.
    binary: Open the temporary file in binary mode. Default False (text).

  Yields:
    The open temporary file.
  """
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                             dir=path.parent)
  try:
    with os.fdopen(fd, "wb" if binary else "w") as f:
      yield f
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def write_json(path: str | os.PathLike, data: Mapping[str, Any]) -> None:
  """Writes `data` as JSON (sorted keys) to `path` with `atomic_write`."""
  with atomic_write(path) as f:
    json.dump(data, f, sort_keys=True)

