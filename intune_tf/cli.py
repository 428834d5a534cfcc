"""The `intune` command line: `intune <group> <command> [flags]`.

Each group lives in the module that owns it and contributes its sub-commands
through an `add_commands(subparsers)` function; a command's parser sets
`func` to a callable taking the parsed arguments and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from absl import app
from absl import logging
from absl.flags import argparse_flags

# Top-level commands: (name, module providing `add_parser(subparsers)`).
_COMMANDS = (("demo", "intune_tf.bench.demo"),
             ("bench", "intune_tf.bench.harness"),
             ("inspect", "intune_tf.observe.inspect"),
             ("pretrain", "intune_tf.sim.pretrain"),
             ("calibrate", "intune_tf.sim.calibration"))
# What the [bench] extra installs.
_EXTRA = ("matplotlib", "tqdm")
# (group name, module providing `add_commands`, help).
_GROUPS = (
    ("criteo", "intune_tf.criteo.cli",
     "Criteo workload: generate, convert, compare, bench."),
    ("service", "intune_tf.service",
     "tf.data service dispatcher and workers tuned by InTune."),
)


def positive_int(text: str) -> int:
  """An argparse type of every command: an integer of at least 1.

  positive_int("3") = 3; positive_int("0") and positive_int("x") raise
  argparse.ArgumentTypeError("'0' is not a positive integer; pass 1 or more.").
  """
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a positive integer; pass 1 or more.")
  return value


def parser() -> argparse_flags.ArgumentParser:
  """The `intune` command's parser, every subcommand included."""
  parser = argparse_flags.ArgumentParser(
      prog="intune",
      description="InTune: reinforcement-learning tuning of tf.data pipelines.")
  groups = parser.add_subparsers(dest="group", metavar="COMMAND")
  groups.required = True
  for name, module in _COMMANDS:
    try:
      importlib.import_module(module).add_parser(groups)
    except ModuleNotFoundError as e:
      if e.name not in _EXTRA:
        raise
      _add_missing_extra(groups, name, e.name)
  for name, module, help_text in _GROUPS:
    sub = groups.add_parser(name, help=help_text)
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
  the_parser = parser()
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

