"""Real memory cgroups for tests: a child cgroup under this process's own.

A child cgroup with its own memory limit is what Slurm, Kubernetes or
`systemd-run -p MemoryMax=` give a job. Tests start a Python process inside
one (`MemoryCgroup.run`) and read back what the kernel recorded: the peak
usage and the OOM kills. Where no memory cgroup can be made or limited here,
`memory_cgroup` skips the test with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import subprocess
import threading
from typing import Iterator, Mapping, Sequence
import uuid

import pytest

from intune_tf import host

# Memory a child Python process needs to import TensorFlow (about 250 MiB of
# its own, plus the page cache of its libraries, which the cgroup counts).
TF_IMPORT_BYTES = 768 << 20


@dataclasses.dataclass
class Run:
  """How a process run in a cgroup ended.

  Attributes:
    returncode: the exit status; -N when signal N ended it (-9: SIGKILL, as
      the OOM killer sends).
    stdout: what it printed.
    stderr: what it printed on stderr.
    max_rss: its largest resident set size, bytes (from wait4).
  """
  returncode: int
  stdout: str
  stderr: str
  max_rss: int


@dataclasses.dataclass
class MemoryCgroup:
  """A child memory cgroup (v1 or v2) with a limit.

  Attributes:
    path: its directory.
    limit: its memory limit, bytes.
    v2: whether it is a cgroup v2 one (memory.max) rather than v1
      (memory.limit_in_bytes).
  """
  path: pathlib.Path
  limit: int
  v2: bool

  def enter(self) -> None:
    """Moves the calling process into this cgroup (a `preexec_fn`)."""
    with open(self.path / "cgroup.procs", "w") as f:
      f.write(str(os.getpid()))

  def peak(self) -> int | None:
    """Its peak memory usage so far, bytes (v2 memory.peak, which kernels
    before 5.19 lack; v1 memory.max_usage_in_bytes), or None."""
    name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
    try:
      return int((self.path / name).read_text())
    except (OSError, ValueError):
      return None

  def oom_kills(self) -> int | None:
    """Processes the OOM killer killed in it so far (the `oom_kill` line of
    memory.events in v2, of memory.oom_control in v1), or None where the
    kernel does not count them."""
    name = "memory.events" if self.v2 else "memory.oom_control"
    try:
      for line in (self.path / name).read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
          return int(value)
    except (OSError, ValueError):
      pass
    return None

  def run(self, args: Sequence[str], cwd: str | os.PathLike[str],
          env: Mapping[str, str] | None = None,
          timeout: float = 300.0) -> Run:
    """Runs `args` inside this cgroup and waits for it.

    Skips the test when the process cannot be moved into the cgroup.

    Args:
      args: the command.
      cwd: its working directory.
      env: its environment (default: this process's).
      timeout: seconds before it is killed and `subprocess.TimeoutExpired`
        raised.

    Returns:
      How it ended.
    """
    out_path = pathlib.Path(cwd) / f"cgroup-run-{uuid.uuid4().hex[:8]}"
    with open(f"{out_path}.out", "w+") as out, open(f"{out_path}.err",
                                                     "w+") as err:
      try:
        process = subprocess.Popen(args, preexec_fn=self.enter, stdout=out,
                                   stderr=err, cwd=cwd, env=env)
      except subprocess.SubprocessError as e:
        if "preexec_fn" not in str(e):
          raise
        pytest.skip(f"cannot move a process into {self.path}: {e}")
      # wait4 gives the child's own rusage (its max RSS), even when a signal
      # ended it.
      timer = threading.Timer(timeout, process.kill)
      timer.start()
      try:
        _, status, usage = os.wait4(process.pid, 0)
      finally:
        timed_out = not timer.is_alive()
        timer.cancel()
      process.returncode = os.waitstatus_to_exitcode(status)
      if timed_out:
        raise subprocess.TimeoutExpired(args, timeout)
      out.seek(0)
      err.seek(0)
      return Run(process.returncode, out.read(), err.read(),
                 usage.ru_maxrss * 1024)


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[MemoryCgroup]:
  """A new child cgroup of this process's own memory cgroup, limited to
  `limit` bytes; removed afterwards.

  Skips the test when no memory controller is mounted, or the cgroup cannot
  be made or limited here (no write access; v2 without memory in the
  parent's cgroup.subtree_control).
  """
  own = host.cgroup_dirs("memory")
  if not own:
    pytest.skip("no memory cgroup controller is mounted here")
  path = pathlib.Path(own[0]) / f"intune-test-{uuid.uuid4().hex[:8]}"
  v2 = (pathlib.Path(own[0]) / "cgroup.controllers").exists()
  try:
    path.mkdir()
  except OSError as e:
    pytest.skip(f"cannot make a child cgroup under {own[0]}: {e}")
  try:
    try:
      (path / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(
          str(limit))
    except OSError as e:  # v2 without memory in the parent's subtree_control
      pytest.skip(f"cannot limit the memory of a child cgroup here: {e}")
    yield MemoryCgroup(path, limit, v2)
  finally:
    for _ in range(50):  # the child's exit leaves the cgroup empty shortly
      try:
        path.rmdir()
        break
      except OSError:
        threading.Event().wait(0.1)
