"""Real memory cgroups for the benchmarks: a child of this process's own.

`memory_cgroup(limit)` makes one limited to `limit` bytes (cgroup v2
`memory.max` with swap 0, or v1 `memory.limit_in_bytes`); a process joins it
by writing its pid to `cgroup.procs`. `peak` and `oom_kills` read back what
the kernel recorded.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import time


def own_memory_cgroup() -> pathlib.Path:
  """This process's memory cgroup directory (v2 unified, or v1 memory)."""
  with open("/proc/self/cgroup") as f:
    lines = [line.rstrip("\n").split(":", 2) for line in f]
  for _, controllers, path in lines:
    if "memory" in controllers.split(","):
      return pathlib.Path("/sys/fs/cgroup/memory") / path.lstrip("/")
  for hierarchy, controllers, path in lines:
    if hierarchy == "0" and not controllers:
      return pathlib.Path("/sys/fs/cgroup") / path.lstrip("/")
  raise OSError("no memory cgroup found in /proc/self/cgroup")


@contextlib.contextmanager
def memory_cgroup(limit: int, tag: str = "intune-bench"):
  """A child of this process's memory cgroup limited to `limit` bytes,
  named `tag`-pid: (its path, whether it is cgroup v2)."""
  own = own_memory_cgroup()
  v2 = (own / "cgroup.controllers").exists()
  if not v2 and not (own / "memory.limit_in_bytes").exists():
    raise OSError(f"{own} is not a memory cgroup")
  path = own / f"{tag}-{os.getpid()}"
  path.mkdir()
  try:
    if v2:
      (path / "memory.max").write_text(str(limit))
      with contextlib.suppress(OSError):
        (path / "memory.swap.max").write_text("0")
    else:
      (path / "memory.limit_in_bytes").write_text(str(limit))
    yield path, v2
  finally:
    for _ in range(50):
      try:
        path.rmdir()
        break
      except OSError:
        time.sleep(0.1)


def peak(path: pathlib.Path, v2: bool) -> int:
  name = "memory.peak" if v2 else "memory.max_usage_in_bytes"
  try:
    return int((path / name).read_text())
  except (OSError, ValueError):
    return 0


def oom_kills(path: pathlib.Path, v2: bool) -> int:
  name = "memory.events" if v2 else "memory.oom_control"
  for line in (path / name).read_text().splitlines():
    if line.startswith("oom_kill "):
      return int(line.split()[1])
  return 0
