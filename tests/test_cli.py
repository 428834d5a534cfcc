"""The `intune` command line without the optional [bench] extra."""

import argparse
import json
import subprocess
import sys

import pytest

# Runs each command line of the JSON list argv[1] in turn, in one process,
# with tqdm (from the [bench] extra) made unimportable, and prints one JSON
# line per command: its exit code, stderr and stdout. One process where each
# command line started its own: each of them loads TensorFlow and Keras
# (about 10 s of a core). A command's module that
# failed to import is not left in sys.modules, so the next command imports
# it again, as a fresh process would.
_WITHOUT_TQDM = """
import contextlib, io, json, sys
sys.modules["tqdm"] = None
from intune_tf import cli
for argv in json.loads(sys.argv[1]):
  err, out = io.StringIO(), io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
    try:
      cli.run(argv)
      code = 0
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else 1
      if not isinstance(e.code, int) and e.code is not None:
        print(e.code, file=sys.stderr)
  print(json.dumps({"argv": argv, "code": code, "stderr": err.getvalue(),
                    "stdout": out.getvalue()}), flush=True)
"""

_NEEDS_TQDM = ("intune {} needs tqdm, from the [bench] extra: "
               "pip install 'intune_tf[bench]'")


@pytest.mark.slow
def test_commands_without_the_extra_say_what_to_install(tmp_path):
  # (command line, exit code, the last line of stderr, the start of stdout).
  cases = [
      (["bench"], 1, _NEEDS_TQDM.format("bench"), ""),
      (["bench", "--policies", "autotune"], 1, _NEEDS_TQDM.format("bench"),
       ""),
      (["bench", "--no-such-flag", "x"], 1, _NEEDS_TQDM.format("bench"), ""),
      # Imports tqdm only when it runs.
      (["criteo", "generate", "--rows", "10", "--out", str(tmp_path),
        "--quiet"], 1, _NEEDS_TQDM.format("criteo generate"), ""),
      # The commands that do not need the extra still work, and still refuse
      # flags they do not know.
      (["inspect", "--status-dir", str(tmp_path)], 1, None,
       "no running InTune job found"),
      (["inspect", "--no-such-flag"], 2,
       "intune: error: unrecognized arguments: --no-such-flag", ""),
  ]
  # Run outside the checkout: `-c` puts the working directory first on the
  # path, and the checkout is not the installed package on the compat stack.
  result = subprocess.run(
      [sys.executable, "-c", _WITHOUT_TQDM, json.dumps([c[0] for c in cases])],
      capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path)
  runs = [json.loads(line) for line in result.stdout.splitlines()
          if line.startswith("{")]
  assert len(runs) == len(cases), result.stderr[-3000:]
  for (argv, code, last_err, out_start), run in zip(cases, runs):
    assert (run["argv"], run["code"]) == (argv, code), run
    if last_err is not None:
      assert run["stderr"].strip().splitlines()[-1].endswith(last_err), run
    assert run["stdout"].startswith(out_start), run


@pytest.mark.slow
def test_python_dash_m_runs_the_command(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "intune_tf", "inspect", "--status-dir",
       str(tmp_path)], capture_output=True, text=True, timeout=300,
      check=False, cwd=tmp_path)
  assert result.returncode == 1, result.stderr[-2000:]
  assert result.stdout.startswith("no running InTune job found")


def _commands(parser, path=("intune",)):
  """(command path, parser) of every command under `parser`."""
  yield path, parser
  for action in parser._actions:  # noqa: SLF001  argparse has no public walk
    for name, sub in getattr(action, "choices", None).items() if isinstance(
        action, argparse._SubParsersAction) else ():  # noqa: SLF001
      yield from _commands(sub, path + (name,))


def test_every_flag_of_every_command_is_kebab_case():
  from intune_tf import cli  # noqa: PLC0415  loads TF: only here
  commands = dict(_commands(cli.parser()))
  assert (("intune", "bench") in commands and
          ("intune", "criteo", "generate") in commands)
  flags = {(" ".join(path), flag)
           for path, parser in commands.items() if len(path) > 1
           for action in parser._actions  # noqa: SLF001
           # absl's own flags (--log_dir, ...) come with every parser.
           if not type(action).__module__.startswith("absl.")
           for flag in action.option_strings if flag.startswith("--")}
  assert len(flags) > 40
  assert sorted(f for f in flags if "_" in f[1]) == []


# Runs the CLI, then prints whether TensorFlow was loaded.
_LIGHT = ("import sys; from intune_tf import cli\n"
          "try:\n  cli.run(sys.argv[1:])\n"
          "except SystemExit as e:\n  code = e.code\n"
          "print('tensorflow' in sys.modules, code)")


@pytest.mark.parametrize("args,code", [
    (("--help",), 0),
    (("--version",), 0),
    (("inspect", "--help"), 0),
    (("inspect", "--status-dir", "{tmp}"), 1),  # nothing running
])
def test_help_and_inspect_load_no_tensorflow(tmp_path, args, code):
  result = subprocess.run(
      [sys.executable, "-c", _LIGHT, *(a.format(tmp=tmp_path) for a in args)],
      capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
  assert result.stdout.splitlines()[-1] == f"False {code}", (
      result.stderr[-2000:])
  if args == ("--help",):
    assert "calibrate" in result.stdout and "bench" in result.stdout
    assert "reinforcement" not in result.stdout
  if args == ("--version",):
    import intune_tf  # noqa: PLC0415  the version the command must print
    assert result.stdout.startswith(f"intune_tf {intune_tf.__version__}\n")


def test_commands_not_loaded_show_their_own_help():
  """The help `intune --help` shows for a command it does not load is the
  help the command's module gives it."""
  from intune_tf import cli  # noqa: PLC0415  loads TF: only here
  def helps(parser):
    action = next(a for a in parser._actions  # noqa: SLF001
                  if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return {c.dest: c.help for c in action._choices_actions}  # noqa: SLF001
  light, full = helps(cli.parser([])), helps(cli.parser())
  assert {n for n, _, _ in cli._COMMANDS} <= set(full)  # noqa: SLF001
  assert light == full
