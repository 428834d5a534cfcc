"""The host arbiter: the InTune processes of one host share one CPU budget and
one RAM budget, with no server to run.

Each process whose sessions have `IntuneOptions.host_share` on keeps a lease:
one small JSON file, `<pid>.json`, in a folder of its user's
(`$INTUNE_HOST_DIR`, else `/dev/shm/intune-<uid>`, made with mode 0700),
rewritten atomically (a temporary file, then `os.replace`; mode 0600) by the
tuner's budget pass every second. The file holds the process's pid, uid,
start time, weight, demand (rows/s, the CPUs it keeps busy, the CPUs it can
use, its buffered bytes), the share it took, the CPUs it was given and the
ones it is confined to, and a heartbeat. Every process
reads every lease at each pass and splits the host with the same rule
(`split_cpus`, `whole_cpus`, `split_ram`), so the shares agree without a
coordinator. A lease whose heartbeat is older than `LEASE_S` or whose pid is
gone is ignored (and removed): the share of a `kill -9`-ed process returns
within `LEASE_S` plus one pass.

The rule.

- CPUs, weighted max-min with a floor. Each process i of weight w_i has a
  fair share `C * w_i / W` of the host's C usable CPUs (W the total weight)
  and is always given at least `CPU_FLOOR` (0.5) of it. Above that floor the
  CPUs are water-filled by weight, each process capped at the CPUs it can
  use: a consumer-bound process (its consumer, not its pipeline, is the
  slowest) can use `DEMAND_HEADROOM` (1.25) x the CPUs it keeps busy; an
  input-bound one, or one not yet measured, can use any number. CPUs a
  process cannot use go to the others, so no CPU idles while a pipeline
  waits for one (the most total throughput that keeps the floor), and
  pipelines that all want more get shares in proportion to their weights.
  The shares are then made whole (`whole_cpus`: largest remainders, at
  least 1 each, as a pipeline needs a thread).
- Placement. The whole shares are dealt out over the host's CPUs in pid
  order (`place_cpus`), and a process whose pipelines are the slower side
  (input-bound) and whose every session shares the host runs on its own
  CPUs only (`confine_to`, `host.place_process`: the affinity of every
  thread but Python's),
  when every sharing process was given the same CPUs (else their deals
  could overlap, and none is confined).
  A share that is only a thread count leaves the kernel to split the CPUs
  among all the processes' threads, and each job's threads to move between
  all the CPUs (docs/host.md has the figures). A consumer-bound process is
  not confined (its model's training needs CPUs its pipelines' demand does
  not count), nor a process alone: it gets its CPUs back within a lease
  when the others go.
- RAM, by weight. The host's pool is `DEFAULT_RAM_SHARE` of what the
  processes could use (the memory available now, capped by the cgroup's
  headroom, plus what every process's buffers hold), at most the memory
  limit (the cgroup's, else the machine's); process i gets `w_i / W` of it,
  so the budgets never sum above the limit.

Safety. Only the user's own folder (a directory, not a link, of the same
uid, not writable by others) is used; otherwise sharing is off with one
warning and each process budgets as if alone. A lease that is not a regular
file (a FIFO is never opened), a link, owned by another uid, writable by
others, larger than `MAX_ENTRY_BYTES`, not JSON, or with wrong fields is
ignored with one warning per entry: a field of the wrong type or out of
range, a `pid` that is not a process id (`host.is_pid`: the OS is never
asked about -1, 0 or 2**70), a heartbeat in the future. A bad lease never
stops the arbiter or `intune inspect`.

Standard library, psutil and absl only: `intune inspect` reads the leases
without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import numbers
import os
import pathlib
import stat
import tempfile
import threading
import time
from typing import Sequence

from absl import logging
import psutil

from intune_tf import files
from intune_tf import host

FORMAT = "intune_tf.host/1"
ENV_DIR = "INTUNE_HOST_DIR"
# A lease whose heartbeat is older than this (s) is ignored.
LEASE_S = 3.0
# Each process is given at least this fraction of its fair CPU share.
CPU_FLOOR = 0.5
# A consumer-bound process can use this many times the CPUs it keeps busy.
DEMAND_HEADROOM = 1.25
# Largest lease file read (bytes); a lease is about 400.
MAX_ENTRY_BYTES = 4096
# Largest `IntuneOptions.host_weight`.
MAX_WEIGHT = 1e6
# CPU numbers of a lease are below this (Linux's NR_CPUS is at most 8192).
MAX_CPU_ID = 1 << 16


def fair_shares(total: float, weights: Sequence[float]) -> list[float]:
  """`total` split in proportion to `weights` (all positive).

  Example: 2 CPUs, weights [1, 3] -> [2 * 1/4, 2 * 3/4] = [0.5, 1.5].
  """
  weight = float(sum(weights))
  return [total * w / weight for w in weights]


def water_fill(total: float, weights: Sequence[float],
               caps: Sequence[float]) -> list[float]:
  """Weighted max-min: `total` split in proportion to `weights`, none above
  its cap; what a capped entry cannot take goes to the others by weight.
  Whatever every cap leaves over is split by weight again (the sum is
  always `total`).

  Example: 2, weights [1, 1], caps [0.5, inf]: equal shares 1 and 1; the
  first is capped at 0.5, its 0.5 goes to the second -> [0.5, 1.5].
  """
  n = len(weights)
  shares = [0.0] * n
  open_ = set(range(n))
  left = float(total)
  while open_ and left > 1e-12:
    weight = sum(weights[i] for i in open_)
    capped = [i for i in open_
              if caps[i] - shares[i] <= left * weights[i] / weight]
    if not capped:
      for i in open_:
        shares[i] += left * weights[i] / weight
      left = 0.0
      break
    for i in capped:
      left -= caps[i] - shares[i]
      shares[i] = caps[i]
      open_.discard(i)
  if left > 1e-12:  # every cap reached: the spare CPUs go by weight
    shares = [s + f for s, f in zip(shares, fair_shares(left, weights))]
  return shares


def split_cpus(cpus: float, weights: Sequence[float],
               wanted: Sequence[float | None],
               floor: float = CPU_FLOOR) -> list[float]:
  """Each process's share of `cpus` (the module's rule): weighted max-min
  capped by the CPUs each can use, never below `floor` x its fair share.

  Args:
    cpus: the host's usable CPUs.
    weights: each process's weight (positive).
    wanted: the CPUs each process can use (None: any number).
    floor: fraction of the fair share always given. Default CPU_FLOOR (0.5).

  Returns:
    One share per process (CPUs, fractional), summing to `cpus`.

  Example: 4 CPUs, weights [1, 1, 2], wanted [0.2, None, None]: fair
  [1, 1, 2], floors [0.5, 0.5, 1]; caps max(wanted, floor) = [0.5, inf,
  inf]; water-filling gives [0.5, 3.5 / 3, 7 / 3] = [0.5, 1.167, 2.333].
  """
  if not weights:
    return []
  floors = [floor * f for f in fair_shares(cpus, weights)]
  caps = [math.inf if w is None else max(float(w), lo)
          for w, lo in zip(wanted, floors)]
  return water_fill(cpus, weights, caps)


def whole_cpus(shares: Sequence[float], cpus: int) -> list[int]:
  """Fractional CPU shares made whole: each rounded down, the `cpus` left
  given one by one to the largest remainders (ties to the earlier entry),
  then each at least 1.

  Examples: [0.5, 1.5] of 2 -> floors [0, 1], 1 left, remainders tie -> [1,
  1]; [0.5, 1.167, 2.333] of 4 -> floors [0, 1, 2], 1 left to the largest
  remainder (0.5) -> [1, 1, 2]; [0.5] * 4 of 2 -> [1, 1, 0, 0] -> [1, 1, 1,
  1].
  """
  whole = [int(math.floor(s + 1e-9)) for s in shares]
  left = int(cpus) - sum(whole)
  order = sorted(range(len(shares)), key=lambda i: (whole[i] - shares[i], i))
  for i in order[:max(0, left)]:
    whole[i] += 1
  return [max(1, w) for w in whole]


def place_cpus(whole: Sequence[int], index: int,
               cpu_ids: Sequence[int]) -> list[int]:
  """The CPUs process `index` runs on: the host's `cpu_ids` dealt out in
  order, `whole[i]` to each process i in turn, starting over at the first
  when they run out (more processes than CPUs share them).

  Examples: whole [1, 1] of CPUs [0, 1]: process 1 -> [1]; whole [1, 2] of
  [0, 1, 2]: process 1 -> [1, 2]; whole [1, 1, 1, 1] of [0, 1]: process 2
  starts at 1 + 1 = 2, past the end -> [0].
  """
  n = len(cpu_ids)
  start = sum(whole[:index])
  return sorted({cpu_ids[(start + k) % n]
                 for k in range(min(whole[index], n))})


def ram_pool(available: int, buffered: int, limit: int,
             share: float) -> int:
  """The bytes the host's processes may buffer in all: `share` of what they
  could use (`available` now plus the `buffered` bytes they hold, which
  `available` no longer counts), at most `limit`.

  Examples: available 800, buffered 200, limit 4000, share 0.5 -> 500;
  available 8000, buffered 0, limit 1000, share 0.5 -> 1000.
  """
  pool = share * (max(0, available) + max(0, buffered))
  return max(1, int(min(pool, limit)))


def split_ram(pool: int, weights: Sequence[float]) -> list[int]:
  """`pool` bytes split by weight, rounded down (the sum never exceeds it),
  at least 1 each.

  Example: 1000 bytes, weights [1, 2] -> [333, 666].
  """
  return [max(1, int(s)) for s in fair_shares(pool, weights)]


def cpus_wanted(busy_cpus: float, input_bound: bool) -> float | None:
  """The CPUs a process can use: any number (None) when its pipeline is the
  slowest side (input-bound) or has not been measured (`busy_cpus` 0),
  else `DEMAND_HEADROOM` x the CPUs it keeps busy.

  Example: 0.8 busy, consumer-bound -> 1.25 x 0.8 = 1.0.
  """
  if input_bound or busy_cpus <= 0:
    return None
  return DEMAND_HEADROOM * busy_cpus


@dataclasses.dataclass(frozen=True)
class Demand:
  """What a process publishes of itself."""

  rate: float = 0.0  # rows/s out of its tuned pipelines
  busy_cpus: float = 0.0  # CPU-seconds per second its pipelines spend
  cpus_wanted: float | None = None  # `cpus_wanted`
  buffered_bytes: int = 0  # what its buffers and policies hold


@dataclasses.dataclass(frozen=True)
class Share:
  """This process's share of the host."""

  cpus: int  # its CPU budget
  cpu_share: float  # the fractional share `split_cpus` gave
  ram: int  # its RAM budget (bytes)
  processes: int  # the processes sharing the host, this one included
  host_cpus: int
  ram_pool: int
  cpu_ids: tuple[int, ...] = ()  # the CPUs dealt to it (`place_cpus`)
  confined: tuple[int, ...] | None = None  # runs only there (`confine_to`)


@dataclasses.dataclass(frozen=True)
class Lease:
  """One process's lease, as read from its file."""

  pid: int
  uid: int
  start: float
  weight: float
  heartbeat: float
  rate: float
  busy_cpus: float
  cpus_wanted: float | None
  buffered_bytes: int
  cpus: int | None  # the share it took at its last pass (None: none yet)
  ram: int | None
  confined: tuple[int, ...] | None = None  # the CPUs it runs on (None: any)
  given: tuple[int, ...] | None = None  # the CPUs given to it (None: unsaid)


def confine_to(share: Share | None, demand: Demand, whole_process: bool,
               same_cpus: bool) -> tuple[int, ...] | None:
  """The CPUs a process runs on (`host.place_process`), or None for all it
  is given: its share's `cpu_ids` when it shares the host with others,
  every session of it shares the host (`whole_process`; the affinity is the
  whole process's), every sharing process was given the same CPUs
  (`same_cpus`; else the deals of `place_cpus` could overlap) and it is
  input-bound (`demand.cpus_wanted` None). A consumer-bound process is not
  confined: its consumer (a model's training) needs CPUs its pipelines'
  demand does not count.

  Examples: 2 processes, input-bound, share on CPUs (1,) -> (1,); the same
  consumer-bound (wanted 1.0) -> None; 1 process -> None.
  """
  if (share is None or share.processes < 2 or not share.cpu_ids or
      not whole_process or not same_cpus or
      demand.cpus_wanted is not None):
    return None
  return share.cpu_ids


def default_dir() -> pathlib.Path:
  """`$INTUNE_HOST_DIR`, else `/dev/shm/intune-<uid>` (else under the
  temporary folder where there is no /dev/shm)."""
  env = os.environ.get(ENV_DIR)
  if env:
    return pathlib.Path(env).expanduser()
  base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
  return pathlib.Path(base) / f"intune-{os.getuid()}"


def folder_problem(directory: pathlib.Path) -> str | None:
  """Why `directory` cannot hold this user's leases (None: it can): it must
  be a real directory (not a link) of this uid that others cannot write."""
  try:
    info = os.lstat(directory)
  except OSError as e:
    return f"cannot read it ({e})"
  if stat.S_ISLNK(info.st_mode):
    return "it is a symbolic link"
  if not stat.S_ISDIR(info.st_mode):
    return "it is not a directory"
  if info.st_uid != os.getuid():
    return f"it belongs to uid {info.st_uid}, not {os.getuid()}"
  if info.st_mode & 0o022:
    return f"others may write to it (mode {stat.S_IMODE(info.st_mode):o})"
  return None


def make_folder(directory: pathlib.Path) -> None:
  """Creates `directory` (mode 0700) if missing.

  Raises:
    OSError: it cannot be made, or is not fit (`folder_problem`).
  """
  try:
    os.makedirs(directory, mode=0o700, exist_ok=True)
  except OSError:
    if not os.path.lexists(directory):
      raise
  problem = folder_problem(directory)
  if problem:
    raise OSError(errno.EPERM, f"{directory} cannot hold InTune's host "
                  f"leases: {problem}")


# Leases already warned about: (path, inode, reason).
_warned: set[tuple[str, int, str]] = set()
_warned_lock = threading.Lock()


def _warn_once(path: pathlib.Path, inode: int, reason: str) -> None:
  key = (str(path), inode, reason)
  with _warned_lock:
    if key in _warned:
      return
    _warned.add(key)
  logging.warning("InTune host arbiter: ignoring %s: %s. It takes no share "
                  "of the host; remove it if it is not an InTune lease.",
                  path, reason)


def _number(data: dict, key: str, optional: bool = False) -> float | None:
  value = data.get(key)
  if value is None and optional:
    return None
  if (isinstance(value, bool) or not isinstance(value, numbers.Real) or
      not math.isfinite(value)):
    raise ValueError(f"field {key!r} is {value!r:.40}, not a finite number")
  return value


def _cpu_list(data: dict, key: str) -> tuple[int, ...] | None:
  value = data.get(key)
  if value is None:
    return None
  if (not isinstance(value, list) or not value or
      not all(isinstance(c, int) and not isinstance(c, bool) and
              0 <= c < MAX_CPU_ID for c in value)):
    raise ValueError(f"field {key!r} is {value!r:.40}, not a list of CPU "
                     "numbers")
  return tuple(value)


def parse_lease(text: bytes) -> Lease:
  """The lease in a file's bytes.

  Raises:
    ValueError: not JSON, not a lease of this format, or a field of the
      wrong type or out of range.
  """
  try:
    data = json.loads(text.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"not JSON ({e})") from None
  except RecursionError:
    raise ValueError("its JSON nests too deeply") from None
  if not isinstance(data, dict) or data.get("format") != FORMAT:
    raise ValueError(f"not a {FORMAT} object")
  if not host.is_pid(data.get("pid")):
    raise ValueError(f"field 'pid' is {data.get('pid')!r:.40}, not a "
                     f"process id from 1 to {host.PID_MAX}")
  ints = {"pid": data["pid"]}
  for key in ("uid", "buffered_bytes"):
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise ValueError(f"field {key!r} is {value!r:.40}, not an int >= 0")
    ints[key] = value
  weight = _number(data, "weight")
  if not 0 < weight <= MAX_WEIGHT:
    raise ValueError(f"weight {weight!r} is out of (0, {MAX_WEIGHT:g}]")
  wanted = _number(data, "cpus_wanted", optional=True)
  shares = {}
  for key in ("cpus", "ram"):
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or
                              not isinstance(value, int) or value < 1):
      raise ValueError(f"field {key!r} is {value!r:.40}, not an int >= 1")
    shares[key] = value
  return Lease(
      pid=ints["pid"], uid=ints["uid"], start=_number(data, "start"),
      weight=float(weight), heartbeat=_number(data, "heartbeat"),
      rate=max(0.0, _number(data, "rate")),
      busy_cpus=max(0.0, _number(data, "busy_cpus")),
      cpus_wanted=None if wanted is None else max(0.0, wanted),
      buffered_bytes=ints["buffered_bytes"], cpus=shares["cpus"],
      ram=shares["ram"], confined=_cpu_list(data, "confined"),
      given=_cpu_list(data, "given"))


def _pid_alive(pid: int) -> bool:
  if not host.is_pid(pid):
    return False  # never asked of the OS: see `host.is_pid`
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # another user's process: alive (its lease is refused)
  return True


def read_lease(path: pathlib.Path, now: float | None = None) -> Lease | None:
  """The lease in `path`, or None (with one warning per entry and reason)
  when it is not a regular file of this uid and mode, too large, or not a
  valid lease, or its heartbeat is more than `LEASE_S` after `now` (default
  None: `time.time()`; such a lease would never expire while its pid
  lives). A FIFO or a device is never opened; the file is opened without
  following links and without blocking."""
  try:
    info = os.lstat(path)
  except FileNotFoundError:
    return None  # removed since it was listed
  except OSError as e:
    _warn_once(path, 0, f"cannot read it ({e})")
    return None
  reason = None
  if stat.S_ISLNK(info.st_mode):
    reason = "it is a symbolic link"
  elif not stat.S_ISREG(info.st_mode):
    reason = "it is not a regular file (a FIFO, a device or a folder)"
  elif info.st_uid != os.getuid():
    reason = f"it belongs to uid {info.st_uid}, not this user's {os.getuid()}"
  elif info.st_mode & 0o077:
    reason = (f"its mode is {stat.S_IMODE(info.st_mode):o}, not 600 (others "
              "may read or write it)")
  elif info.st_size > MAX_ENTRY_BYTES:
    reason = (f"it has {info.st_size} bytes, more than a lease's "
              f"{MAX_ENTRY_BYTES}")
  if reason:
    _warn_once(path, info.st_ino, reason)
    return None
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
  except FileNotFoundError:
    return None
  except OSError as e:
    _warn_once(path, info.st_ino, f"cannot open it ({e})")
    return None
  try:
    opened = os.fstat(fd)
    if (not stat.S_ISREG(opened.st_mode) or opened.st_uid != os.getuid() or
        opened.st_ino != info.st_ino):
      _warn_once(path, info.st_ino, "it was replaced by another kind of "
                 "file while read")
      return None
    text = os.read(fd, MAX_ENTRY_BYTES + 1)
  except OSError as e:
    _warn_once(path, info.st_ino, f"cannot read it ({e})")
    return None
  finally:
    os.close(fd)
  if len(text) > MAX_ENTRY_BYTES:
    _warn_once(path, info.st_ino, f"it grew past {MAX_ENTRY_BYTES} bytes")
    return None
  try:
    lease = parse_lease(text)
  except ValueError as e:
    _warn_once(path, info.st_ino, f"it is not a valid lease: {e}")
    return None
  if lease.uid != os.getuid() or path.name != f"{lease.pid}.json":
    _warn_once(path, info.st_ino, f"it names pid {lease.pid} and uid "
               f"{lease.uid}, not what its name and owner say")
    return None
  if lease.heartbeat - (time.time() if now is None else now) > LEASE_S:
    _warn_once(path, info.st_ino, "its heartbeat is in the future (its "
               "writer's clock or its contents are wrong)")
    return None
  return lease


def read_leases(directory: pathlib.Path | None = None,
                now: float | None = None,
                remove_dead: bool = False) -> list[Lease]:
  """The live leases in `directory`, by pid.

  Args:
    directory: the lease folder. Default None: `default_dir()`.
    now: the time to judge heartbeats by. Default None: `time.time()`.
    remove_dead: delete the files of leases whose pid is gone. Default
      False.

  Returns:
    The leases whose heartbeat is at most `LEASE_S` old and whose pid is
    alive; an empty list when the folder is missing or not fit.
  """
  directory = default_dir() if directory is None else pathlib.Path(directory)
  now = time.time() if now is None else now
  if folder_problem(directory) is not None:
    return []
  try:
    names = sorted(os.listdir(directory))
  except OSError:
    return []
  leases = []
  for name in names:
    if name.startswith(".") or not name.endswith(".json"):
      continue  # a writer's temporary file
    path = directory / name
    lease = read_lease(path, now)
    if lease is None:
      continue
    if not _pid_alive(lease.pid):
      if remove_dead:
        try:
          os.unlink(path)
        except OSError:
          pass
      continue
    if now - lease.heartbeat > LEASE_S:
      continue
    leases.append(lease)
  return sorted(leases, key=lambda lease: lease.pid)


def _process_start() -> float:
  try:
    return float(psutil.Process().create_time())
  except psutil.Error:
    return 0.0


class HostArbiter:
  """This process's lease and its share of the host (`update`)."""

  def __init__(self, directory: str | os.PathLike | None = None):
    self._directory = (pathlib.Path(directory) if directory is not None
                       else None)
    self._lock = threading.Lock()
    self._share: Share | None = None
    self._broken: str | None = None
    self._start = _process_start()

  @property
  def directory(self) -> pathlib.Path:
    return self._directory if self._directory is not None else default_dir()

  @property
  def path(self) -> pathlib.Path:
    return self.directory / f"{os.getpid()}.json"

  def share(self) -> Share | None:
    """The share of the last `update` (None: not sharing now)."""
    return self._share

  def update(self, weight: float, demand: Demand, cpus: int,
             available: int, limit: int, ram_share: float,
             cpu_ids: Sequence[int] = (),
             whole_process: bool = False) -> Share | None:
    """Reads the other leases, computes this process's share and renews
    its lease.

    Args:
      weight: this process's weight.
      demand: what it publishes.
      cpus: the CPUs this process may use (`host.usable_cpus()`).
      available: bytes available now (`host.available_memory()`).
      limit: the memory limit (`host.total_memory()`).
      ram_share: the share of the memory the pool may take
        (`options.DEFAULT_RAM_SHARE`).
      cpu_ids: the CPUs given to this process (`host.cpu_ids()`), dealt
        out by `place_cpus`. Default (): none named.
      whole_process: every session of this process shares the host
        (`confine_to`). Default False.

    Returns:
      The share, or None when the folder cannot be used (told once; each
      process then budgets as if alone).
    """
    directory = self.directory
    try:
      make_folder(directory)
    except OSError as e:
      self._share = None
      if self._broken != str(e):
        self._broken = str(e)
        logging.warning(
            "InTune: host sharing is off: %s. This process budgets CPUs and "
            "RAM as if alone. Set %s to a folder of your own, or "
            "IntuneOptions(host_share=False) to silence this.", e, ENV_DIR)
      return None
    self._broken = None
    now = time.time()
    pid = os.getpid()
    others = [lease for lease in read_leases(directory, now, True)
              if lease.pid != pid]
    # Every process orders the host by pid, so that all of them break the
    # ties of `whole_cpus` alike and the whole CPUs sum to the host's.
    table = sorted([(pid, weight, demand.cpus_wanted)] +
                   [(lease.pid, lease.weight, lease.cpus_wanted)
                    for lease in others])
    me = [row[0] for row in table].index(pid)
    weights = [row[1] for row in table]
    shares = split_cpus(float(cpus), weights, [row[2] for row in table])
    whole = whole_cpus(shares, cpus)
    pool = ram_pool(available, demand.buffered_bytes + sum(
        lease.buffered_bytes for lease in others), limit, ram_share)
    ram = split_ram(pool, weights)
    given = tuple(sorted(cpu_ids)) or None
    share = Share(cpus=min(cpus, whole[me]), cpu_share=shares[me],
                  ram=ram[me], processes=len(table), host_cpus=cpus,
                  ram_pool=pool,
                  cpu_ids=tuple(place_cpus(whole, me, given) if given
                                else ()))
    share = dataclasses.replace(share, confined=confine_to(
        share, demand, whole_process,
        same_cpus=all(lease.given == given for lease in others)))
    entry = {
        "format": FORMAT, "pid": pid, "uid": os.getuid(),
        "start": self._start, "weight": float(weight), "heartbeat": now,
        "rate": float(demand.rate), "busy_cpus": float(demand.busy_cpus),
        "cpus_wanted": (None if demand.cpus_wanted is None
                        else float(demand.cpus_wanted)),
        "buffered_bytes": int(max(0, demand.buffered_bytes)),
        "cpus": share.cpus, "ram": share.ram,
        "confined": (None if share.confined is None
                     else list(share.confined)),
        "given": None if given is None else list(given)}
    try:
      files.write_json(self.path, entry)
    except OSError as e:
      logging.warning("InTune: cannot renew the host lease %s (%s); "
                      "retrying at the next pass.", self.path, e)
    with self._lock:
      self._share = share
    return share

  def withdraw(self) -> None:
    """Removes this process's lease (its share returns to the others)."""
    with self._lock:
      self._share = None
    try:
      os.unlink(self.path)
    except OSError:
      pass


_ARBITER = HostArbiter()


def arbiter() -> HostArbiter:
  """The process's arbiter (its lease is removed at exit by the tuner)."""
  return _ARBITER


def current_share() -> Share | None:
  """This process's current share of the host (None: not sharing)."""
  return _ARBITER.share()
