"""`intune try FILE.py:FUNCTION`: InTune on the user's own pipeline.

    intune try my_input.py:make_dataset                 # 3 epochs, 3 repeats
    intune try my_input.py:make_dataset --step-ms 20 --take 500 \\
        --json out/try.json --plot out/try.png

`FUNCTION` takes no arguments and returns a `tf.data.Dataset`. Its pipeline
is read for `--epochs` epochs (a new iterator each, as `model.fit` makes
them) in three variants, each in a fresh process, interleaved (the order
rotates each repeat), `--repeats` times:

- `autotune`: the dataset as the function returns it;
- `intune-no-cache`: `intune_tf.tune(dataset, cache=False)`, the knobs only;
- `intune`: `intune_tf.tune(dataset)`, InTune at its defaults (the cache
  on).

`--step-ms` sleeps that long after each element, standing in for a model's
step; `--take K` reads K elements per epoch (needed for an infinite
dataset). The table gives the seconds per epoch and in all, each InTune
variant's speed-up over `autotune` (the median of the ratios paired within a
repeat, with their least and most), each variant's peak RSS, where the cache
went, what it held and what stopped it going deeper, and the knobs InTune
chose. `--json` writes the same figures; `--plot` draws the seconds per
epoch.

Each run first reads a two-element pipeline of its own under its variant,
untimed, so that the process's one-time costs (TensorFlow's first iterator,
InTune's kernel library and tuner) stay out of the epochs. The runs share a
warm-start folder made for the command, so that no earlier run of the
pipeline starts InTune ahead.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

from intune_tf import arguments
from intune_tf import records

AUTOTUNE = "autotune"
NO_CACHE = "intune-no-cache"
INTUNE = "intune"
VARIANTS = (AUTOTUNE, NO_CACHE, INTUNE)
DEFAULT_EPOCHS = 3
DEFAULT_REPEATS = 3
# A Python file larger than this is not a pipeline definition.
MAX_FILE_BYTES = 10 << 20
# Exit status for input the command cannot use.
BAD_INPUT = 2
# Seconds between two snapshots of the session's cache figures while an
# epoch runs (the last one stands in when the session ends with the epoch).
_SNAPSHOT_S = 0.5
_CHILD_TIMEOUT_S = 24 * 3600


class BadInput(Exception):
  """Input `intune try` cannot use; its message is the one line shown."""


def split_target(target: str) -> tuple[str, str]:
  """`FILE.py:FUNCTION` -> (file, function), both checked for form.

  split_target("a/p.py:make") = ("a/p.py", "make").

  Raises:
    BadInput: no `:`, no file or function part, or a function part that is
      not a Python name.
  """
  path, sep, name = target.rpartition(":")
  if not sep or not path or not name:
    raise BadInput(f"{target!r} is not FILE.py:FUNCTION; pass the file "
                   "and the function that returns your tf.data.Dataset, "
                   "e.g. my_input.py:make_dataset.")
  if not name.isidentifier():
    raise BadInput(f"{name!r} in {target!r} is not a Python function name.")
  return path, name


def check_file(path: str) -> None:
  """Raises BadInput unless `path` is a regular `.py` file of at most
  MAX_FILE_BYTES that this user can read."""
  if not os.path.lexists(path):
    raise BadInput(f"{path}: no such file; pass FILE.py:FUNCTION with the "
                   "path of your Python file.")
  if not os.path.isfile(path):
    raise BadInput(f"{path} is not a regular file; pass a Python file.")
  if not path.endswith(".py"):
    raise BadInput(f"{path} is not a .py file; pass a Python file.")
  size = os.path.getsize(path)
  if size > MAX_FILE_BYTES:
    raise BadInput(f"{path} holds {size:,} bytes, more than a pipeline "
                   f"definition ({MAX_FILE_BYTES:,}); pass a Python file.")
  if not os.access(path, os.R_OK):
    raise BadInput(f"{path} is not readable by this user.")


def load_function(target: str) -> Callable[[], Any]:
  """The function named by `FILE.py:FUNCTION`, its file run as a module
  (its folder first on `sys.path`, so its own imports resolve).

  Raises:
    BadInput: see `split_target` and `check_file`; the file raises when
      run, or has no callable of that name.
  """
  path, name = split_target(target)
  check_file(path)
  folder = os.path.dirname(os.path.abspath(path))
  if folder not in sys.path:
    sys.path.insert(0, folder)
  spec = importlib.util.spec_from_file_location("_intune_try_pipeline", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # the user's code: any error is bad input
    raise BadInput(f"{path} raised {type(e).__name__} when run: "
                   f"{_one_line(e)}") from e
  fn = getattr(module, name, None)
  if fn is None:
    defined = sorted(n for n, v in vars(module).items()
                     if callable(v) and not n.startswith("_")
                     and getattr(v, "__module__", None) == module.__name__)
    raise BadInput(f"{path} has no function {name!r} (it defines: "
                   f"{', '.join(defined) or 'none'}).")
  if not callable(fn):
    raise BadInput(f"{path}:{name} is a {type(fn).__name__}, not a "
                   "function.")
  return fn


def make_dataset(target: str, take: int | None):
  """The dataset `FUNCTION()` returns (limited to `take` elements), checked.

  Raises:
    BadInput: see `load_function`; the function raises, returns something
      other than a `tf.data.Dataset`, or a dataset that is empty, or
      infinite without `take`.
  """
  import tensorflow as tf  # noqa: PLC0415  only once the input is checked

  fn = load_function(target)
  try:
    ds = fn()
  except Exception as e:  # the user's code: any error is bad input
    raise BadInput(f"{target}() raised {type(e).__name__}: "
                   f"{_one_line(e)}") from e
  if not isinstance(ds, tf.data.Dataset):
    raise BadInput(f"{target}() returned a {type(ds).__name__}, not a "
                   "tf.data.Dataset; return the dataset you train on.")
  cardinality = int(ds.cardinality())
  if cardinality == tf.data.INFINITE_CARDINALITY and take is None:
    raise BadInput(f"{target}() returned an infinite dataset; pass --take K "
                   "to read K elements per epoch.")
  if cardinality == 0:
    raise BadInput(f"{target}() returned an empty dataset.")
  if take is not None:
    ds = ds.take(take)
  return ds


def _one_line(e: BaseException) -> str:
  text = " ".join(str(e).split())
  return text[:300] + ("..." if len(text) > 300 else "")


def _with_variant(ds, variant: str):
  import intune_tf  # noqa: PLC0415  loads TensorFlow: only in a child

  if variant == AUTOTUNE:
    return ds
  if variant == NO_CACHE:
    return intune_tf.tune(ds, cache=False)
  if variant == INTUNE:
    return intune_tf.tune(ds)
  raise ValueError(f"unknown variant {variant!r}; one of {VARIANTS}")


def read_epochs(ds, epochs: int, step_s: float,
                on_session: bool = False) -> dict[str, Any]:
  """Reads `epochs` epochs of `ds`, a new iterator each, sleeping `step_s`
  after each element.

  Args:
    ds: the dataset, its variant applied.
    epochs: epochs to read (>= 1).
    step_s: seconds of a stand-in model step after each element (>= 0).
    on_session: whether `ds` has InTune on; then each epoch's cache figures
      and the knobs in force at its end are kept.

  Returns:
    `epoch_s` (seconds per epoch), `elements` (per epoch), and with
    `on_session`, `cache` (per epoch: `TuningSession.cache()` at its end) and
    `knobs` ({name: last value seen at an epoch's end}).
  """
  import intune_tf  # noqa: PLC0415  loads TensorFlow: only in a child

  out: dict[str, Any] = {"epoch_s": [], "elements": [], "cache": [],
                         "knobs": {}}
  for _ in range(epochs):
    start = time.perf_counter()
    it = iter(ds)
    session = intune_tf.session_of(it) if on_session else None
    snapshot, knobs, last = {}, {}, start
    count = 0
    for _ in it:
      count += 1
      if step_s:
        time.sleep(step_s)
      # At the first element, and every _SNAPSHOT_S: the knobs below a
      # cache leave the session once it serves the epoch.
      if session is not None and (
          count == 1 or time.perf_counter() - last > _SNAPSHOT_S):
        last = time.perf_counter()
        snapshot, now = _session_figures(session, snapshot, {})
        knobs.update(now)
    out["epoch_s"].append(time.perf_counter() - start)
    out["elements"].append(count)
    if session is not None:
      snapshot, now = _session_figures(session, snapshot, {})
      knobs.update(now)
      out["cache"].append(snapshot)
      out["knobs"].update(knobs)
    del it
  return out


def _session_figures(session, cache, knobs):
  """(cache figures, {knob: value}) of `session` now; the given ones when
  the session has ended."""
  import intune_tf  # noqa: PLC0415  loads TensorFlow: only in a child

  try:
    return session.cache(), {k.name: k.value for k in session.knobs()}
  except intune_tf.SessionGoneError:
    return cache, knobs


def warm_up(variant: str) -> None:
  """Pays the process's one-time costs outside the timed epochs: reads a
  two-element pipeline of its own under `variant` (TensorFlow's first
  iterator; with InTune, its kernel library and its tuner)."""
  import tensorflow as tf  # noqa: PLC0415  loads TensorFlow: only in a child

  ds = tf.data.Dataset.range(2).map(
      lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
          tf.data.AUTOTUNE)
  for _ in _with_variant(ds, variant):
    pass


def _child(args) -> int:
  """`--child VARIANT`: one run, its figures as one JSON line on stdout."""
  try:
    ds = _with_variant(make_dataset(args.target, args.take), args.child)
  except BadInput as e:
    print(f"intune try: {e}", file=sys.stderr)
    return BAD_INPUT
  warm_up(args.child)
  figures = read_epochs(ds, args.epochs, args.step_ms / 1000,
                        on_session=args.child != AUTOTUNE)
  figures["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  figures["peak_rss"] *= 1024  # Linux: KiB
  print(json.dumps(figures), flush=True)
  return 0


def _child_command(args, variant: str) -> list[str]:
  command = [sys.executable, "-m", "intune_tf", "try", args.target,
             "--child", variant, "--epochs", str(args.epochs),
             "--step-ms", repr(args.step_ms)]
  if args.take is not None:
    command += ["--take", str(args.take)]
  return command


def _run_child(args, variant: str, env: Mapping[str, str]) -> dict:
  """One variant's run in a fresh process; raises RuntimeError with the end
  of its stderr when it fails."""
  proc = subprocess.run(_child_command(args, variant), capture_output=True,
                        text=True, env=env, timeout=_CHILD_TIMEOUT_S,
                        check=False)
  lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
  if proc.returncode != 0 or not lines:
    tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
    raise RuntimeError(f"the {variant} run failed (exit "
                       f"{proc.returncode}):\n{tail}")
  return json.loads(lines[-1])


class _Progress:
  """A one-line progress bar on stderr (a line per run when it is not a
  terminal)."""

  def __init__(self, total: int):
    self.total, self.done = total, 0
    self.tty = sys.stderr.isatty()
    self.start = time.monotonic()

  def show(self, what: str) -> None:
    width = 30
    filled = width * self.done // self.total
    bar = "#" * filled + "." * (width - filled)
    text = (f"[{bar}] {self.done}/{self.total} runs, "
            f"{time.monotonic() - self.start:.0f} s: {what}")
    if self.tty:
      print(f"\r{text:<100}", end="", file=sys.stderr, flush=True)
    else:
      print(text, file=sys.stderr, flush=True)

  def close(self) -> None:
    if self.tty:
      print(file=sys.stderr, flush=True)


def run(args) -> dict[str, Any]:
  """Every variant's runs, interleaved: the report's figures (`report`)."""
  runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
  env = dict(os.environ)
  with tempfile.TemporaryDirectory(prefix="intune-try-ws-") as warm:
    env["INTUNE_WARMSTART_DIR"] = warm
    progress = _Progress(args.repeats * len(VARIANTS))
    try:
      for repeat in range(args.repeats):
        order = list(VARIANTS[repeat % 3:] + VARIANTS[:repeat % 3])
        for variant in order:
          progress.show(f"{variant}, repeat {repeat + 1}")
          runs[variant].append(_run_child(args, variant, env))
          progress.done += 1
      progress.show("done")
    finally:
      progress.close()
  return report(runs, args)


def paired(base: Sequence[float], other: Sequence[float]
           ) -> tuple[float, float, float]:
  """(median, least, most) of base[i] / other[i]: the speed-up of `other`.

  paired([4, 6], [2, 2]) = (2.5, 2.0, 3.0): ratios 2 and 3.
  """
  ratios = [b / o for b, o in zip(base, other)]
  return statistics.median(ratios), min(ratios), max(ratios)


def report(runs: Mapping[str, list[dict]], args) -> dict[str, Any]:
  """The figures `--json` writes, from each variant's runs."""
  totals = {v: [sum(r["epoch_s"]) for r in rs] for v, rs in runs.items()}
  variants = {v: {"epoch_s": [r["epoch_s"] for r in rs],
                  "total_s": totals[v],
                  "elements": rs[0]["elements"],
                  "peak_rss": max(r["peak_rss"] for r in rs)}
              for v, rs in runs.items()}
  speedup, spread = {}, {}
  for v in (INTUNE, NO_CACHE):
    med, lo, hi = paired(totals[AUTOTUNE], totals[v])
    speedup[v], spread[v] = med, [lo, hi]
    variants[v]["knobs"] = runs[v][-1]["knobs"]
  # The cache of the run whose whole time is the median's (the last of the
  # two middle ones).
  order = sorted(range(len(runs[INTUNE])), key=lambda i: totals[INTUNE][i])
  middle = runs[INTUNE][order[len(order) // 2]]
  last = middle["cache"][-1] if middle["cache"] else {}
  cache = {"state": str(last.get("state", records.CacheState.OFF)),
           "point": last.get("point", ""), "reason": last.get("reason", ""),
           "bytes": max((c.get("bytes", 0) for c in middle["cache"]),
                        default=0),
           "complete": last.get("complete", False),
           "served": [c.get("served", 0.0) for c in middle["cache"]],
           "saved_s": [c.get("saved_s", 0.0) for c in middle["cache"]]}
  return {"target": args.target, "epochs": args.epochs,
          "repeats": args.repeats, "step_ms": args.step_ms,
          "take": args.take, "variants": variants, "speedup": speedup,
          "spread": spread, "cache": cache}


def table(result: Mapping[str, Any]) -> str:
  """The report as text: a Markdown table, then the cache and the knobs."""
  epochs = result["epochs"]
  heads = " | ".join(f"epoch {e + 1} s" for e in range(epochs))
  lines = [f"| variant | {heads} | total s | vs autotune (min-max) | "
           "peak RSS MB |",
           "|---|" + "---|" * epochs + "---|---|---|"]
  for name, v in result["variants"].items():
    per_epoch = " | ".join(
        f"{statistics.median(r[e] for r in v['epoch_s']):.2f}"
        for e in range(epochs))
    if name == AUTOTUNE:
      ratio = "1.00x"
    else:
      lo, hi = result["spread"][name]
      ratio = f"{result['speedup'][name]:.2f}x ({lo:.2f}-{hi:.2f})"
    lines.append(f"| {name} | {per_epoch} | "
                 f"{statistics.median(v['total_s']):.2f} | {ratio} | "
                 f"{v['peak_rss'] / 1e6:.0f} |")
  c = result["cache"]
  lines.append("")
  placed = c.get("state") == records.CacheState.PLACED
  if placed:
    served = ", ".join(f"{s:.0%}" for s in c["served"])
    held = "a whole epoch" if c["complete"] else "part of an epoch"
    lines.append(f"cache: after {c['point']}, held {_size(c['bytes'])}"
                 f" ({held}); elements served from it per epoch: {served}")
  else:
    lines.append("cache: none")
  if c["reason"]:
    why = "why there and not deeper" if placed else "why none"
    lines.append(f"  {why}: {c['reason']}")
  knobs = result["variants"][INTUNE].get("knobs", {})
  lines.append("knobs InTune chose (last value seen): " + (", ".join(
      f"{k}={v:g}" for k, v in sorted(knobs.items())) or "none"))
  return "\n".join(lines)


def _size(n: float) -> str:
  """Bytes as text: _size(1536) = '1.5 kB', _size(2.5e6) = '2.5 MB'."""
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if n >= scale:
      return f"{n / scale:.1f} {unit}"
  return f"{n:.0f} B"


def plot(result: Mapping[str, Any], path: str) -> str:
  """Bars of the median seconds of each epoch, per variant, to `path`."""
  import matplotlib  # noqa: PLC0415  the [bench] extra, only for --plot

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415  after the backend is set

  epochs = result["epochs"]
  fig, ax = plt.subplots(figsize=(7, 3.5))
  width = 0.8 / len(result["variants"])
  for i, (name, v) in enumerate(result["variants"].items()):
    medians = [statistics.median(r[e] for r in v["epoch_s"])
               for e in range(epochs)]
    ax.bar([e + i * width for e in range(epochs)], medians, width,
           label=name)
  ax.set_xticks([e + width for e in range(epochs)],
                [f"epoch {e + 1}" for e in range(epochs)])
  ax.set_ylabel("seconds (median of repeats)")
  ax.set_title(result["target"])
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def _plot_problem() -> str | None:
  try:
    import matplotlib  # noqa: F401, PLC0415  only checks that it is there
  except ModuleNotFoundError:
    return ("--plot needs matplotlib: pip install 'intune_tf[bench]', or "
            "leave --plot out.")
  return None


def main(args) -> int:
  """`intune try`: checks the input, runs, prints and writes the report."""
  if args.child:
    return _child(args)
  problem = args.plot and _plot_problem()
  if problem:
    print(f"intune try: {problem}", file=sys.stderr)
    return BAD_INPUT
  try:
    make_dataset(args.target, args.take)
  except BadInput as e:
    print(f"intune try: {e}", file=sys.stderr)
    return BAD_INPUT
  print(f"intune try {args.target}: {args.epochs} epochs, {args.repeats} "
        f"interleaved repeats of {', '.join(VARIANTS)}, each in a fresh "
        "process" + (f"; a {args.step_ms:g} ms step per element"
                     if args.step_ms else "")
        + (f"; {args.take} elements per epoch" if args.take else ""),
        flush=True)
  try:
    result = run(args)
  except RuntimeError as e:
    print(f"intune try: {e}", file=sys.stderr)
    return 1
  print()
  print(table(result))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=1)
    print(f"figures: {args.json}")
  if args.plot:
    print(f"plot: {plot(result, args.plot)}")
  return 0


def milliseconds(text: str) -> float:
  """An argparse type: finite milliseconds of 0 or more."""
  try:
    return arguments.optional_duration(text)
  except argparse.ArgumentTypeError:
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a step time; pass finite milliseconds, 0 or "
        "more.") from None


def add_parser(subparsers, helps: Mapping[str, str]) -> None:
  p = subparsers.add_parser("try", help=helps["try"],
                            description=__doc__.splitlines()[0])
  p.add_argument("target", metavar="FILE.py:FUNCTION",
                 help="A Python file and the function in it that takes no "
                 "arguments and returns your tf.data.Dataset.")
  p.add_argument("--epochs", type=arguments.positive_int,
                 default=DEFAULT_EPOCHS,
                 help=f"Epochs per run (default {DEFAULT_EPOCHS}).")
  p.add_argument("--repeats", type=arguments.positive_int,
                 default=DEFAULT_REPEATS,
                 help="Runs of each variant, interleaved (default "
                 f"{DEFAULT_REPEATS}).")
  p.add_argument("--step-ms", type=milliseconds, default=0.0,
                 help="Milliseconds slept after each element, standing in "
                 "for a model step (default 0).")
  p.add_argument("--take", type=arguments.positive_int, default=None,
                 help="Elements read per epoch (default: the whole "
                 "dataset; needed when it is infinite).")
  p.add_argument("--json", type=arguments.output_file, default=None,
                 help="Write the figures to this JSON file.")
  p.add_argument("--plot", type=arguments.output_file, default=None,
                 help="Draw the seconds per epoch to this PNG (needs "
                 "matplotlib, the [bench] extra).")
  p.add_argument("--child", choices=VARIANTS, default=None,
                 help=argparse.SUPPRESS)
  p.set_defaults(func=main)
