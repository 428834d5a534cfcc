"""Calibrating the simulator against traces the harness records.

`intune bench --trace T` writes, during its oracle search, the observation
stream under every configuration it tries and one `measurement` line per
configuration (rows/s). Calibration turns the observations of one reference
configuration into a `SimPipeline` (each stage's CPU-seconds per output
element, read from tf.data's own model), fits the machine constants
(`SimParams`) by a grid search, and reports, for every configuration, the
simulator's predicted rows/s beside the measured one.

Mapping the real pipeline onto the simulator's chain of stages: a stage with
a parallelism knob is a tunable stage; a stage without knobs runs in the
threads of the nearest knob stage that consumes it (`StageName.encloses`:
the deepest knob stage on its path from the output; for traces recorded
before stage names were paths, the one with the largest model id below its
own), so its cost is added there; a buffer knob is the buffer after its
stage; what no knob stage consumes is one fixed single-threaded stage.

`intune calibrate --trace T [--json OUT]` prints the table.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gzip
import itertools
import json
import sys
from typing import Iterable, Mapping, Sequence

import numpy as np

from intune_tf import arguments
from intune_tf import records
from intune_tf.sim import simulator as sim_lib

# The simulator stage that stands for the stages no knob stage consumes.
FIXED_STAGE = "fixed"
# Predictions within this relative distance of the best tie for first.
TIE = 1e-9


def _parse(name: str) -> records.StageName | None:
  try:
    return records.parse_stage(name)
  except ValueError:
    return None


@dataclasses.dataclass
class Point:
  """One configuration of a traced oracle search."""
  scenario: str
  config: dict[str, float]
  cpus: int
  rows_per_s: float
  rows_per_element: float
  observations: list[dict]
  # Every measurement of the configuration (rows/s), when merged from
  # repeats (`merge_repeats`); rows_per_s is their median.
  measurements: tuple[float, ...] = ()

  @functools.cached_property
  def costs(self) -> dict[str, float]:
    """Each stage's median CPU-seconds per output element (`_costs`)."""
    return _costs(self.observations)


def _read_record(path: str, number: int, line: str,
                 pending: dict[tuple, list[dict]],
                 points: dict[str, list[Point]]) -> None:
  """Adds line `number` of a trace to `pending` observations or `points`."""
  line = line.strip()
  if not line:
    return
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}:{number}: not a JSON line ({e}).") from e
  if not isinstance(record, dict):
    raise ValueError(f"{path}:{number}: not a JSON object.")
  try:
    config = record.get("config")
    if record.get("policy") == "oracle-search" and "observation" in record:
      key = (record["scenario"], json.dumps(config, sort_keys=True))
      pending[key].append(record["observation"])
    elif record.get("kind") == "measurement":
      key = (record["scenario"], json.dumps(config, sort_keys=True))
      points[record["scenario"]].append(Point(
          scenario=record["scenario"], config=dict(config),
          cpus=int(record["cpus"]), rows_per_s=float(record["rows_per_s"]),
          rows_per_element=float(record["rows_per_element"]),
          observations=pending.pop(key, [])))
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{path}:{number}: not an `intune bench --trace` record "
                     f"({type(e).__name__}: {e}).") from e


def load_trace(path: str) -> dict[str, list[Point]]:
  """Reads a trace; per scenario, the measured configurations in order.

  Raises:
    ValueError: the file holds no oracle-search measurements (names the
      command that records them), is not text, or a line is not JSON or
      not a trace record (names the line).
    OSError: the file cannot be read.
  """
  pending: dict[tuple, list[dict]] = collections.defaultdict(list)
  points: dict[str, list[Point]] = collections.defaultdict(list)
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    try:
      for number, line in enumerate(f, 1):
        _read_record(path, number, line, pending, points)
    except UnicodeDecodeError as e:
      raise ValueError(f"{path}: not text, so not an `intune bench --trace` "
                       f"trace ({e}).") from e
  if not points:
    raise ValueError(
        f"{path} holds no oracle-search measurements. Record a trace with "
        "`intune bench --scenarios criteo-l4-b4096 --policies oracle "
        "--repeats 1 --trace PATH`.")
  return {s: merge_repeats(p) for s, p in points.items()}


def merge_repeats(points: Sequence[Point]) -> list[Point]:
  """One point per (configuration, CPUs), in the order first measured: the
  median rows/s of its measurements (`intune bench --oracle-repeats`) and
  all their observations (each measurement's first one left out: it
  straddles two configurations).

  Example: rows/s 90, 110 and 100 of one configuration -> one point of 100.
  """
  groups: dict[tuple, list[Point]] = {}
  for p in points:
    groups.setdefault((p.cpus, json.dumps(p.config, sort_keys=True)),
                      []).append(p)
  return [dataclasses.replace(
      same[0], rows_per_s=float(np.median([p.rows_per_s for p in same])),
      measurements=tuple(p.rows_per_s for p in same),
      observations=[o for p in same for o in (p.observations[1:] or
                                               p.observations)])
          if len(same) > 1 else same[0] for same in groups.values()]


def spread(points: Sequence[Point]) -> dict[str, float]:
  """How far apart a scenario's configurations measure, against how far
  apart repeats of one configuration do.

  Returns:
    `span`: the fastest configuration's rows/s over the slowest's;
    `noise`: the median over repeated configurations of the relative
    standard deviation of their measurements (NaN without repeats).

  Example: configurations at 100 (measured 90, 100, 110) and 200 (measured
  200, 200): span 2.0; noise median(0.0816, 0.0) = 0.0408, where
  std(90, 100, 110) / 100 = 8.165 / 100.
  """
  rates = [p.rows_per_s for p in points if p.rows_per_s > 0]
  noise = [float(np.std(p.measurements) / np.mean(p.measurements))
           for p in points if len(p.measurements) > 1 and
           np.mean(p.measurements) > 0]
  return {"span": max(rates) / min(rates) if rates else float("nan"),
          "noise": float(np.median(noise)) if noise else float("nan")}


def _costs(observations: Sequence[dict]) -> dict[str, float]:
  """Median CPU-seconds per output element of each stage (first
  observation after a change skipped: it straddles two configurations)."""
  usable = observations[1:] or observations
  per_stage = collections.defaultdict(list)
  for obs in usable:
    out = obs["output_rate"]
    if out <= 0:
      continue
    for st in obs["stages"]:
      per_stage[st["name"]].append(records.stage_cost(
          st["cpu_per_element_s"], st["rate"], out))
  return {name: float(np.median(v)) for name, v in per_stage.items()}


def build_pipeline(point: Point, params: sim_lib.SimParams,
                   cost_scale: float = 1.0
                   ) -> tuple[sim_lib.SimPipeline, dict[str, int]]:
  """A `SimPipeline` from the observations of one configuration, with base
  costs (contention of that configuration divided out, times `cost_scale`),
  and the map from knob name to stage index."""
  if not point.observations:
    raise ValueError(f"{point.scenario}: no observations under {point.config}.")
  knobs = point.observations[-1]["knobs"]
  knob_stages = sorted({records.split_knob(k["name"])[0] for k in knobs},
                       key=records.input_first)
  parallel = {records.split_knob(k["name"])[0] for k in knobs
              if k["kind"] == "parallelism"}
  buffered = {records.split_knob(k["name"])[0] for k in knobs
              if k["kind"] == "buffer_size"}
  costs = point.costs
  per_stage = collections.defaultdict(float)
  fixed = 0.0
  # Parallel knob stages from the output to the input: the last one that
  # encloses a stage is the nearest.
  owners = [(s, _parse(s)) for s in reversed(knob_stages) if s in parallel]
  for name, cost in costs.items():
    if name in knob_stages:
      per_stage[name] += cost
      continue
    stage = _parse(name)
    owner = [s for s, parsed in owners
             if stage is not None and parsed is not None and
             parsed.encloses(stage)]
    if owner:
      per_stage[owner[-1]] += cost
    else:
      fixed += cost
  stages, index = [], {}
  config = point.config
  threads = [config.get(f"{s}/parallelism", 1.0) for s in knob_stages]
  threads += [1.0] if fixed > 0 else []
  contention = sim_lib.effective_costs([1.0] * len(threads), threads,
                                       point.cpus, params)[0]
  for s in knob_stages:
    index[s] = len(stages)
    stages.append(sim_lib.SimStage(
        name=s, cost_s=max(per_stage[s], 1e-9) * cost_scale / contention,
        tunable=s in parallel, buffer=s in buffered))
  if fixed > 0:
    stages.append(sim_lib.SimStage(name=FIXED_STAGE,
                                   cost_s=fixed * cost_scale / contention,
                                   tunable=False))
  pipeline = sim_lib.SimPipeline(tuple(stages), point.cpus, memory_limit=1e15,
                                 ram_budget=1e15, noise=0.0)
  return pipeline, index


def predict(pipeline: sim_lib.SimPipeline, index: dict[str, int],
            config: dict[str, float], cpus: int,
            params: sim_lib.SimParams) -> float:
  """Predicted output elements/s of `config` on `pipeline`."""
  par = [1.0] * len(pipeline.stages)
  buf = [0.0] * len(pipeline.stages)
  for name, value in config.items():
    stage, kind = records.split_knob(name)
    if stage not in index:
      continue
    if kind == "parallelism":
      par[index[stage]] = max(1.0, value)
    else:
      buf[index[stage]] = max(0.0, value)
  return sim_lib.throughput(pipeline.stages, par, buf, cpus, 0.0, params)


def _base_pipelines(points_by_scenario, params):
  """Per scenario, the pipeline of each configuration's observations; the
  scenario's pipeline takes each stage's median base cost over them."""
  result = {}
  for scenario, points in points_by_scenario.items():
    built = [build_pipeline(p, params) for p in points if p.observations]
    pipeline, index = built[0]
    stages = []
    for i, st in enumerate(pipeline.stages):
      costs = [b[0].stages[b[1][st.name]].cost_s if st.name in b[1] else
               b[0].stages[i].cost_s for b in built
               if len(b[0].stages) == len(pipeline.stages)]
      stages.append(dataclasses.replace(st, cost_s=float(np.median(costs))))
    result[scenario] = (dataclasses.replace(pipeline, stages=tuple(stages)),
                        index)
  return result


def errors(points_by_scenario: dict[str, list[Point]],
           params: sim_lib.SimParams, cost_scale: float = 1.0,
           base: dict | None = None) -> list[dict]:
  """Per configuration: measured and predicted rows/s and the relative error.

  Each scenario's stage costs are the medians over all its configurations'
  observations (contention divided out), times `cost_scale`: tf.data's model
  counts a stage's time as wall time in its threads, which includes waiting
  for a CPU, so one machine-wide factor maps it to CPU time.
  """
  rows = []
  base = base or _base_pipelines(points_by_scenario, params)
  for scenario, (pipeline, index) in base.items():
    points = points_by_scenario[scenario]
    pipeline = dataclasses.replace(pipeline, stages=tuple(
        dataclasses.replace(st, cost_s=st.cost_s * cost_scale)
        for st in pipeline.stages))
    for p in points:
      predicted = predict(pipeline, index, p.config, p.cpus,
                          params) * p.rows_per_element
      rows.append({"scenario": scenario, "config": p.config, "cpus": p.cpus,
                   "measured": p.rows_per_s, "predicted": predicted,
                   "measurements": list(p.measurements),
                   "error": predicted / p.rows_per_s - 1 if p.rows_per_s else
                   float("inf")})
  return rows


def fit(points_by_scenario: dict[str, list[Point]],
        oversubscription: Iterable[float] = np.arange(0.0, 1.01, 0.1),
        handoff_s: Iterable[float] = (0.0, 1e-4, 3e-4, 1e-3, 2e-3, 4e-3,
                                      8e-3, 16e-3),
        cost_scale: Iterable[float] = np.arange(0.2, 1.51, 0.05),
        pipelining: Iterable[float] = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0,
                                       np.inf)
        ) -> tuple[sim_lib.SimParams, float, list[dict]]:
  """The `SimParams` and cost scale with the smallest median |error| over
  all configurations, and its errors.

  The default grids end where the model does (no oversubscription or
  hand-off cost; k = 1, a chain that does not overlap at all; k = inf,
  perfect pipelining) or well beyond any fit on this machine.
  """
  scales = np.asarray(list(cost_scale), float)
  best = None
  pipelining = list(pipelining)
  for o, h in itertools.product(oversubscription, handoff_s):
    # The base costs divide out contention, which pipelining plays no part in.
    base = _base_pipelines(points_by_scenario, sim_lib.SimParams(
        oversubscription=float(o), handoff_s=float(h)))
    for k in pipelining:
      params = sim_lib.SimParams(oversubscription=float(o),
                                 handoff_s=float(h), pipelining=float(k))
      scores = np.median(np.abs(np.concatenate(
          [_relative_errors(points_by_scenario[scenario], pipeline, index,
                            scales, params)
           for scenario, (pipeline, index) in base.items()], axis=1)), axis=1)
      i = int(np.argmin(scores))
      if best is None or scores[i] < best[0]:
        best = (float(scores[i]), params, float(scales[i]), base)
  _, params, scale, base = best
  return params, scale, errors(points_by_scenario, params, scale, base)


def _relative_errors(points: Sequence[Point], pipeline: sim_lib.SimPipeline,
                     index: dict[str, int], scales: np.ndarray,
                     params: sim_lib.SimParams) -> np.ndarray:
  """predicted / measured - 1 of each configuration (columns) under each
  cost scale (rows): what `errors` gives, for a whole grid at once."""
  n = len(pipeline.stages)
  par, buf = np.ones((len(points), n)), np.zeros((len(points), n))
  for row, p in enumerate(points):
    for name, value in p.config.items():
      stage, kind = records.split_knob(name)
      if stage not in index:
        continue
      if kind == "parallelism":
        par[row, index[stage]] = max(1.0, value)
      else:
        buf[row, index[stage]] = max(0.0, value)
  costs = np.array([st.cost_s for st in pipeline.stages])
  rate = sim_lib.throughput_batch(
      costs * scales[:, None, None], [st.cv for st in pipeline.stages], par,
      buf, [p.cpus for p in points], params)
  predicted = rate * np.array([p.rows_per_element for p in points])
  measured = np.array([p.rows_per_s for p in points])
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(measured > 0, predicted / measured - 1, np.inf)


def ranks(values: Sequence[float]) -> np.ndarray:
  """1-based ranks, ties given the mean of the ranks they span.

  Example: [30, 10, 20, 10] -> [4, 1.5, 3, 1.5].
  """
  values = np.asarray(values, dtype=float)
  order = np.argsort(values, kind="stable")
  result = np.empty(len(values))
  i = 0
  while i < len(order):
    j = i
    while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
      j += 1
    result[order[i:j + 1]] = (i + j) / 2 + 1
    i = j + 1
  return result


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
  """Spearman's rank correlation of `a` and `b` (the Pearson correlation of
  their `ranks`); NaN with fewer than 2 values or when either is constant."""
  if len(a) != len(b):
    raise ValueError(f"spearman of {len(a)} and {len(b)} values")
  if len(a) < 2:
    return float("nan")
  ra, rb = ranks(a), ranks(b)
  ra, rb = ra - ra.mean(), rb - rb.mean()
  norm = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
  return float((ra * rb).sum() / norm) if norm else float("nan")


def best_ratio(rows: Sequence[dict]) -> tuple[float, int]:
  """What the simulator's best configuration measures, over the best
  measured, and how many configurations tie for the simulator's first
  place (predictions within `TIE` of the top). The simulator cannot tell
  tied ones apart, so its choice measures their mean: the expected rate of
  taking any one of them.

  Example: predicted 10, 10, 5 and measured 90, 100, 110: the first two
  tie, (90 + 100) / 2 / 110 = 0.864, 2 tied.
  """
  chosen = [r["measured"] for r in _first_place(rows)]
  return float(np.mean(chosen)) / max(r["measured"] for r in rows), len(
      chosen)


def _first_place(rows: Sequence[dict]) -> list[dict]:
  """The rows whose prediction ties for the highest (within `TIE`)."""
  top = max(r["predicted"] for r in rows)
  return [r for r in rows if r["predicted"] >= top * (1 - TIE)]


def fresh_best_ratio(rows: Sequence[dict]) -> float | None:
  """`best_ratio` without the winner's curse: for each repeat k, the
  measured best is picked by the median of the other repeats, and both it
  and the simulator's first place (the mean of a tie) are read from repeat
  k alone; the mean of those ratios over k. The best of noisy medians
  measures high by the noise it was picked for; a repeat it was not picked
  on does not. None with fewer than 2 repeats of every configuration.

  Example: the simulator ranks A first; A measured 100 then 104, B 102
  then 100. Leaving out the first repeat, A (104) beats B (100): 100 / 100
  = 1. Leaving out the second, B (102) beats A (100): 104 / 100 = 1.04.
  Mean 1.02.
  """
  repeats = min(len(r.get("measurements") or ()) for r in rows)
  if repeats < 2:
    return None
  chosen = _first_place(rows)
  ratios = []
  for k in range(repeats):
    best = max(rows, key=lambda r, k=k: np.median(
        [m for j, m in enumerate(r["measurements"][:repeats]) if j != k]))
    ratios.append(np.mean([r["measurements"][k] for r in chosen]) /
                  best["measurements"][k])
  return float(np.mean(ratios))


def held_out(points_by_scenario: dict[str, list[Point]], **grid
             ) -> tuple[sim_lib.SimParams, float, dict[str, dict]]:
  """Fits on every other configuration of each scenario (the 1st, 3rd, ...)
  and judges the fit on the others, which it never saw.

  Args:
    points_by_scenario: as `load_trace` returns.
    **grid: the grids of `fit` (default: its defaults).

  Returns:
    The fitted `SimParams`, cost scale, and per scenario: `spearman` of
    predicted and measured rows/s over the held-out configurations
    (`held_out`: their number; `spearman_by_cpus`: among those measured on
    each CPU count), and `best_ratio`: the measured rows/s of the
    configuration the fitted simulator ranks first among all the
    scenario's configurations, over the best measured (when `best_tied`
    configurations tie for first, within `TIE`, the mean of theirs), and
    the same measured on repeats the best was not picked on
    (`fresh_best_ratio`, None without repeats); and
    the `spread` of all its configurations (`span`, `noise`).
  """
  train = {s: p[0::2] for s, p in points_by_scenario.items()}
  test = {s: p[1::2] for s, p in points_by_scenario.items() if p[1::2]}
  params, scale, _ = fit(train, **grid)
  base = _base_pipelines(train, params)
  report = {}
  for scenario, rows in _by_scenario(
      errors(test, params, scale, base)).items():
    every = errors({scenario: points_by_scenario[scenario]}, params, scale,
                   {scenario: base[scenario]})
    ratio, tied = best_ratio(every)
    report[scenario] = {
        "spearman": spearman([r["predicted"] for r in rows],
                             [r["measured"] for r in rows]),
        "spearman_by_cpus": {
            cpus: spearman([r["predicted"] for r in rows if r["cpus"] == cpus],
                           [r["measured"] for r in rows if r["cpus"] == cpus])
            for cpus in sorted({r["cpus"] for r in rows})},
        "held_out": len(rows),
        "best_ratio": ratio,
        "best_tied": tied,
        "fresh_best_ratio": fresh_best_ratio(every),
        **spread(points_by_scenario[scenario]),
    }
  return params, scale, report


def _by_scenario(rows: list[dict]) -> dict[str, list[dict]]:
  result = collections.defaultdict(list)
  for r in rows:
    result[r["scenario"]].append(r)
  return dict(result)


def main(args) -> int:
  try:
    points = load_trace(args.trace)
  except (ValueError, OSError) as e:
    # As argparse reports a bad argument: no traceback, exit status 2.
    what = str(e) if isinstance(e, ValueError) else (
        f"cannot read {args.trace}: {e.strerror or e}")
    sys.stderr.write(f"intune calibrate: error: argument --trace: {what}\n")
    return 2
  params, scale, rows = fit(points)
  print(f"SimParams: oversubscription {params.oversubscription:.2f}, "
        f"handoff {params.handoff_s * 1e3:.2f} ms, pipelining "
        f"{params.pipelining:g}; cost scale {scale:.2f}")
  print(f"{'scenario':18} {'configuration':30} {'CPUs':>4} {'measured':>10} "
        f"{'predicted':>10} {'error':>7}")
  for r in rows:
    config = ",".join(f"{int(v)}" for v in r["config"].values())
    print(f"{r['scenario']:18} {config:30} {r['cpus']:4d} "
          f"{r['measured']:10,.0f} {r['predicted']:10,.0f} {r['error']:+7.1%}")
  abs_err = [abs(r["error"]) for r in rows]
  for scenario, mine in _by_scenario(rows).items():
    e = [abs(r["error"]) for r in mine]
    print(f"{scenario}: median |error| {np.median(e):.1%} over {len(e)} "
          "configurations")
  print(f"all: median |error| {np.median(abs_err):.1%} over {len(abs_err)} "
        "configurations")
  held_params, held_scale, held = held_out(points)
  print(f"Fitted on every other configuration: oversubscription "
        f"{held_params.oversubscription:.2f}, handoff "
        f"{held_params.handoff_s * 1e3:.2f} ms, pipelining "
        f"{held_params.pipelining:g}; cost scale {held_scale:.2f}")
  for scenario, h in held.items():
    print(f"{scenario}: fitted on every other configuration, on the "
          f"{h['held_out']} held out Spearman {h['spearman']:.2f}; the "
          f"simulator's best configuration ({h['best_tied']} tied) measures "
          f"{h['best_ratio']:.1%} of the best measured; configurations "
          f"span {h['span']:.2f}x, repeats of one differ by {h['noise']:.1%} "
          "(median relative std)")
    if h["fresh_best_ratio"] is not None:
      print(f"  on repeats the measured best was not picked on, the "
            f"simulator's best measures {h['fresh_best_ratio']:.1%} of it")
    if len(h["spearman_by_cpus"]) > 1:
      print("  held out, Spearman among the configurations of one CPU count: "
            + ", ".join(f"{cpus} CPUs {rho:.2f}" for cpus, rho in
                        h["spearman_by_cpus"].items()))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"params": dataclasses.asdict(params), "cost_scale": scale,
                 "rows": rows, "held_out": held,
                 "held_out_params": dataclasses.asdict(held_params),
                 "held_out_cost_scale": held_scale,
                 "median_abs_error": float(np.median(abs_err))}, f, indent=1)
  return 0


def add_parser(subparsers, helps: Mapping[str, str]) -> None:
  p = subparsers.add_parser(
      "calibrate", help=helps["calibrate"])
  p.add_argument("--trace", required=True, help="Trace (JSON lines).")
  p.add_argument("--json", type=arguments.output_file, default=None,
                 help="Write the fit here.")
  p.set_defaults(func=main)
