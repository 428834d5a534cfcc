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

# Top-level commands: modules providing `add_parser(subparsers)`.
_COMMANDS = ("intune_tf.demo", "intune_tf.harness", "intune_tf.inspect",
             "intune_tf.pretrain", "intune_tf.calibration")
# (group name, module providing `add_commands`, help).
_GROUPS = (
    ("criteo", "intune_tf.criteo.cli",
     "Criteo workload: generate, convert, compare, bench."),
    ("service", "intune_tf.service",
     "tf.data service dispatcher and workers tuned by InTune."),
)


def _parser() -> argparse_flags.ArgumentParser:
  parser = argparse_flags.ArgumentParser(
      prog="intune",
      description="InTune: reinforcement-learning tuning of tf.data pipelines.")
  groups = parser.add_subparsers(dest="group", metavar="COMMAND")
  groups.required = True
  for module in _COMMANDS:
    importlib.import_module(module).add_parser(groups)
  for name, module, help_text in _GROUPS:
    sub = groups.add_parser(name, help=help_text)
    commands = sub.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    importlib.import_module(module).add_commands(commands)
  return parser


def _main(args) -> None:
  sys.exit(args.func(args) or 0)


def run(argv: Sequence[str] | None = None) -> None:
  """Entry point of the `intune` console script."""
  logging.set_verbosity(logging.INFO)
  app.run(_main, argv=[sys.argv[0]] + list(argv) if argv is not None else None,
          flags_parser=lambda a: _parser().parse_args(a[1:]))


if __name__ == "__main__":
  run()
