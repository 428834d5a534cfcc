"""`intune criteo ...`: generate, fit, compare, convert, count, bench.

    intune criteo generate --rows 1000000 --out /tmp/criteo --seed 0
    intune criteo fit --real ../shared/data/criteo/criteo_sample_10k.tsv \\
        --out criteo/data/criteo_stats.json
    intune criteo compare --real ../shared/data/criteo/criteo_sample_10k.tsv \\
        --out compare.png
    intune criteo convert --out /tmp/tfr --format tfrecord day_0.gz
    intune criteo count --on-bad-row skip day_*.gz
    intune criteo bench --rows 200000 --levels 1,2,3,4,5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable

from absl import logging

from intune_tf import arguments


def _parse_levels(text: str) -> list[int]:
  """An argparse type: `"1,3"` -> [1, 3], each a level of `pipelines`."""
  # Deferred: loads TensorFlow, only when `bench` is parsed.
  from intune_tf.criteo import pipelines  # noqa: PLC0415
  levels = []
  for item in text.split(","):
    try:
      level = int(item)
    except ValueError:
      level = None
    if level not in pipelines.LEVELS:
      raise argparse.ArgumentTypeError(
          f"{item.strip()!r} is not a level: pass comma-separated levels "
          f"among {','.join(map(str, pipelines.LEVELS))}, e.g. 1,3")
    levels.append(level)
  return levels


def _parse_parallelism(text: str | None) -> dict[str, int] | None:
  """An argparse type: `"read=2,parse=1"` -> {"read": 2, "parse": 1}."""
  if not text:
    return None
  # Deferred: loads TensorFlow, only when `bench` is parsed.
  from intune_tf.criteo import pipelines  # noqa: PLC0415
  out = {}
  for item in text.split(","):
    name, _, value = item.partition("=")
    name = name.strip()
    try:
      threads = int(value)
    except ValueError:
      threads = 0
    if name not in pipelines.TUNABLE_STAGES or threads < 1:
      raise argparse.ArgumentTypeError(
          f"expected stage=threads with a stage among "
          f"{', '.join(pipelines.TUNABLE_STAGES)} and threads >= 1, e.g. "
          f"read=2,parse=1; got {item!r}")
    out[name] = threads
  return out


def _input_errors(command: str, what: str, dest: str,
                  run: Callable[[argparse.Namespace], int]
                  ) -> Callable[[argparse.Namespace], int]:
  """`run`, reporting an unreadable or non-Criteo input as a usage error.

  Args:
    command: The command's name, for the message.
    what: The argument naming the input files, for the message.
    dest: Its attribute in the parsed arguments.
    run: The command.

  Returns:
    `run` that, when an input is missing, unreadable or not Criteo data,
    writes what is wrong with which file to stderr and returns 2.
  """
  def guarded(args: argparse.Namespace) -> int:
    try:
      return run(args)
    except Exception as e:  # re-raised below
      # Deferred: loaded by the command already.
      import tensorflow as tf  # noqa: PLC0415

      # Deferred: loaded by the command already.
      from intune_tf.criteo import reader  # noqa: PLC0415
      if not isinstance(e, (OSError, UnicodeDecodeError,
                            reader.CriteoFormatError,
                            tf.errors.InvalidArgumentError)):
        raise
      if isinstance(e, OSError) and e.strerror:
        message = f"cannot read {e.filename}: {e.strerror}"
      elif isinstance(e, UnicodeDecodeError):
        files = getattr(args, dest)
        files = files if isinstance(files, str) else " or ".join(files or [])
        message = f"{files}: not text ({e})"
      else:
        message = (getattr(e, "message", None) or str(e)).rstrip(".")
      sys.stderr.write(f"intune criteo {command}: error: {what}: {message}. "
                       "Pass Criteo text files (dac layout, see `intune "
                       "criteo generate`).\n")
      return 2
  return guarded


def _output_error(command: str, flag: str, path: str,
                  error: OSError) -> int:
  """Writes why `path` (the value of `flag`) cannot be written to stderr;
  returns the exit code of a usage error, 2."""
  where = error.filename if error.filename else path
  sys.stderr.write(
      f"intune criteo {command}: error: {flag} {path}: cannot write "
      f"{where}: {error.strerror or error}. Pass a directory you can "
      "create and write to.\n")
  return 2


def _generate(args: argparse.Namespace) -> int:
  try:  # before anything is generated
    os.makedirs(args.out, exist_ok=True)
    if not os.access(args.out, os.W_OK | os.X_OK):
      raise PermissionError(13, "Permission denied", args.out)
  except OSError as e:
    return _output_error("generate", "--out", args.out, e)
  try:
    return _generate_into(args)
  except OSError as e:
    if args.stats and e.filename == args.stats:
      sys.stderr.write(f"intune criteo generate: error: --stats "
                       f"{args.stats}: cannot read it: {e.strerror or e}.\n")
      return 2
    return _output_error("generate", "--out", args.out, e)  # a full disk


def _generate_into(args: argparse.Namespace) -> int:
  # Deferred: optional, from the [bench] extra.
  import tqdm  # noqa: PLC0415

  # Deferred: a subcommand loads its module (and TensorFlow) only when it runs.
  from intune_tf.criteo import synthetic  # noqa: PLC0415
  start = time.perf_counter()
  with tqdm.tqdm(total=args.rows, unit="row", unit_scale=True,
                 disable=args.quiet) as bar:
    paths = synthetic.generate(args.rows, args.out, seed=args.seed,
                               rows_per_file=args.rows_per_file,
                               stats=args.stats, compress=args.gzip,
                               progress=bar.update)
  seconds = time.perf_counter() - start
  size = sum(os.path.getsize(p) for p in paths)
  logging.info("wrote %d rows in %d file(s), %.1f MB in %.1f s: %.1f MB/s, "
               "%.0f rows/s", args.rows, len(paths), size / 1e6, seconds,
               size / 1e6 / max(seconds, 1e-9), args.rows / max(seconds, 1e-9))
  for p in paths:
    print(p)
  return 0


def _fit(args: argparse.Namespace) -> int:
  # Deferred: a subcommand loads its module (and TensorFlow) only when it runs.
  from intune_tf.criteo import synthetic  # noqa: PLC0415
  stats = synthetic.fit_stats(args.real)
  text = json.dumps(stats, indent=1) + "\n"
  if args.out == "-":
    sys.stdout.write(text)
  else:
    with open(args.out, "w") as f:
      f.write(text)
    logging.info("wrote %s (fitted on %d rows of %s)", args.out, stats["rows"],
                 args.real)
  return 0


def _compare(args: argparse.Namespace) -> int:
  # Deferred: a subcommand loads its module (and TensorFlow) only when it runs.
  from intune_tf.criteo import plots  # noqa: PLC0415
  summary = plots.compare(args.real, args.out, args.synthetic, seed=args.seed)
  logging.info("wrote %s: %s", args.out, summary)
  print(json.dumps(summary))
  return 0


def _convert(args: argparse.Namespace) -> int:
  # Deferred: optional, from the [bench] extra.
  import tqdm  # noqa: PLC0415

  # Deferred: a subcommand loads its module (and TensorFlow) only when it runs.
  from intune_tf.criteo import convert  # noqa: PLC0415
  try:
    with tqdm.tqdm(unit="row", unit_scale=True, disable=args.quiet) as bar:
      paths = convert.convert_files(args.inputs, args.out, args.format,
                              rows_per_file=args.rows_per_file,
                              compress=args.compress,
                              on_bad_row=args.on_bad_row, progress=bar.update)
  except (convert.ParquetUnavailableError, convert.OutputDirError) as e:
    logging.error("%s", e)
    return 2
  for p in paths:
    print(p)
  return 0


def _count(args: argparse.Namespace) -> int:
  # Deferred: a subcommand loads its module (and TensorFlow) only when it runs.
  from intune_tf.criteo import reader  # noqa: PLC0415
  ds = reader.read(args.inputs, batch_size=65536, on_bad_row=args.on_bad_row)
  rows = sum(int(label.shape[0]) for _, label in ds)
  print(f"rows: {rows}")
  print(f"bad_rows_skipped: {int(ds.bad_rows.numpy())}")
  return 0


def _fixed(parallelism: dict[str, int]) -> str:
  return "fixed " + ",".join(f"{k}={v}" for k, v in parallelism.items())


def _bench(args: argparse.Namespace) -> int:
  # Deferred: a subcommand loads its module (and TensorFlow) only when it runs.
  from intune_tf.criteo import bench  # noqa: PLC0415

  # Deferred: a subcommand loads its module (and TensorFlow) only when it runs.
  from intune_tf.criteo import files  # noqa: PLC0415
  paths = args.files or files.default_files(rows=args.rows,
                                            cache_dir=args.cache_dir)
  parallelism = args.parallelism
  results = []
  for level in args.levels:
    logging.info("benchmarking L%d", level)
    results.append(bench.measure(level, paths, batch_size=args.batch_size,
                                 warmup_batches=args.warmup_batches,
                                 window_batches=args.window_batches,
                                 windows=args.windows,
                                 parallelism=parallelism))
  print(f"Criteo pipelines, batch {args.batch_size}, "
        f"{_fixed(parallelism) if parallelism else 'AUTOTUNE'}, "
        f"{os.cpu_count()} CPU(s), {len(paths)} file(s); median of "
        f"{args.windows} windows of {args.window_batches} batches after "
        f"{args.warmup_batches} warm-up batches\n")
  print(bench.markdown_table(results, args.batch_size))
  return 0


def add_commands(subparsers) -> None:
  """Adds the `criteo` commands to an argparse subparsers object."""
  p = subparsers.add_parser(
      "generate", help="Write synthetic Criteo TSV files (dac layout).")
  p.add_argument("--rows", type=arguments.positive_int, required=True,
                 help="Rows in total.")
  p.add_argument("--out", required=True, help="Output directory.")
  p.add_argument("--seed", type=arguments.non_negative_int, default=0,
                 help="Seed, 0 or more (default 0).")
  p.add_argument("--rows-per-file", type=arguments.positive_int,
                 default=1_000_000,
                 help="Rows per file (default 1,000,000).")
  p.add_argument("--stats", default=None,
                 help="Parameters JSON (default: the packaged one).")
  p.add_argument("--gzip", action="store_true", help="Write .tsv.gz files.")
  p.add_argument("--quiet", action="store_true", help="No progress bar.")
  p.set_defaults(func=_generate)

  p = subparsers.add_parser(
      "fit", help="Fit generator parameters to a real labelled TSV file.")
  p.add_argument("--real", required=True, help="Real dac-layout file.")
  p.add_argument("--out", default="-", help="JSON to write (default stdout).")
  p.set_defaults(func=_input_errors("fit", "--real", "real", _fit))

  p = subparsers.add_parser(
      "compare", help="PNG comparing real and synthetic distributions.")
  p.add_argument("--real", required=True, help="Real dac-layout file.")
  p.add_argument("--out", type=arguments.output_file, required=True,
                 help="PNG to write.")
  p.add_argument("--synthetic", default=None,
                 help="Synthetic file (default: generate as many rows).")
  p.add_argument("--seed", type=arguments.non_negative_int, default=0,
                 help="Seed, 0 or more (default 0).")
  p.set_defaults(func=_input_errors("compare", "--real", "real", _compare))

  p = subparsers.add_parser(
      "convert", help="Convert Criteo text files to TFRecord or Parquet.")
  p.add_argument("inputs", nargs="+", help="Input files or glob patterns.")
  p.add_argument("--out", required=True,
                 help="Output directory, new or empty.")
  p.add_argument("--format", choices=("tfrecord", "parquet"),
                 default="tfrecord", help="Default tfrecord; parquet needs "
                 "tensorflow-io (compat stack).")
  p.add_argument("--rows-per-file", type=arguments.positive_int,
                 default=1_000_000,
                 help="Rows per output file (default 1,000,000).")
  p.add_argument("--compress", action="store_true",
                 help="GZIP TFRecords / snappy Parquet.")
  p.add_argument("--on-bad-row", choices=("error", "skip"), default="error")
  p.add_argument("--quiet", action="store_true", help="No progress bar.")
  p.set_defaults(func=_input_errors("convert", "inputs", "inputs", _convert))

  p = subparsers.add_parser(
      "count", help="Count the rows (and skipped bad rows) of Criteo files.")
  p.add_argument("inputs", nargs="+", help="Input files or glob patterns.")
  p.add_argument("--on-bad-row", choices=("error", "skip"), default="error")
  p.set_defaults(func=_input_errors("count", "inputs", "inputs", _count))

  p = subparsers.add_parser(
      "bench", help="Markdown table of L1-L5 pipeline throughput.")
  p.add_argument("--files", nargs="*", default=None,
                 help="Criteo files (default: the cached synthetic set).")
  p.add_argument("--rows", type=arguments.positive_int, default=200_000,
                 help="Rows of the synthetic set (default 200,000).")
  p.add_argument("--cache-dir", default=None,
                 help="Where the synthetic set is kept.")
  p.add_argument("--levels", type=_parse_levels, default="1,2,3,4,5",
                 help="Comma-separated levels (default 1,2,3,4,5).")
  p.add_argument("--batch-size", type=arguments.positive_int, default=4096)
  p.add_argument("--warmup-batches", type=arguments.non_negative_int,
                 default=10, help="Batches before measuring, 0 for none "
                 "(default 10).")
  p.add_argument("--window-batches", type=arguments.positive_int, default=10)
  p.add_argument("--windows", type=arguments.positive_int, default=5)
  p.add_argument("--parallelism", type=_parse_parallelism, default=None,
                 help="Fixed stage parallelism, e.g. read=2,parse=1 "
                 "(default: AUTOTUNE).")
  p.set_defaults(func=_input_errors("bench", "--files", "files", _bench))
