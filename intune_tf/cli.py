"""The `intune` command line: `intune <group> <command> [flags]`.

Each group lives in the module that owns it and contributes its sub-commands
through an `add_commands(subparsers)` function; a command's parser sets
`func` to a callable taking the parsed arguments and returning an exit code.
"""

from __future__ import annotations

import importlib
import sys
from typing import Sequence

from absl import app
from absl import logging
from absl.flags import argparse_flags

import intune_tf
from intune_tf import arguments

# Top-level commands: (name, module providing `add_parser(subparsers, helps)`,
# the help its parser gives, shown while the module is not loaded). The help
# is passed in (`helps`): the modules sit below the command line and do not
# import it.
_COMMANDS = (
    ("try", "intune_tf.bench.trial",
     "Run your own pipeline under AUTOTUNE and InTune, side by side."),
    ("demo", "intune_tf.bench.demo",
     "Train a tiny DLRM under AUTOTUNE and InTune, side by side."),
    ("bench", "intune_tf.bench.harness",
     "Run policies side by side on benchmark scenarios."),
    ("inspect", "intune_tf.observe.inspect",
     "Show the per-stage table of running InTune jobs."),
    ("pretrain", "intune_tf.sim.pretrain",
     "Pretrain the agent in the simulator."),
    ("simulate", "intune_tf.sim.pretrain",
     "Score the agent and the non-learning baselines against the "
     "simulator's optimum and the best baseline on random pipelines."),
    ("calibrate", "intune_tf.sim.calibration",
     "Fit the simulator to an `intune bench --trace` trace and report "
     "predicted vs measured throughput."),
)
# What the [bench] extra installs.
_EXTRA = ("matplotlib", "tqdm")
# (group name, module providing `add_commands`, help).
_GROUPS = (
    ("criteo", "intune_tf.criteo.cli",
     "Criteo workload: generate, convert, compare, bench."),
    ("service", "intune_tf.service",
     "tf.data service dispatcher and workers tuned by InTune."),
)


# The help of each top-level command, passed to its module's `add_parser`.
_HELPS = {name: text for name, _, text in _COMMANDS}
# The commands' shared argument type; its home is `intune_tf.arguments`.
positive_int = arguments.positive_int


def command_help(name: str) -> str:
  """The help of the top-level command `name`, as `_COMMANDS` gives it."""
  return _HELPS[name]


def parser(argv: Sequence[str] | None = None
           ) -> argparse_flags.ArgumentParser:
  """The `intune` command's parser, every subcommand included.

  Args:
    argv: the arguments it will parse. Default None: every command's module
      is loaded. Given, only the modules of the commands named in `argv` are:
      the others (some load TensorFlow) get a stand-in showing their help, so
      that `intune --help` and `intune inspect` stay light.
  """
  parser = argparse_flags.ArgumentParser(
      prog="intune",
      description="InTune: live tuning of tf.data input pipelines.")
  parser.add_argument("--version", action="version",
                      version=f"intune_tf {intune_tf.__version__}")
  groups = parser.add_subparsers(dest="group", metavar="COMMAND")
  groups.required = True
  named = set(argv) if argv is not None else {n for n, _, _ in _COMMANDS}
  load = {module for name, module, _ in _COMMANDS if name in named}
  loaded = set()
  for name, module, help_text in _COMMANDS:
    if module in loaded:
      continue  # its add_parser added this command too
    if module not in load:
      groups.add_parser(name, help=help_text)
      continue
    loaded.add(module)
    try:
      importlib.import_module(module).add_parser(groups, _HELPS)
    except ModuleNotFoundError as e:
      if e.name not in _EXTRA:
        raise
      for other, _, _ in (c for c in _COMMANDS if c[1] == module):
        _add_missing_extra(groups, other, e.name)
  for name, module, help_text in _GROUPS:
    sub = groups.add_parser(name, help=help_text)
    if argv is not None and name not in named:
      continue  # a stand-in: `intune_tf.criteo` loads TensorFlow
    commands = sub.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    importlib.import_module(module).add_commands(commands)
  return parser


def _needs_extra(name: str, missing: str) -> str:
  return (f"intune {name} needs {missing}, from the [bench] extra: "
          "pip install 'intune_tf[bench]'")


def _add_missing_extra(groups, name: str, missing: str) -> None:
  """A command whose module needs the [bench] extra: it says so when run."""
  def fail(_):
    sys.exit(_needs_extra(name, missing))
  sub = groups.add_parser(name, help=f"(needs the [bench] extra: {missing})")
  sub.set_defaults(func=fail, needs_extra=missing)


def parse_args(argv: Sequence[str]):
  """Parses `argv` (without the program name).

  A command that needs a missing extra says so whatever its arguments: its
  stand-in parser knows none of the real command's flags.
  """
  the_parser = parser(argv)
  args, unknown = the_parser.parse_known_args(list(argv))
  if unknown and getattr(args, "needs_extra", None) is None:
    the_parser.error("unrecognized arguments: " + " ".join(unknown))
  return args


def _main(args) -> None:
  try:
    code = args.func(args)
  except ModuleNotFoundError as e:
    # A command that imports the [bench] extra only where it needs it.
    missing = (e.name or "").partition(".")[0]
    if missing not in _EXTRA:
      raise
    name = " ".join(v for v in (args.group, getattr(args, "command", None))
                    if v)
    sys.exit(_needs_extra(name, missing))
  sys.exit(code or 0)


def run(argv: Sequence[str] | None = None) -> None:
  """Entry point of the `intune` console script."""
  logging.set_verbosity(logging.INFO)
  app.run(_main, argv=[sys.argv[0]] + list(argv) if argv is not None else None,
          flags_parser=lambda a: parse_args(a[1:]))

