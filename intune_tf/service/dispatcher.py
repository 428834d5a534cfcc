"""The dispatcher: TensorFlow's `DispatchServer` with InTune loaded, and the
worker pool it sizes (`intune service dispatcher`)."""

from __future__ import annotations

import os
import pathlib
import time

from absl import logging

from intune_tf import host as host_lib
from intune_tf.observe import status
from intune_tf.service import controllers
from intune_tf.service import manager as manager_lib
from intune_tf.service import scalers
from intune_tf.service import workers as local_workers
from intune_tf.service.addresses import ServiceError
from intune_tf.service.addresses import check_port_free
from intune_tf.service.consumer import pool_reading
from intune_tf.service.worker import SECURITY_NOTE
from intune_tf.service.worker import start_tuner
from intune_tf.service.worker import wait_for_signal

# Seconds between two decisions on a pool, and between a change taking
# effect and the next change.
DEFAULT_POOL_PERIOD_S = 10.0
DEFAULT_POOL_MIN_INTERVAL_S = 30.0
# Seconds between updates of a dispatcher's status (its worker count).
_DISPATCHER_STATUS_PERIOD_S = 2.0


def cpu_note(low: int, high: int, cpus: int, capped: bool
             ) -> tuple[int, str] | None:
  """What a local pool of `low` to `high` workers on a host giving `cpus`
  CPUs should be told, as (absl logging level, message), or None: that MIN
  is above `cpus`, that the controller grows it to `cpus` at most
  (`capped`), or (not capped: the host's tier is filled to its MAX before a
  scale command adds workers) to lower MAX.
  """
  if cpus < low:
    return (logging.WARNING,
            f"MIN {low} is more than the {cpus} CPU(s) this host gives: "
            f"{low} local workers start and share them; pass a MIN of at "
            f"most {cpus}.")
  if cpus >= high:
    return None
  if capped:
    return (logging.INFO, f"InTune grows it to at most {cpus} worker(s), "
            "the CPUs this host gives.")
  return (logging.WARNING,
          f"the host's tier is filled to its MAX before the command adds a "
          f"worker, and this host gives {cpus} CPU(s); set MAX to the "
          "workers it can run beside the trainer.")


def run_dispatcher(port: int, host: str = "127.0.0.1",
                   work_dir: str | None = None,
                   worker_timeout_ms: int | None = None,
                   workers: tuple[int, int] | None = None,
                   pool_period_s: float = DEFAULT_POOL_PERIOD_S,
                   pool_min_interval_s: float = DEFAULT_POOL_MIN_INTERVAL_S,
                   scale_command: str | None = None,
                   scale_timeout_s: float = scalers.DEFAULT_COMMAND_TIMEOUT_S,
                   controller: str = "intune",
                   scaler: scalers.Scaler | None = None,
                   standby: int = local_workers.DEFAULT_STANDBY,
                   scale_out: int | None = None) -> int:
  """Runs a tf.data service dispatcher until SIGTERM/SIGINT.

  Args:
    workers: (MIN, MAX) of a pool sized from the reports of `ConsumerMeter`
      and of the workers (`--workers` without the kind): local workers, or
      those of `scale_command` or of `scaler`. Default None: no pool.
    scaler: the pool as a Python object with the bounds of `workers`, e.g.
      a `scalers.CallbackScaler`. Default None.
    The others: the `intune service dispatcher` flags of the same names
      (`_s`: in seconds; `controller`: --pool-controller, `standby`:
      --pool-standby), with their defaults (docs/service.md).

  Returns:
    The exit code (0).

  Raises:
    ServiceError: the port is in use, or `work_dir` cannot be a folder.
    ValueError: an unknown `controller`, or pool arguments that do not go
      together.
  """
  try:
    if work_dir is not None:
      pathlib.Path(work_dir).mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ServiceError(
        f"--work-dir {work_dir}: cannot use it as the dispatcher's journal "
        f"folder ({e.strerror or e}); give a folder this user can "
        "write.") from None
  controllers.check_name(controller)
  _check_pool_args(workers, scale_command, scaler, scale_out)
  scale_out = controllers.integer(scale_out)
  server = _start_server(port, host, work_dir, worker_timeout_ms)
  manager = None
  if workers is not None:
    manager = _start_pool(scaler or _make_scaler(
        server, port, workers, scale_command, scale_timeout_s, standby,
        scale_out), workers, controller, pool_min_interval_s, scale_out)
  loop = _Loop(server, manager, pool_period_s,
               (f"127.0.0.1:{port}", f"{host}:{port}"))
  try:
    name = wait_for_signal(loop.tick, _DISPATCHER_STATUS_PERIOD_S)
  finally:
    if manager is not None:
      manager.scaler.close()
  logging.info("Dispatcher stopping (%s).", name)
  server.stop()
  return 0


def _start_server(port: int, host: str, work_dir: str | None,
                  worker_timeout_ms: int | None):
  """TensorFlow's `DispatchServer`, the tuner started."""
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  import tensorflow as tf  # noqa: PLC0415

  check_port_free(port)
  start_tuner("dispatcher", port=port, address=f"{host}:{port}",
              work_dir=work_dir)
  server = tf.data.experimental.service.DispatchServer(
      tf.data.experimental.service.DispatcherConfig(
          port=port, work_dir=work_dir, fault_tolerant_mode=bool(work_dir),
          worker_timeout_ms=worker_timeout_ms))
  logging.info("tf.data service dispatcher with InTune at grpc://%s:%d "
               "(pid %d).", host, port, os.getpid())
  logging.warning(SECURITY_NOTE.format(port=port))
  return server


def _check_pool_args(workers: tuple[int, int] | None,
                     scale_command: str | None,
                     scaler: scalers.Scaler | None,
                     scale_out: int | None) -> None:
  """Raises ValueError if `run_dispatcher`'s pool arguments do not go
  together."""
  if scaler is not None and (
      workers is None or scale_command is not None or
      (scaler.min_workers, scaler.max_workers) != tuple(workers)):
    raise ValueError(
        "scaler= needs workers=(MIN, MAX) equal to the scaler's "
        f"({scaler.min_workers}, {scaler.max_workers}) and no "
        "scale_command.")
  if scale_out is not None and (
      workers is None or scale_command is None or scaler is not None or
      controllers.integer(scale_out) is None or scale_out < 1):
    raise ValueError(
        f"scale_out= is the workers the scale command adds beyond the local "
        f"ones: it needs workers=(MIN, MAX) and scale_command, and a count "
        f"of at least 1, got {scale_out!r}.")


def _make_scaler(server, port: int, workers: tuple[int, int],
                 scale_command: str | None, scale_timeout_s: float,
                 standby: int, scale_out: int | None) -> scalers.Scaler:
  """The pool's scaler from `run_dispatcher`'s arguments."""
  local, (low, high) = f"127.0.0.1:{port}", workers
  registered = server._num_workers  # noqa: SLF001  TF's only count
  if scale_command is not None and scale_out is None:
    # Initially 0: the command runs for MIN at start, whatever the count.
    return scalers.CommandScaler(scale_command, low, high, initial=0,
                                 timeout_s=scale_timeout_s,
                                 serving=registered)
  on_host = local_workers.LocalWorkers(local, low, high, standby=standby)
  if scale_command is None:
    return on_host
  # The dispatcher's registered workers beyond the host's own.
  return scalers.LocalFirst(on_host, scalers.CommandScaler(
      scale_command, 1, scale_out, initial=0, timeout_s=scale_timeout_s,
      serving=lambda: registered() - on_host.serving()))


def _start_pool(scaler: scalers.Scaler, workers: tuple[int, int],
                controller: str, min_interval_s: float,
                scale_out: int | None) -> manager_lib.PoolManager:
  """Starts the pool at MIN under `controller`; logs what it started."""
  low, high = workers
  kwargs = {"min_interval_s": min_interval_s} if controller == "intune" else {}
  capped = controller == "intune" and isinstance(scaler,
                                                  local_workers.LocalWorkers)
  if capped:
    # A local worker past the host's CPUs adds no CPU, only contention.
    kwargs["cpu_cap"] = host_lib.usable_cpus
  if capped or scale_out is not None:
    note = cpu_note(low, high, host_lib.usable_cpus(), capped)
    if note is not None:
      logging.log(note[0], "Worker pool local:%d-%d: %s", low, high, note[1])
  manager = manager_lib.PoolManager(controllers.make_controller(
      controller, scaler.min_workers, scaler.max_workers, **kwargs), scaler)
  if isinstance(scaler, scalers.LocalFirst):
    scaler.start(low)  # the remote tier set to 0 whatever it held
  else:
    scaler.resize(low)
  local = getattr(scaler, "local", scaler)
  logging.info("Worker pool %s:%d-%d: %d worker(s) asked for%s.",
               scaler.kind, scaler.min_workers, scaler.max_workers, low,
               f" (logs of the local ones in {local.log_dir})" if isinstance(
                   local, local_workers.LocalWorkers) else "")
  return manager


class _Loop:
  """The dispatcher's tick: each pool period, replaces lost workers, gives
  up those that never started, reads the consumers' reports and steps the
  manager; then writes the status file (its workers, its pool's report).
  Workers and consumers name the dispatcher by either of `addresses` (by
  loopback: the local workers; advertised: those of a scale command)."""

  def __init__(self, server, manager: manager_lib.PoolManager | None,
               period_s: float, addresses: tuple[str, str]):
    self.server = server
    self.manager = manager
    self.period_s = period_s
    self.addresses = addresses
    self.last = time.monotonic()

  def _step(self) -> None:
    now = time.monotonic()
    if now - self.last < self.period_s:
      return
    self.last = now
    scaler = self.manager.scaler
    # A dead worker is replaced at its address without a decision: a
    # consumer whose epoch waits for it cannot go on until then.
    try:
      scaler.replace_lost()
    except scalers.ScalerError as e:
      logging.error("%s", e)
    self.manager.give_up_unstarted(time.time())
    size, serving = scaler.size(), scaler.serving()
    reading = pool_reading(self.addresses[0], serving, size - serving,
                           consumer_addresses=self.addresses[1:])
    if reading is not None:
      self.manager.step(reading)
    else:
      self.manager.hold("no consumer report (ConsumerMeter)")

  def tick(self) -> None:
    fields = {"workers": self.server._num_workers()}  # noqa: SLF001
    if self.manager is not None:
      self._step()
      fields["pool"] = self.manager.report()
    writer = status.writer()
    if writer is not None:
      writer.set_info(**fields)
