"""`intune inspect`: the per-stage table of running InTune jobs.

Reads the status files that tuned processes write
(`intune_tf.observe.status`) and prints, for every live session, one row per
pipeline stage: parallelism, buffer (and fill), elements/s, CPUs busy, CPU
share, thread utilization and which stage is the bottleneck; with the
`cache` option on, where InTune cached, the bytes it holds, the share of the
epoch served from it and the upstream seconds saved, or why it has no
cache. `--watch SECONDS` refreshes the table until Ctrl-C. Above the tables,
how the host is split among the InTune processes that share it
(`intune_tf.arbiter`): one line per process with its weight, CPU and RAM
budgets and demand. A dispatcher that sizes its worker pool (`--workers`)
shows the pool: its size, the workers serving, MIN-MAX, workers lost,
failed resizes and the last decision's reason. With nothing running it says
so and exits with status 1.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any, Mapping, Sequence, TextIO

from intune_tf import arbiter as arbiter_lib
from intune_tf import arguments
from intune_tf import records
from intune_tf.observe import status as status_lib

NOTHING_RUNNING = "no running InTune job found (looked in {dir})"
_CLEAR = "\x1b[H\x1b[2J"


def _num(value: float | None, digits: int = 0) -> str:
  if value is None:
    return "-"
  return f"{value:,.{digits}f}"


def _bytes(value: float | None) -> str:
  if value is None:
    return "-"
  for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
    if abs(value) >= size:
      return f"{value / size:.1f} {unit}"
  return f"{value:.0f} B"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
            for i, h in enumerate(headers)]
  def line(cells):
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                     for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
  return [line(headers), line(["-" * w for w in widths])] + [
      line(r) for r in rows]


STAGE_HEADERS = ("stage", "parallelism", "buffer", "fill", "elem/s", "CPUs",
                 "CPU share", "util", "bottleneck")


def stage_table(stages: Sequence[Mapping[str, Any]]) -> list[str]:
  """The per-stage table of one session, as lines."""
  rows = []
  for r in stages:
    rows.append([
        r["stage"], _num(r.get("parallelism")), _num(r.get("buffer")),
        (f"{100 * r['buffer_fill']:.0f}%"
         if r.get("buffer") and r.get("buffer_fill") is not None else "-"),
        _num(r.get("rate")), _num(r.get("cpus"), 2),
        (f"{100 * r['cpu_share']:.0f}%" if r.get("cpu_share") is not None
         else "-"),
        (f"{100 * r['utilization']:.0f}%" if r.get("utilization") is not None
         else "-"),
        "<== bottleneck" if r.get("bottleneck") else ""])
  return _table(STAGE_HEADERS, rows)


POOL_HEADERS = ("worker pool", "size", "serving", "standby", "MIN-MAX",
                "lost", "failures")


def pool_table(info: Mapping[str, Any]) -> list[str]:
  """The worker pool a dispatcher sizes (its status file's `pool`, from
  `service.manager.PoolManager.report`), as lines: a one-row table (the scaler's
  kind, the workers asked for and serving, the warm standbys, MIN-MAX,
  workers lost, failed resizes), the last decision's reason, then the last
  change (with its reason when that is not the last one) or the last failed
  one with its error, when there was one."""
  def count(field: str) -> str:
    value = info.get(field)
    return "?" if value is None else str(value)
  reason = info.get("reason") or "-"
  lines = _table(POOL_HEADERS, [[
      info.get("kind") or "?", count("size"), count("serving"),
      count("standby"), f"{count('min')}-{count('max')}", count("lost"),
      count("failures")]])
  lines.append(f"last reason: {reason}")
  decisions = info.get("decisions") or []
  if decisions:
    last = decisions[-1]
    change = (f"last change: {last.get('before', '?')} -> "
              f"{last.get('size', '?')} workers")
    if last.get("error"):
      change += f" failed: {last['error']}"
    elif last.get("reason") and last["reason"] != reason:
      change += f": {last['reason']}"
    lines.append(change)
  return lines


def format_process(data: Mapping[str, Any], now: float | None = None,
                   include_ended: bool = False) -> list[str]:
  """Lines describing one process's status file."""
  now = time.time() if now is None else now
  role = data.get("role", "process")
  what = f"pid {data['pid']} on {data.get('host', '?')}"
  service = data.get("service") or {}
  if role == "worker":
    what += (f", tf.data service worker {service.get('worker_address', '?')} "
             f"of dispatcher {service.get('dispatcher', '?')}")
  elif role == "dispatcher":
    what += f", tf.data service dispatcher on port {service.get('port', '?')}"
  age = now - float(data.get("updated", now))
  lines = [f"{what} (status {age:.1f} s old)"]
  if data.get("pool"):
    lines.extend("  " + line for line in pool_table(data["pool"]))
  sessions = list(data.get("sessions", []))
  if include_ended:
    sessions += list(data.get("ended_sessions", []))
  if not sessions:
    lines.append("  no tuned pipeline (yet)")
  for s in sessions:
    label = f" {s['name']!r}" if s.get("name") else ""
    state = "" if s.get("alive", True) else "  [ended]"
    lines.append("")
    lines.append(
        f"session {s['id']}{label}: policy {s.get('policy')}, step "
        f"{s.get('steps', 0)} ({s.get('changes', 0)} with changes), "
        f"{_num(s.get('output_rate'))} elem/s out, "
        f"{s.get('bound', '?')}-bound{state}")
    wait = s.get("consumer_wait_s")
    latency = s.get("output_latency_s")
    lines.append(
        f"  CPU budget {s.get('cpu_budget', '?')} of "
        f"{s.get('usable_cpus', '?')} usable, buffered "
        f"{_bytes(s.get('buffered_bytes'))} of {_bytes(s.get('ram_budget'))}"
        f" budget, GetNext {_num(latency and latency * 1e3, 2)} ms/elem, "
        f"consumer {_num(wait and wait * 1e3, 2)} ms/elem")
    fixed = s.get("unlowerable_bytes") or {}
    if fixed:
      lines.append("  not lowerable by the guard (counted against the "
                   "budget): " + ", ".join(
                       f"{stage} {_bytes(held)}"
                       for stage, held in sorted(fixed.items())))
    if s.get("cache"):
      lines.append("  " + cache_line(s["cache"]))
    lines.extend("  " + line for line in stage_table(s.get("stages", [])))
  return lines


def cache_line(cache: Mapping[str, Any]) -> str:
  """What a session's `cache` (`status.cache_fields`) says, in one line."""
  if cache.get("state") != records.CacheState.PLACED:
    point = cache.get("point")
    where = f" (its point: after {point})" if point else ""
    return f"no cache: {cache.get('reason') or '?'}{where}"
  whole = ", a whole epoch" if cache.get("complete") else ""
  return (f"cache after {cache['point']}: {_bytes(cache.get('bytes'))} of "
          f"{_bytes(cache.get('limit'))}, {_num(cache.get('elements'))} "
          f"elements{whole}; {100 * (cache.get('served') or 0):.0f}% of this "
          f"epoch's reads served from it, {_num(cache.get('saved_s'), 2)} s "
          f"of upstream time saved ({cache.get('reason') or '?'})")


def host_split(leases: Sequence[arbiter_lib.Lease],
               directory: str | pathlib.Path = "") -> list[str]:
  """How the host is split: a heading, then one line per process's lease
  (pid, weight, the CPU and RAM budgets it took, the CPUs it can use and
  the ones it runs on when confined, rows/s, CPUs busy, bytes buffered). No
  lines when no process shares the host."""
  if not leases:
    return []
  where = f" ({directory})" if directory else ""
  lines = [f"host split: {len(leases)} InTune process"
           f"{'es' if len(leases) != 1 else ''} share this host{where}"]
  for lease in leases:
    wanted = ("any" if lease.cpus_wanted is None
              else _num(lease.cpus_wanted, 2))
    if lease.confined is not None:
      wanted += f"; runs on CPUs {','.join(map(str, lease.confined))}"
    lines.append(
        f"  pid {lease.pid}: weight {lease.weight:g}, CPU budget "
        f"{_num(lease.cpus)} (can use {wanted}), RAM budget "
        f"{_bytes(lease.ram)}, {_num(lease.rate)} rows/s, "
        f"{_num(lease.busy_cpus, 2)} CPUs busy, buffered "
        f"{_bytes(lease.buffered_bytes)}")
  return lines


def render(processes: Sequence[Mapping[str, Any]],
           include_ended: bool = False,
           leases: Sequence[arbiter_lib.Lease] = (),
           host_dir: str | pathlib.Path = "") -> str:
  """The whole report for `processes` (from `status.read_all`), after how
  the host is split among `leases` (`host_split`; default none)."""
  now = time.time()
  blocks = ["\n".join(format_process(p, now, include_ended))
            for p in processes]
  split = host_split(leases, host_dir)
  if split:
    blocks.insert(0, "\n".join(split))
  return "\n\n".join(blocks) + "\n"


def _select(directory: pathlib.Path, pid: int | None,
            service_only: bool) -> list[dict[str, Any]]:
  found = status_lib.read_all(directory)
  if pid is not None:
    found = [p for p in found if p["pid"] == pid]
  if service_only:
    found = [p for p in found if p.get("role") in ("worker", "dispatcher")]
  return found


def inspect(directory: str | pathlib.Path | None = None,
            pid: int | None = None, watch: float | None = None,
            service_only: bool = False, include_ended: bool = False,
            out: TextIO = sys.stdout,
            host_dir: str | pathlib.Path | None = None) -> int:
  """Prints the status of running jobs; returns the exit code.

  Args:
    directory: the status dir. Default None: `status.default_dir()`.
    pid: only this process. Default None: every live process.
    watch: refresh every this many seconds until interrupted. Default None:
      print once.
    service_only: only tf.data service workers (and dispatchers). Default
      False.
    include_ended: also show the last ended sessions. Default False.
    out: where to print. Default stdout.
    host_dir: the host arbiter's lease folder. Default None:
      `arbiter.default_dir()`.

  Returns:
    0, or 1 when no running job was found (at the first look when watching).
  """
  directory = pathlib.Path(directory) if directory else (
      status_lib.default_dir())
  where = str(directory) + (f", pid {pid}" if pid is not None else "")
  host_dir = pathlib.Path(host_dir) if host_dir else (
      arbiter_lib.default_dir())
  found = _select(directory, pid, service_only)
  if not found:
    print(NOTHING_RUNNING.format(dir=where), file=out)
    return 1
  if watch is None:
    out.write(render(found, include_ended, arbiter_lib.read_leases(host_dir),
                     host_dir))
    return 0
  try:
    while True:
      text = (render(found, include_ended,
                     arbiter_lib.read_leases(host_dir), host_dir) if found
              else NOTHING_RUNNING.format(dir=where) + "\n")
      out.write(_CLEAR + time.strftime("%H:%M:%S ") +
                f"(every {watch:g} s, Ctrl-C to stop)\n\n" + text)
      out.flush()
      time.sleep(watch)
      found = _select(directory, pid, service_only)
  except KeyboardInterrupt:
    return 0


def main(args: argparse.Namespace) -> int:
  return inspect(args.status_dir, args.pid, args.watch, args.service,
                 args.ended, host_dir=args.host_dir)


def add_parser(subparsers, helps: Mapping[str, str]) -> None:
  p = subparsers.add_parser(
      "inspect", help=helps["inspect"],
      description=__doc__.split("\n\n")[1])
  p.add_argument("--pid", type=arguments.positive_int, default=None,
                 help="Only this process (default: every running job).")
  p.add_argument("--watch", type=arguments.duration, default=None,
                 metavar="SECONDS", help="Refresh every SECONDS (finite, "
                 "above 0) until Ctrl-C (default: once).")
  p.add_argument("--status-dir", default=None,
                 help="Where tuned processes write their status "
                 f"(default: ${status_lib.ENV_DIR} or "
                 "~/.cache/intune_tf/status).")
  p.add_argument("--host-dir", default=None,
                 help="The host arbiter's lease folder (default: "
                 f"${arbiter_lib.ENV_DIR} or /dev/shm/intune-<uid>).")
  p.add_argument("--service", action="store_true",
                 help="Only tf.data service workers and dispatchers.")
  p.add_argument("--ended", action="store_true",
                 help="Also show the sessions that ended most recently.")
  p.set_defaults(func=main)
