"""The argument types of the `intune` commands, every numeric flag of every
command swept with nan, inf, -1 and 0, and the flags of the benchmark and
example scripts."""

import argparse
import ast
import numbers
import os
import pathlib
import re

import pytest

from intune_tf import arguments
from intune_tf import cli


@pytest.mark.parametrize("text,expected",
                         [("1", 1), ("3", 3), ("60000", 60000)])
def test_positive_int_takes_one_or_more(text, expected):
  assert arguments.positive_int(text) == expected


@pytest.mark.parametrize("text", ["0", "-2", "x", "1.5", ""])
def test_positive_int_refuses_the_rest(text):
  with pytest.raises(argparse.ArgumentTypeError,
                     match="^" + re.escape(f"{text!r} is not a positive "
                                           "integer; pass 1 or more.") + "$"):
    arguments.positive_int(text)


@pytest.mark.parametrize("text,expected", [("1", 1), ("64", 64),
                                           ("512", 512)])
def test_int_in_takes_its_range(text, expected):
  assert arguments.int_in(1, 512, "pool size")(text) == expected


@pytest.mark.parametrize("text", ["0", "513", "-1", "x", "nan", "1.5", ""])
def test_int_in_refuses_the_rest(text):
  with pytest.raises(argparse.ArgumentTypeError,
                     match="^" + re.escape(f"{text!r} is not a pool size; "
                                           "pass 1 to 512.") + "$"):
    arguments.int_in(1, 512, "pool size")(text)


@pytest.mark.parametrize("kind,text,expected", [
    (arguments.non_negative_int, "0", 0),
    (arguments.non_negative_int, "1234", 1234),
    (arguments.positive_float, "0.3", 0.3),
    (arguments.port, "1", 1),
    (arguments.port, "65535", 65535),
    (arguments.duration, "0.5", 0.5),
    (arguments.duration, "1e3", 1000.0),
    (arguments.optional_duration, "0", 0.0),
    (arguments.optional_duration, "2", 2.0),
])
def test_each_type_takes_what_it_says(kind, text, expected):
  assert kind(text) == expected


@pytest.mark.parametrize("kind,texts,message", [
    (arguments.non_negative_int, ["-1", "nan", "x", "0.5"],
     "{text!r} is not an integer of 0 or more; pass 0 or more."),
    (arguments.positive_float, ["0", "-1", "nan", "inf", "-inf", "x"],
     "{text!r} is not a positive number; pass a finite number above 0."),
    (arguments.port, ["0", "-1", "65536", "nan", "x"],
     "{text!r} is not a port; pass 1 to 65535."),
    (arguments.duration, ["0", "-1", "nan", "inf", "x"],
     "{text!r} is not a duration; pass finite seconds above 0."),
    (arguments.optional_duration, ["-1", "nan", "inf", "-0.5"],
     "{text!r} is not a duration; pass finite seconds 0 or more."),
])
def test_each_type_refuses_the_rest_saying_what_it_takes(kind, texts,
                                                         message):
  for text in texts:
    with pytest.raises(argparse.ArgumentTypeError,
                       match="^" + re.escape(message.format(text=text)) +
                       "$"):
      kind(text)


@pytest.mark.parametrize("kind", [arguments.duration,
                                  arguments.optional_duration])
def test_a_duration_longer_than_sleep_can_wait_is_refused(kind):
  # `intune inspect --watch 1e10` printed once, then `OverflowError:
  # timestamp out of range for platform time_t`, as with inf.
  assert kind("1e9") == 1e9
  with pytest.raises(argparse.ArgumentTypeError, match="^" + re.escape(
      "'1e10' is too long a duration; pass at most 1e+09 seconds.") + "$"):
    kind("1e10")


def test_output_file_is_a_file_in_a_writable_folder(tmp_path):
  assert arguments.output_file(str(tmp_path / "new.json")) == str(
      tmp_path / "new.json")
  with pytest.raises(argparse.ArgumentTypeError,
                     match=f"^{tmp_path} is a folder: pass the path of a file "
                     "to write.$"):
    arguments.output_file(str(tmp_path))
  missing = tmp_path / "no" / "x.json"
  with pytest.raises(argparse.ArgumentTypeError, match="^" + re.escape(
      f"cannot write {missing}: the folder {missing.parent} does not exist; "
      "create it or pass another path.") + "$"):
    arguments.output_file(str(missing))
  (tmp_path / "file").write_text("x")
  inside = tmp_path / "file" / "x.json"
  with pytest.raises(argparse.ArgumentTypeError,
                     match=re.escape(f"the folder {inside.parent} is not a "
                                     "folder")):
    arguments.output_file(str(inside))


def test_output_folder_may_be_new_under_a_writable_one(tmp_path):
  assert arguments.output_folder(str(tmp_path / "a" / "b")) == str(
      tmp_path / "a" / "b")
  assert arguments.output_folder(str(tmp_path)) == str(tmp_path)
  (tmp_path / "file").write_text("x")
  with pytest.raises(argparse.ArgumentTypeError, match="^" + re.escape(
      f"cannot write in {tmp_path / 'file'}: it is not a folder; pass a "
      "folder.") + "$"):
    arguments.output_folder(str(tmp_path / "file"))
  with pytest.raises(argparse.ArgumentTypeError, match=re.escape(
      f"{tmp_path / 'file'} is not a folder; pass a folder you can write.")):
    arguments.output_folder(str(tmp_path / "file" / "sub"))


@pytest.mark.skipif(os.getuid() == 0, reason="root may write anywhere")
def test_a_read_only_folder_is_refused(tmp_path):
  folder = tmp_path / "ro"
  folder.mkdir(mode=0o500)
  with pytest.raises(argparse.ArgumentTypeError, match="is not writable"):
    arguments.output_file(str(folder / "x.json"))


def test_names_in_reads_the_valid_names_when_parsing():
  valid = ["climb", "even"]
  policy = arguments.names_in(lambda: valid, "policy")
  assert policy("even,climb") == "even,climb"
  with pytest.raises(argparse.ArgumentTypeError, match="^" + re.escape(
      "unknown policy 'clmb'; valid: climb, even.") + "$"):
    policy("even,clmb")
  with pytest.raises(argparse.ArgumentTypeError,
                     match=re.escape("unknown policy none given")):
    policy(",")
  valid.append("clmb")  # registered later: known from then on
  assert policy("clmb") == "clmb"


# The command lines that used to hang, measure nothing, print a
# traceback or fail after the work: each now stops before anything runs,
# with exit status 2 and the flag named.
@pytest.mark.parametrize("argv,message", [
    # Hung with no output (a NaN deadline).
    ("service worker --dispatcher 127.0.0.1:47612 --port 47613 "
     "--dispatcher-wait nan",
     "argument --dispatcher-wait: 'nan' is not a duration; pass finite "
     "seconds 0 or more."),
    # Measured for 5 s, printed an empty line, exit 0.
    ("bench --scenarios memory-cap --policies even --repeats 0",
     "argument --repeats: '0' is not a positive integer; pass 1 or more."),
    # Printed once, then OverflowError: timestamp out of range.
    ("inspect --watch inf",
     "argument --watch: 'inf' is not a duration; pass finite seconds above "
     "0."),
    # Printed the table, then a FileNotFoundError traceback; no JSON.
    ("simulate --pipelines 2 --steps 10 --json /nonexistent/dir/x.json",
     "argument --json: cannot write /nonexistent/dir/x.json: the folder "
     "/nonexistent/dir does not exist; create it or pass another path."),
    # A raw traceback ending `ValueError: Unknown policies ['clmb']`.
    ("simulate --pipelines 2 --steps 10 --policies intune,clmb",
     "argument --policies: unknown policy 'clmb'; valid: intune, "
     "intune-ablated, jump-climb, climb, coordinate, plumber, analytic, "
     "even, intune-search, intune-dqn."),
    ("bench --policies evn",
     "argument --policies: unknown policy 'evn'; valid: unoptimized, even,"),
    ("bench --scenarios nope",
     "argument --scenarios: unknown scenario 'nope'; valid: cotenant, "
     "criteo-l1-b1024,"),
])
def test_bad_command_lines_stop_before_anything_runs(argv, message, capsys):
  with pytest.raises(SystemExit) as stopped:
    cli.parse_args(argv.split())
  assert stopped.value.code == 2
  err = capsys.readouterr().err
  assert message in err, err
  assert "Traceback" not in err


def _commands(parser, path=()):
  """(command words, leaf parser) of every `intune` command."""
  subs = [a for a in parser._actions  # noqa: SLF001
          if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
  if not subs:
    yield path, parser
  for sub in subs:
    for name, child in sub.choices.items():
      yield from _commands(child, (*path, name))


def _is_number(value) -> bool:
  if isinstance(value, (tuple, list)):
    return bool(value) and all(_is_number(v) for v in value)
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _numeric(action) -> bool:
  """Whether a flag takes a number (or a list of numbers): its type turns
  some small number into one."""
  if not action.option_strings or action.nargs == 0 or action.type is None:
    return False
  for text in ("1", "2", "4"):
    try:
      if _is_number(action.type(text)):
        return True
    except (argparse.ArgumentTypeError, ValueError, TypeError):
      pass
  return False


def _numeric_flags():
  for path, parser in _commands(_PARSER):
    for action in parser._actions:  # noqa: SLF001
      if _numeric(action):
        yield " ".join(path), action


# Values a numeric flag accepts because they mean something; every other
# nan, inf, -1 and 0 must be refused.
MEANINGFUL = {
    ("pretrain", "--seed", "0"): "a seed like any other",
    ("simulate", "--seed", "0"): "a seed like any other",
    ("criteo generate", "--seed", "0"): "a seed like any other",
    ("criteo compare", "--seed", "0"): "a seed like any other",
    ("bench", "--warmup", "0"): "no warm-up",
    ("criteo bench", "--warmup-batches", "0"): "no warm-up batches",
    ("service worker", "--dispatcher-wait", "0"):
        "try the dispatcher once, without waiting",
    ("service dispatcher", "--pool-min-interval", "0"):
        "no wait between two changes of the pool",
    ("service dispatcher", "--pool-standby", "0"):
        "every local worker starts cold",
    ("try", "--step-ms", "0"): "no stand-in model step",
}
_PARSER = cli.parser()
_FLAGS = list(_numeric_flags())


def test_the_sweep_sees_the_numeric_flags_of_every_command():
  seen = {(command, action.option_strings[-1]) for command, action in _FLAGS}
  assert {("bench", "--repeats"), ("inspect", "--watch"),
          ("service worker", "--dispatcher-wait"), ("simulate", "--steps"),
          ("demo", "--minutes"), ("criteo bench", "--windows"),
          ("bench", "--oracle-cpus")} <= seen
  assert {k[:2] for k in MEANINGFUL} <= seen  # no stale allowance


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
@pytest.mark.parametrize(
    "command,action", _FLAGS,
    ids=[f"{c} {a.option_strings[-1]}" for c, a in _FLAGS])
def test_every_numeric_flag_refuses_nan_inf_and_what_means_nothing(
    command, action, value, capsys):
  flag = action.option_strings[-1]
  if (command, flag, value) in MEANINGFUL:
    assert action.type(value) == 0  # taken, as documented
    return
  with pytest.raises(SystemExit) as stopped:
    _PARSER.parse_args([*command.split(), flag, value])
  assert stopped.value.code == 2
  named = "/".join(action.option_strings)
  assert f"argument {named}: " in capsys.readouterr().err


def test_parsed_by_turns_the_parsers_value_error_into_the_flags():
  def parse(text):
    if text != "ok":
      raise ValueError(f"{text!r} is not ok; pass ok.")
    return 7
  kind = arguments.parsed_by(parse, "okay")
  assert kind("ok") == 7 and kind.__name__ == "okay"
  with pytest.raises(argparse.ArgumentTypeError,
                     match=re.escape("'no' is not ok; pass ok.")):
    kind("no")
  parser = argparse.ArgumentParser(prog="p")
  parser.add_argument("--x", type=kind)
  with pytest.raises(SystemExit) as stopped:
    parser.parse_args(["--x", "no"])
  assert stopped.value.code == 2


_ROOT = pathlib.Path(__file__).resolve().parent.parent
_SCRIPTS = sorted([*(_ROOT / "benchmarks").glob("*.py"),
                   *(_ROOT / "examples").rglob("*.py")])


def _flag_types(path: pathlib.Path):
  """(line, flag, type node) of every `add_argument` in `path` with a type."""
  for node in ast.walk(ast.parse(path.read_text())):
    if (isinstance(node, ast.Call) and
        isinstance(node.func, ast.Attribute) and
        node.func.attr == "add_argument"):
      for keyword in node.keywords:
        if keyword.arg == "type":
          flag = node.args[0].value if node.args else "?"
          yield node.lineno, flag, keyword.value


def test_benchmark_and_example_flags_refuse_nan_inf_and_nonsense():
  # A bare int or float takes "nan", "inf", "0" and "-1" for a count or a
  # duration; every numeric flag of a script goes through `arguments`.
  checked, bare = 0, []
  for path in _SCRIPTS:
    for line, flag, kind in _flag_types(path):
      if isinstance(kind, ast.Name) and kind.id in ("int", "float"):
        bare.append(f"{path.relative_to(_ROOT)}:{line} {flag}")
      checked += 1
  assert not bare, f"flags parsed by a bare int or float: {bare}"
  assert checked >= 40  # the sweep sees the scripts' flags
