"""The dispatcher: TensorFlow's `DispatchServer` with InTune loaded, and the
worker pool it sizes (`intune service dispatcher`)."""

from __future__ import annotations

import os
import pathlib
import time
from typing import Any

from absl import logging

from intune_tf import host as host_lib
from intune_tf.service import controllers
from intune_tf.service import manager as manager_lib
from intune_tf.service import scalers
from intune_tf.service import workers as local_workers
from intune_tf.service.addresses import ServiceError
from intune_tf.service.addresses import check_port_free
from intune_tf.service.consumer import pool_reading
from intune_tf.service.process import SECURITY_NOTE
from intune_tf.service.process import start_tuner
from intune_tf.service.process import wait_for_signal

# Seconds between two decisions on a pool, and between a change taking
# effect and the next change.
DEFAULT_POOL_PERIOD_S = 10.0
DEFAULT_POOL_MIN_INTERVAL_S = 30.0

# Seconds between updates of a dispatcher's status (its worker count).
_DISPATCHER_STATUS_PERIOD_S = 2.0


def _check_work_dir(work_dir: str) -> None:
  """Creates the dispatcher's journal folder `work_dir` if missing.

  Raises:
    ServiceError: it cannot be a folder (a file on its path, no rights).
  """
  try:
    pathlib.Path(work_dir).mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ServiceError(
        f"--work-dir {work_dir}: cannot use it as the dispatcher's journal "
        f"folder ({e.strerror or e}); give a folder this user can "
        "write.") from None


def cpu_note(low: int, high: int, cpus: int, capped: bool
             ) -> tuple[int, str] | None:
  """What a local pool of `low` to `high` workers on a host giving `cpus`
  CPUs should be told, as (absl logging level, message), or None.

  cpu_note(3, 3, 2, True) warns that MIN 3 workers start on 2 CPUs;
  cpu_note(1, 4, 2, True) says the controller grows it to 2 at most;
  cpu_note(1, 4, 2, False) (no cap: the host's tier is filled to its MAX
  before a scale command adds workers) warns to lower MAX.

  Args:
    low: MIN.
    high: MAX.
    cpus: the CPUs the host gives (`host.usable_cpus()`).
    capped: whether the controller caps the pool at `cpus`.
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
    port: port to listen on (all interfaces: TensorFlow's choice).
    host: the address workers and clients should use, for the log. Default
      "127.0.0.1".
    work_dir: directory for the dispatcher's journal (makes it
      fault-tolerant: a restarted dispatcher resumes its jobs). Default None:
      no journal.
    worker_timeout_ms: how long a worker may miss heartbeats before the
      dispatcher logs it as lost (`Lost worker ... due to timeout`, checked
      once every job GC interval, 10 minutes in TensorFlow 2.21). It ends
      none of the worker's tasks: clients wait for them, and a
      `distributed_epoch` epoch ends only once a worker serves again at
      that address (docs/service.md). Default None: TensorFlow's default.
    workers: (MIN, MAX) of a pool of workers that the dispatcher sizes
      with `controllers.IntuneController`, from the reports of
      `ConsumerMeter` and of the workers' tuners: local `intune service
      worker` processes it starts (one that dies is replaced on its port
      at the next period, decision or not), or, with `scale_command`,
      workers that command sets, or, with `scaler`, that scaler's. Default
      None: no pool.
    pool_period_s: seconds between two decisions on the pool. Default 10.
    pool_min_interval_s: seconds between a change taking effect and the
      next change. Default 30.
    scale_command: with `workers`, a shell command with `{n}` where the
      count goes (`scalers.CommandScaler`), run for MIN at start and at
      each change; the workers registered with the dispatcher count as
      serving. Default None: local workers.
    scale_timeout_s: seconds the scale command may run before it is killed
      and the change fails. Default `scalers.DEFAULT_COMMAND_TIMEOUT_S`
      (60).
    controller: the pool controller's name (`controllers.CONTROLLERS`):
      "intune", or, to compare, "tf-formula" (TensorFlow's estimate applied
      as if it scaled) or "cachew" (Cachew's hill climb). Default "intune".
    scaler: with `workers` (MIN and MAX the same as the scaler's), the pool
      as a Python object, e.g. a `scalers.CallbackScaler` that calls your
      cluster's API (its `serving()` counts the workers serving). Default
      None: local workers or `scale_command`.
    standby: with local workers, the warm processes kept ready to join
      (`workers.LocalWorkers`). Default `workers.DEFAULT_STANDBY` (1).
    scale_out: with `workers` and `scale_command`: `workers` are this
      host's local workers, filled first, and the command runs for up to
      `scale_out` more beyond them (`scalers.LocalFirst`: the pool is MIN
      to MAX + `scale_out`; the command runs for 0 at start). Default
      None: the command sets the whole pool.

  Returns:
    The exit code (0).

  Raises:
    ServiceError: the port is in use.
    ValueError: `controller` is unknown, `scaler` is given without
      `workers`, with `scale_command`, or with other bounds, or
      `scale_out` without `workers` and `scale_command` or below 1.
  """
  if work_dir is not None:
    _check_work_dir(work_dir)
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  import tensorflow as tf  # noqa: PLC0415

  controllers.check_name(controller)
  _check_pool_args(workers, scale_command, scaler, scale_out)
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
  loop = _StatusLoop(server)
  if workers is not None:
    if scaler is None:
      scaler = _make_scaler(server, port, workers, scale_command,
                            scale_timeout_s, standby, scale_out)
    manager = _start_pool(scaler, workers, controller, pool_min_interval_s,
                          scale_out)
    # The dispatcher's address in its workers' status files: the local ones
    # use loopback, those of a scale command the advertised address.
    loop.pool = _PoolLoop(
        manager, pool_period_s, f"127.0.0.1:{port}"
        if scale_command is None else f"{host}:{port}",
        (f"127.0.0.1:{port}", f"{host}:{port}"))
  try:
    name = wait_for_signal(loop.tick, _DISPATCHER_STATUS_PERIOD_S)
  finally:
    if loop.pool is not None:
      loop.pool.manager.scaler.close()
  logging.info("Dispatcher stopping (%s).", name)
  server.stop()
  return 0


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
      isinstance(scale_out, bool) or not isinstance(scale_out, int) or
      scale_out < 1):
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
  if scale_command is None:
    return local_workers.LocalWorkers(local, low, high, standby=standby)
  if scale_out is None:
    # Initially 0: the command runs for MIN at start, whatever the count.
    return scalers.CommandScaler(scale_command, low, high, initial=0,
                                 timeout_s=scale_timeout_s,
                                 serving=registered)
  on_host = local_workers.LocalWorkers(local, low, high, standby=standby)
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
    scaler.start(low)
    logging.info("Worker pool local:%d-%d, then up to %d more through the "
                 "command: ran `%s`; started %d local worker(s) (logs in "
                 "%s).", low, high, scale_out, scaler.remote.command(0),
                 low, scaler.local.log_dir)
    return manager
  scaler.resize(low)
  if isinstance(scaler, local_workers.LocalWorkers):
    logging.info("Worker pool local:%d-%d: started %d local worker(s); "
                 "logs in %s.", low, high, low, scaler.log_dir)
  elif isinstance(scaler, scalers.CommandScaler):
    logging.info("Worker pool command:%d-%d: ran `%s`.", low, high,
                 scaler.command(low))
  else:
    logging.info("Worker pool %s:%d-%d: %d worker(s) asked for.",
                 scaler.kind, low, high, scaler.size())
  return manager


class _PoolLoop:
  """Each pool period: replaces lost workers, gives up those that never
  started, reads the consumers' reports and steps the manager."""

  def __init__(self, manager: manager_lib.PoolManager, period_s: float,
               workers_use: str, consumer_addresses: tuple[str, ...]):
    self.manager = manager
    self.period_s = period_s
    self.workers_use = workers_use
    self.consumer_addresses = consumer_addresses
    self.last = time.monotonic()

  def step(self) -> dict[str, Any]:
    """The pool's report (`PoolManager.report`), after a decision when a
    period is over."""
    now = time.monotonic()
    if now - self.last >= self.period_s:
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
      reading = pool_reading(self.workers_use, serving, size - serving,
                             consumer_addresses=self.consumer_addresses)
      if reading is not None:
        self.manager.step(reading)
      else:
        self.manager.hold("no consumer report (ConsumerMeter)")
    return self.manager.report()


class _StatusLoop:
  """The dispatcher's tick: the pool's step, then its status file."""

  def __init__(self, server):
    self.server = server
    self.pool: _PoolLoop | None = None

  def tick(self) -> None:
    # Deferred: `intune --help` lists this command without loading TensorFlow.
    from intune_tf.observe import status  # noqa: PLC0415
    pool = self.pool.step() if self.pool is not None else None
    writer = status.writer()
    if writer is not None:
      fields = {"workers": self.server._num_workers()}  # noqa: SLF001
      if pool is not None:
        fields["pool"] = pool
      writer.set_info(**fields)
