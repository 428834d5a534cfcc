"""Scalers carry out a pool controller's decision (`Scaler`):
`workers.LocalWorkers` (this host's processes), `CommandScaler` (a shell
command), `CallbackScaler` (a Python callable), `LocalFirst` (two as tiers).
"""

from __future__ import annotations

import contextlib
import numbers
import os
import re
import signal
import subprocess
import tempfile
import time
from typing import Callable

from absl import logging

from intune_tf.service import controllers

# Seconds a scale command may run, and a worker it asked for may take to
# register before it is given up (`CommandScaler.give_up_unstarted`).
DEFAULT_COMMAND_TIMEOUT_S = 60.0
DEFAULT_START_TIMEOUT_S = 300.0
# The kinds of pool `intune service dispatcher --workers KIND:MIN-MAX` sizes,
# and a scale command as the messages show one.
POOL_KINDS = ("local", "command")
EXAMPLE_COMMAND = "kubectl scale deployment/tfdata-workers --replicas={n}"
_SPEC = re.compile(r"^([a-z]+):(-?\d+)-(-?\d+)$")


class ScalerError(RuntimeError):
  """A resize failed; the pool is as it was."""


def parse_pool_spec(text: str, kinds: tuple[str, ...] = POOL_KINDS
                    ) -> tuple[str, int, int]:
  """(KIND, MIN, MAX) of a "KIND:MIN-MAX" pool, KIND one of `kinds`
  (default `POOL_KINDS`): parse_pool_spec("command:2-64") = ("command", 2,
  64).

  Raises:
    ValueError: not of that form, or bad bounds (the message says what to
      pass).
  """
  forms = " or ".join(f"{k}:MIN-MAX" for k in kinds)
  match = _SPEC.match(text.strip()) if isinstance(text, str) else None
  if not match or match.group(1) not in kinds:
    raise ValueError(f"a worker pool must be {forms} with 1 <= MIN <= MAX "
                     f"(for example {kinds[0]}:1-4), got {text!r}.")
  low, high = int(match.group(2)), int(match.group(3))
  try:
    controllers.check_bounds(low, high)
  except ValueError as e:
    raise ValueError(f"{text.strip()!r}: {str(e).rstrip('.')}; pass {forms} "
                     "with 1 <= MIN <= MAX.") from None
  return match.group(1), low, high


def check_template(template: str) -> str:
  """`template` if it is a scale command with `{n}` where the count goes,
  else raises ValueError."""
  if not isinstance(template, str) or "{n}" not in template:
    raise ValueError(
        f"the scale command must contain {{n}} where the count goes (for "
        f"example '{EXAMPLE_COMMAND}'), got {template!r}.")
  return template


class Scaler(controllers.PoolBounds):
  """A pool of workers that can be resized within [MIN, MAX] (ValueError
  outside, before anything runs); a failed change raises one `ScalerError`
  and leaves the pool as it was. `min_workers` and `max_workers` are
  `PoolBounds`'.

  Args:
    initial: the workers the pool has now. Default None: MIN.
  """

  kind = "scaler"
  # Workers that left the pool on their own (died, were killed); 0 for a
  # scaler that cannot tell.
  lost = 0

  def __init__(self, min_workers: int, max_workers: int,
               initial: int | None = None):
    super().__init__(min_workers, max_workers)
    self._size = min_workers if initial is None else initial

  def size(self) -> int:
    """Workers asked for (serving or starting)."""
    return self._size

  def serving(self) -> int:
    """Workers up and serving (default: all asked for)."""
    return self.size()

  def standby_count(self) -> int:
    """Warm processes ready to join, not in `size()` (default: none)."""
    return 0

  def resize(self, n: int) -> None:
    """Makes the pool `n` workers.

    Raises:
      ValueError: `n` outside [MIN, MAX] (nothing changes).
      ScalerError: the change failed (the pool is as it was).
    """
    n = self._check_count(n)
    if n != self.size():
      self._resize(n)

  def _check_count(self, n: int) -> int:
    count = controllers.integer(n)
    if count is None or not self.min_workers <= count <= self.max_workers:
      raise ValueError(f"cannot resize the pool to {n!r} workers: it must "
                       f"stay within MIN {self.min_workers} and MAX "
                       f"{self.max_workers}.")
    return count

  def _resize(self, n: int) -> None:
    """Makes the pool `n` workers, within [MIN, MAX] or 0 (a `LocalFirst`
    tier not needed), or raises ScalerError."""
    raise NotImplementedError

  def give_up_unstarted(self) -> int:
    """Gives up the workers asked for that never started serving, and
    returns their count (default: 0, it cannot tell)."""
    return 0

  def replace_lost(self) -> list[int]:
    """Replaces the workers that died on their own since the last resize,
    and returns the ports of those started (default: [], it cannot)."""
    return []

  def close(self) -> None:
    """Releases what the scaler holds (default: nothing)."""


class CallbackScaler(Scaler):
  """Calls `callback(n)`, which raises if the change failed; the pool is `n`
  once it returns. The other arguments are `Scaler`'s."""

  kind = "callback"

  def __init__(self, callback: Callable[[int], object], min_workers: int,
               max_workers: int, initial: int | None = None):
    super().__init__(min_workers, max_workers, initial)
    self._callback = callback

  def _resize(self, n: int) -> None:
    try:
      self._callback(n)
    except Exception as e:  # any failure of user code, re-raised
      raise ScalerError(f"the scale callback failed for {n} workers: "
                        f"{type(e).__name__}: {e}; the pool stays at "
                        f"{self._size}.") from e
    self._size = n


class CommandScaler(Scaler):
  """Runs a shell command with `{n}` replaced by the count (e.g. `kubectl
  scale ... --replicas={n}`); `min_workers`, `max_workers` and `initial`
  are `Scaler`'s.

  Args:
    template: the command, with `{n}` where the count goes.
    timeout_s: seconds the command may run; then it (and its children) is
      killed and the resize fails. Default 60.
    serving: counts the workers up (for example those registered with the
      dispatcher); `serving()` is the smaller of it and `size()`. Default
      None: every worker asked for serves once the command returns.
    start_timeout_s: seconds a worker asked for may take to serve before
      `give_up_unstarted` gives it up. Default 300.

  Raises:
    ValueError: no `{n}` in the template, or a timeout that is not a finite
      positive number.
  """

  kind = "command"

  def __init__(self, template: str, min_workers: int, max_workers: int,
               initial: int | None = None,
               timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
               serving: Callable[[], int] | None = None,
               start_timeout_s: float = DEFAULT_START_TIMEOUT_S):
    super().__init__(min_workers, max_workers, initial)
    check_template(template)
    for what, value in (("timeout", timeout_s),
                        ("start timeout", start_timeout_s)):
      if (isinstance(value, bool) or not isinstance(value, numbers.Real) or
          not 0 < value < 1e9):
        raise ValueError(f"the scale command's {what} must be finite "
                         f"seconds above 0, got {value!r}.")
    self.template = template
    self.timeout_s = float(timeout_s)
    self.start_timeout_s = float(start_timeout_s)
    self._serving = serving
    self._resized_at = time.monotonic()

  def serving(self) -> int:
    if self._serving is None:
      return self._size
    return max(0, min(self._size, int(self._serving())))

  def give_up_unstarted(self) -> int:
    """Gives up (and counts) the workers asked for that have not registered
    `start_timeout_s` after the command returned."""
    serving = self.serving()
    if (serving >= self._size or
        time.monotonic() - self._resized_at < self.start_timeout_s):
      return 0
    missing, self._size = self._size - serving, serving
    self._resized_at = time.monotonic()
    return missing

  def command(self, n: int) -> str:
    """The command for `n` workers."""
    return self.template.replace("{n}", str(int(n)))

  def _resize(self, n: int) -> None:
    command = self.command(n)
    # Its output goes to files, not pipes: workers it starts in the
    # background keep them open, and the command is done when its shell is.
    with tempfile.TemporaryFile() as out:
      proc = subprocess.Popen(["/bin/sh", "-c", command],
                              stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT,
                              start_new_session=True)
      try:
        proc.wait(timeout=self.timeout_s)
      except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
          os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise ScalerError(
            f"the scale command `{command}` did not finish within "
            f"{self.timeout_s:g} s and was killed; the pool stays at "
            f"{self._size}.") from None
      if proc.returncode != 0:
        out.seek(max(0, out.seek(0, os.SEEK_END) - 300))
        tail = out.read().decode(errors="replace").strip()
        raise ScalerError(
            f"the scale command `{command}` failed (exit status "
            f"{proc.returncode}): {tail or 'no output'}; the pool stays at "
            f"{self._size}.")
    self._size = n
    self._resized_at = time.monotonic()


class LocalFirst(Scaler):
  """The trainer host's own workers first, remote ones for the rest.

  A pool of n workers is `local` filled to its MAX (the workers the host's
  CPUs allow beside the trainer) and `remote` holding what is left (0 while
  the host suffices, whatever `remote`'s MIN: a tier not needed is not paid
  for). A shrink gives the remote workers back first. When one tier's
  change fails, the other is put back. The pool's MIN is `local`'s, its MAX
  the sum of both MAXes.

  Args:
    local: the host's workers, e.g. `LocalWorkers(..., 1, k)`.
    remote: the workers beyond it, e.g. a `CommandScaler` whose command
      scales a cluster's deployment.
  """

  kind = "local-first"

  def __init__(self, local: Scaler, remote: Scaler):
    super().__init__(local.min_workers,
                     local.max_workers + remote.max_workers)
    self.local = local
    self.remote = remote

  @property
  def lost(self) -> int:  # the Scaler attribute, summed over the tiers
    return self.local.lost + self.remote.lost

  def split(self, n: int) -> tuple[int, int]:
    """(local, remote) workers of a pool of `n`: local first.
    split(5) with local 1-3 = (3, 2); split(2) = (2, 0)."""
    local = min(n, self.local.max_workers)
    return local, n - local

  def size(self) -> int:
    return self.local.size() + self.remote.size()

  def serving(self) -> int:
    return self.local.serving() + self.remote.serving()

  def standby_count(self) -> int:
    return self.local.standby_count() + self.remote.standby_count()

  def _resize(self, n: int) -> None:
    local, remote = self.split(n)
    before = (self.local.size(), self.remote.size())
    # Growing: the host first; shrinking: the remote tier first.
    steps = ([(self.local, local), (self.remote, remote)] if n > sum(before)
             else [(self.remote, remote), (self.local, local)])
    done = []
    for scaler, count in steps:
      was = before[0] if scaler is self.local else before[1]
      if count == was:
        continue
      try:
        scaler._resize(count)  # noqa: SLF001 (the remote tier: maybe 0)
      except ScalerError as e:
        for undo, back in done:
          try:
            undo._resize(back)  # noqa: SLF001
          except ScalerError as again:
            logging.error("Putting the %s tier back to %d failed too: %s",
                          undo.kind, back, again)
        raise ScalerError(f"the {scaler.kind} tier failed ({e}); the pool "
                          f"stays at {sum(before)}.") from e
      done.append((scaler, was))

  def start(self, n: int) -> None:
    """`resize(n)` at start, the remote tier set to its share whatever it
    held before (a deployment an earlier run left scaled up is scaled
    back); when that fails (ScalerError), no local worker starts."""
    n = self._check_count(n)
    local, remote = self.split(n)
    try:
      self.remote._resize(remote)  # noqa: SLF001 (below its MIN: 0)
    except ScalerError as e:
      raise ScalerError(f"the {self.remote.kind} tier failed at start "
                        f"({e}); no local worker was started.") from e
    self.local.resize(local)

  def give_up_unstarted(self) -> int:
    return self.local.give_up_unstarted() + self.remote.give_up_unstarted()

  def replace_lost(self) -> list[int]:
    return self.local.replace_lost() + self.remote.replace_lost()

  def close(self) -> None:
    self.remote.close()
    self.local.close()
