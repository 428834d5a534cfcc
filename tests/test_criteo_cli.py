"""Tests of the `intune criteo ...` commands (intune_tf.criteo.cli)."""

import argparse
import json

import pytest

from intune_tf.criteo import cli
from intune_tf.criteo import synthetic


def _run(argv):
  """Parses `argv` as `intune criteo` would and runs the command."""
  parser = argparse.ArgumentParser(prog="intune criteo")
  commands = parser.add_subparsers(dest="command", required=True)
  cli.add_commands(commands)
  args = parser.parse_args(argv)
  return args.func(args)


@pytest.mark.slow
def test_generate_then_count(tmp_path, capsys):
  out = tmp_path / "gen"
  assert _run(["generate", "--rows", "2500", "--out", str(out), "--seed", "2",
               "--rows-per-file", "1000", "--quiet"]) == 0
  printed = capsys.readouterr().out.split()
  assert [p.rsplit("/", 1)[1] for p in printed] == [
      "part-00000.tsv", "part-00001.tsv", "part-00002.tsv"]
  assert _run(["count", str(out / "*.tsv"), "--on-bad-row", "skip"]) == 0
  assert capsys.readouterr().out.split() == ["rows:", "2500",
                                             "bad_rows_skipped:", "0"]


@pytest.mark.slow
def test_convert_to_tfrecord(tmp_path, capsys):
  src = synthetic.generate(300, tmp_path / "src")
  assert _run(["convert", *src, "--out", str(tmp_path / "tfr"), "--quiet"]) == 0
  assert capsys.readouterr().out.split()[0].endswith("part-00000.tfrecord")


@pytest.mark.slow
def test_bench_prints_a_markdown_table(tmp_path, capsys):
  src = synthetic.generate(2000, tmp_path, seed=1)
  assert _run(["bench", "--files", *src, "--levels", "1,3", "--batch-size",
               "256", "--warmup-batches", "2", "--window-batches", "2",
               "--windows", "3"]) == 0
  out = capsys.readouterr().out
  assert "| level | stages | rows/s (median) |" in out
  assert "| L1 | read > batch > prefetch |" in out
  assert "| L3 | read > shuffle > batch > parse > prefetch |" in out


@pytest.mark.slow
def test_fit_and_compare(tmp_path, capsys, criteo_real_dir):
  real = str(criteo_real_dir / "criteo_sample_10k.tsv")
  assert _run(["fit", "--real", real, "--out", str(tmp_path / "s.json")]) == 0
  assert json.loads((tmp_path / "s.json").read_text()) == synthetic.load_stats()
  png = tmp_path / "c.png"
  assert _run(["compare", "--real", real, "--out", str(png)]) == 0
  assert png.read_bytes()[:4] == b"\x89PNG"
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert summary["max_missing_rate_gap"] < 0.03


def _usage_error(argv, capsys) -> str:
  """Runs `argv`, which must fail to parse; returns its stderr."""
  with pytest.raises(SystemExit) as exit_info:
    _run(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert "Traceback" not in err
  return err


def test_bad_parallelism_flag(capsys):
  with pytest.raises(argparse.ArgumentTypeError):
    cli._parse_parallelism("read")  # noqa: SLF001
  assert (cli._parse_parallelism("read=2,parse=1") ==  # noqa: SLF001
          {"read": 2, "parse": 1})
  assert cli._parse_parallelism("") is None  # noqa: SLF001


@pytest.mark.parametrize("value", ["read", "read=x", "foo=2", "read=0",
                                   "read=2,"])
def test_bad_parallelism_flag_is_a_usage_error(value, capsys):
  err = _usage_error(["bench", "--files", "x.tsv", "--parallelism", value],
                     capsys)
  item = value.split(",")[-1] if value.endswith(",") else value.split(",")[0]
  assert ("argument --parallelism: expected stage=threads with a stage among "
          "read, batch, parse, features, heavy, prefetch and threads >= 1, "
          f"e.g. read=2,parse=1; got {item!r}") in err


@pytest.mark.parametrize("value,item", [("a,b", "a"), ("9", "9"),
                                        ("1,0", "0"), ("", "")])
def test_bad_levels_flag_is_a_usage_error(value, item, capsys):
  err = _usage_error(["bench", "--files", "x.tsv", "--levels", value], capsys)
  assert (f"argument --levels: {item!r} is not a level: pass comma-separated "
          "levels among 1,2,3,4,5, e.g. 1,3") in err


@pytest.mark.parametrize("command,flag", [("generate", "--rows-per-file"),
                                          ("convert", "--rows-per-file"),
                                          ("generate", "--rows")])
@pytest.mark.parametrize("value", ["0", "-5", "x"])
def test_row_counts_must_be_positive(command, flag, value, tmp_path, capsys):
  out = tmp_path / "out"
  args = (["generate", "--rows", "10"] if command == "generate"
          else ["convert", str(tmp_path / "in.tsv")])
  err = _usage_error([*args, "--out", str(out), flag, value], capsys)
  assert (f"argument {flag}: {value!r} is not a positive integer; pass 1 or "
          "more.") in err
  assert not out.exists()


def test_convert_into_a_non_empty_folder_exits_2(tmp_path, monkeypatch):
  errors = []
  monkeypatch.setattr(cli.logging, "error",
                      lambda fmt, *a: errors.append(fmt % a))
  src = synthetic.generate(30, tmp_path / "src")
  out = tmp_path / "tfr"
  out.mkdir()
  (out / "part-00007.tfrecord").write_bytes(b"stale")
  assert _run(["convert", *src, "--out", str(out), "--quiet"]) == 2
  assert errors == [f"output folder {out} is not empty: it holds "
                    "part-00007.tfrecord. Pass an empty or new folder: "
                    "converting into this one would mix its files with the "
                    "new parts."]
  assert sorted(p.name for p in out.iterdir()) == ["part-00007.tfrecord"]


def test_convert_to_parquet_without_tensorflow_io_exits_2(tmp_path, capsys):
  from intune_tf.criteo import convert  # noqa: PLC0415
  try:
    convert._tfio()  # noqa: SLF001
    pytest.skip("tensorflow-io loads here (compat stack): parquet works")
  except convert.ParquetUnavailableError:
    pass
  src = synthetic.generate(10, tmp_path / "src")
  assert _run(["convert", *src, "--out", str(tmp_path / "pq"), "--format",
               "parquet", "--quiet"]) == 2
  assert not (tmp_path / "pq").exists() or not any((tmp_path / "pq").iterdir())


def _bad_input(tmp_path, kind: str) -> str:
  path = tmp_path / "in.tsv"
  if kind == "random bytes":
    path.write_bytes(bytes(range(1, 256)) * 16)
  elif kind == "folder":
    path.mkdir()
  elif kind == "bad row":
    lines = open(synthetic.generate(100, tmp_path / "src")[0]).readlines()
    path.write_text("".join(lines[:50]) + "a\tb\n" + "".join(lines[50:]))
  return str(path)


@pytest.mark.parametrize("argv,kind,message", [
    (["count", "{path}"], "random bytes", "inputs: {path}: not Criteo data"),
    (["count", "{path}"], "missing", "inputs: {path}: no such file"),
    (["count", "{path}"], "bad row", "inputs: "),
    (["convert", "{path}", "--out", "{out}", "--quiet"], "random bytes",
     "inputs: {path}: not Criteo data"),
    (["convert", "{path}", "--out", "{out}", "--quiet"], "bad row",
     "inputs: "),
    (["fit", "--real", "{path}"], "random bytes", "--real: {path}: not text"),
    (["fit", "--real", "{path}"], "folder",
     "--real: cannot read {path}: Is a directory"),
    (["bench", "--files", "{path}", "--levels", "1"], "random bytes",
     "--files: {path}: not Criteo data"),
])
def test_a_bad_input_file_exits_2_naming_it(tmp_path, capsys, argv, kind,
                                            message):
  path, out = _bad_input(tmp_path, kind), str(tmp_path / "out")
  command = argv[0]
  argv = [a.format(path=path, out=out) for a in argv]
  assert _run(argv) == 2
  err = capsys.readouterr().err
  assert (f"intune criteo {command}: error: "
          + message.format(path=path)) in err, err
  if kind == "bad row":
    assert f"Criteo bad row: {path}:51: has 2 fields" in err
  assert err.endswith("Pass Criteo text files (dac layout, see `intune "
                      "criteo generate`).\n")
  assert "Traceback" not in err
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("out,why", [
    ("/proc/forbidden", "No such file or directory"),
    ("{tmp}/file/sub", "Not a directory"),
])
def test_generate_into_a_place_that_cannot_be_written_exits_2(
    tmp_path, capsys, out, why):
  # Used to print a traceback.
  (tmp_path / "file").write_text("x")
  out = out.format(tmp=tmp_path)
  assert _run(["generate", "--rows", "10", "--out", out, "--quiet"]) == 2
  captured = capsys.readouterr()
  assert captured.out == ""
  assert captured.err == (
      f"intune criteo generate: error: --out {out}: cannot write {out}: "
      f"{why}. Pass a directory you can create and write to.\n")
