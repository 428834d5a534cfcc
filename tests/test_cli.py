"""The `intune` command line without the optional [bench] extra."""

import argparse
import subprocess
import sys

import pytest

# Runs the CLI with tqdm (from the [bench] extra) made unimportable.
_WITHOUT_TQDM = ("import sys; sys.modules['tqdm'] = None; "
                 "from intune_tf import cli; cli.run(sys.argv[1:])")


def _intune(tmp_path, *args):
  # Run outside the checkout: `-c` puts the working directory first on the
  # path, and the checkout is not the installed package on the compat stack.
  return subprocess.run([sys.executable, "-c", _WITHOUT_TQDM, *args],
                        capture_output=True, text=True, timeout=300,
                        check=False, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("command,args", [
    ("bench", ()),
    ("bench", ("--policies", "autotune")),
    ("bench", ("--no-such-flag", "x")),
    # Imports tqdm only when it runs.
    ("criteo generate", ("--rows", "10", "--out", "{tmp}", "--quiet")),
])
def test_commands_without_the_extra_say_what_to_install(tmp_path, command,
                                                        args):
  result = _intune(tmp_path, *command.split(),
                   *(a.format(tmp=tmp_path) for a in args))
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f"intune {command} needs tqdm, from the [bench] extra: "
      "pip install 'intune_tf[bench]'")


@pytest.mark.slow
def test_unknown_flags_of_a_working_command_are_still_refused(tmp_path):
  result = _intune(tmp_path, "inspect", "--no-such-flag")
  assert result.returncode == 2
  assert "unrecognized arguments: --no-such-flag" in result.stderr


@pytest.mark.slow
def test_python_dash_m_runs_the_command(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "intune_tf", "inspect", "--status-dir",
       str(tmp_path)], capture_output=True, text=True, timeout=300,
      check=False, cwd=tmp_path)
  assert result.returncode == 1, result.stderr[-2000:]
  assert result.stdout.startswith("no running InTune job found")


@pytest.mark.slow
def test_other_commands_work_without_the_extra(tmp_path):
  result = _intune(tmp_path, "inspect", "--status-dir", str(tmp_path))
  assert result.returncode == 1  # nothing running, and no import error
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
