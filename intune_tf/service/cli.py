"""The `intune service dispatcher` and `intune service worker` commands."""

from __future__ import annotations

import argparse
import inspect
import os
import sys

from absl import logging

from intune_tf import arguments
from intune_tf.service import controllers
from intune_tf.service import dispatcher
from intune_tf.service import scalers
from intune_tf.service import worker
from intune_tf.service import workers
from intune_tf.service.addresses import ServiceError
from intune_tf.service.addresses import parse_address

_EXAMPLE = f"'{scalers.EXAMPLE_COMMAND}'"


def _fail(command: str, error: Exception) -> int:
  logging.error("intune service %s: %s", command, error)
  print(f"intune service {command}: error: {error}", flush=True)
  return 1


def pool_flags_problem(args: argparse.Namespace) -> str | None:
  """What is wrong with the pool flags of `intune service dispatcher`
  together (`args`, parsed; each flag alone is checked by its type), or
  None."""
  kind = args.workers[0] if args.workers else None
  given = f"--workers {kind}:MIN-MAX" if kind else "no --workers"
  example = f"pass for example --scale-command {_EXAMPLE}."
  sized = "pass --workers local:MIN-MAX or command:MIN-MAX, or drop"
  if kind == "command" and args.scale_command is None:
    return ("--workers command:MIN-MAX needs --scale-command, the shell "
            f"command that sets the pool to {{n}} workers; {example}")
  if args.scale_out is not None and kind != "local":
    return ("--scale-out adds workers beyond those of --workers "
            f"local:MIN-MAX, not {given}; pass --workers local:MIN-MAX or "
            "drop --scale-out.")
  if args.scale_out is not None and args.scale_command is None:
    return ("--scale-out needs --scale-command, the shell command that sets "
            f"the workers beyond the host's to {{n}}; {example}")
  if args.controller != "intune" and kind is None:
    return (f"--pool-controller {args.controller} sizes a pool: "
            f"{sized} --pool-controller.")
  commanded = kind == "command" or args.scale_out is not None
  for flag, value in (("--scale-command", args.scale_command),
                      ("--scale-timeout", args.scale_timeout_s)):
    if value is not None and not commanded:
      return (f"{flag} is for --workers command:MIN-MAX or local:MIN-MAX "
              f"with --scale-out, not {given}{' alone' if kind else ''}; "
              f"pass one of them or drop {flag}.")
  for flag, value in (("--pool-period", args.pool_period_s),
                      ("--pool-min-interval", args.pool_min_interval_s)):
    if value is not None and kind is None:
      return f"{flag} paces the decisions on a pool: {sized} {flag}."
  if args.standby is not None and kind != "local":
    return ("--pool-standby keeps local workers warm: pass --workers "
            "local:MIN-MAX or drop --pool-standby.")
  return None


def _dispatcher_main(args: argparse.Namespace) -> int:
  problem = pool_flags_problem(args)
  if problem is not None:
    print(f"intune service dispatcher: error: {problem}", file=sys.stderr,
          flush=True)
    return 2
  # The flags given, each under its `dest`: a parameter of
  # `run_dispatcher`, whose defaults the others take.
  params = inspect.signature(dispatcher.run_dispatcher).parameters
  given = {name: value for name, value in vars(args).items()
           if name in params and value is not None}
  if args.workers:
    given["workers"] = args.workers[1:]  # (MIN, MAX) without the kind
  try:
    return dispatcher.run_dispatcher(**given)
  except (ServiceError, scalers.ScalerError) as e:
    return _fail("dispatcher", e)


def _worker_main(args: argparse.Namespace) -> int:
  try:
    parse_address(args.dispatcher, "--dispatcher")
    if (args.port is None) == (not args.standby):
      raise ServiceError("pass --port, or --standby to read the port from "
                         "stdin once it is needed")
  except ServiceError as e:
    print(f"intune service worker: error: {e}", flush=True)
    return 2
  try:
    port = args.port
    if args.standby:
      # Most of a worker's start-up, done before it has a port.
      from intune_tf.ops import loader  # noqa: PLC0415  (loads TensorFlow)
      loader.ops()
      logging.info("Standby worker ready (pid %d): waiting for a port on "
                   "stdin.", os.getpid())
      port = worker.standby_port(sys.stdin)
      if port is None:
        logging.info("Standby worker: stdin closed; exiting unused.")
        return 0
    if args.standby or args.exit_with_stdin:
      worker.exit_with_stdin()
    return worker.run_worker(args.dispatcher, port, args.host,
                             args.dispatcher_wait, args.heartbeat_interval_ms,
                             ready_fd=args.ready_fd)
  except ServiceError as e:
    return _fail("worker", e)


def add_commands(subparsers) -> None:
  """Adds the `intune service` commands to `subparsers`."""
  d = subparsers.add_parser(
      "dispatcher", help="Start a tf.data service dispatcher (InTune loaded).")
  d.add_argument("--port", type=arguments.port, required=True,
                 help="Port to listen on (on all interfaces).")
  d.add_argument("--host", default="127.0.0.1",
                 help="The address workers and clients use (default "
                 "127.0.0.1).")
  d.add_argument("--work-dir",
                 help="Journal folder: a restarted dispatcher resumes its "
                 "jobs (default: none).")
  d.add_argument("--worker-timeout-ms", type=arguments.positive_int,
                 help="Log a worker lost after this long without a heartbeat "
                 "(default: TensorFlow's).")
  d.add_argument("--workers", metavar="KIND:MIN-MAX",
                 type=arguments.parsed_by(scalers.parse_pool_spec, "pool"),
                 help="Size a pool of MIN to MAX workers from the trainer's "
                 "reports (service.ConsumerMeter): local:MIN-MAX runs local "
                 "workers, command:MIN-MAX --scale-command.")
  d.add_argument("--scale-command", metavar="COMMAND",
                 type=arguments.parsed_by(scalers.check_template,
                                          "scale_command"),
                 help="The shell command that sets the workers of --workers "
                 f"command:MIN-MAX or --scale-out to {{n}}, e.g. {_EXAMPLE}.")
  d.add_argument("--scale-out", type=arguments.positive_int, metavar="N",
                 help="With --workers local:MIN-MAX: the host's workers "
                 "first, then up to N more through --scale-command.")
  d.add_argument("--scale-timeout", type=arguments.duration,
                 metavar="SECONDS", dest="scale_timeout_s",
                 help="Seconds --scale-command may run before it is killed "
                 f"(default {scalers.DEFAULT_COMMAND_TIMEOUT_S:g}).")
  d.add_argument("--pool-period", type=arguments.duration, metavar="SECONDS",
                 dest="pool_period_s",
                 help="Seconds between two decisions on the pool (default "
                 f"{dispatcher.DEFAULT_POOL_PERIOD_S:g}).")
  d.add_argument("--pool-min-interval", type=arguments.optional_duration,
                 metavar="SECONDS", dest="pool_min_interval_s",
                 help="Seconds between a change taking effect and the next "
                 f"(default {dispatcher.DEFAULT_POOL_MIN_INTERVAL_S:g}).")
  d.add_argument("--pool-controller", default="intune", dest="controller",
                 choices=tuple(controllers.CONTROLLERS),
                 help="What sizes the pool; tf-formula (TensorFlow's "
                 "estimate) and cachew (Cachew's hill climb) are there to "
                 "compare (default intune).")
  d.add_argument("--pool-standby", type=arguments.non_negative_int,
                 metavar="N", dest="standby",
                 help="Local workers kept warm to serve at once (TensorFlow "
                 f"loaded); 0: none (default {workers.DEFAULT_STANDBY}).")
  d.set_defaults(func=_dispatcher_main)
  w = subparsers.add_parser(
      "worker", help="Start a tf.data service worker tuned by InTune.")
  w.add_argument("--dispatcher", required=True, metavar="HOST:PORT",
                 help="The dispatcher's address.")
  w.add_argument("--port", type=arguments.port,
                 help="Port to listen on (on all interfaces); required "
                 "without --standby.")
  w.add_argument("--standby", action="store_true",
                 help="Load TensorFlow and InTune, then serve on the port "
                 "read as one line of stdin; exit at the end of stdin.")
  w.add_argument("--exit-with-stdin", action="store_true",
                 help="Stop at the end of stdin (held open by a supervisor).")
  w.add_argument("--ready-fd", type=arguments.positive_int, metavar="FD",
                 help="Write 'registered PORT' to this inherited file "
                 "descriptor once registered, then close it.")
  w.add_argument("--host", default="127.0.0.1",
                 help="The address this worker advertises (default "
                 "127.0.0.1).")
  w.add_argument("--dispatcher-wait", type=arguments.optional_duration,
                 default=worker.DEFAULT_DISPATCHER_WAIT_S, metavar="SECONDS",
                 help="Seconds the dispatcher has to register the worker at "
                 f"start (default {worker.DEFAULT_DISPATCHER_WAIT_S:g}).")
  w.add_argument("--heartbeat-interval-ms", type=arguments.positive_int,
                 help="How often to report to the dispatcher, below its "
                 "--worker-timeout-ms (default: TensorFlow's).")
  w.set_defaults(func=_worker_main)
