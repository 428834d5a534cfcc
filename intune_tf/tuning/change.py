"""Change detection: has an observed quantity moved beyond its noise?

A settled search holds its configuration; it re-opens when something it
observes changes (usable CPUs, a stage's cost per element, the consumer's
pace, memory pressure, the output rate). `Cusum` watches one such stream
with a two-sided CUSUM on values standardized by a running noise estimate;
`ChangeMonitor` watches named streams and says which moved.

The test, per stream (x_t: a log-rate, a log-cost or a memory fraction):

  warm-up    the first `warmup` values give the reference mean mu and the
             noise sigma (`noise_sigma` of their successive differences);
  z_t      = clip((x_t - mu) / (sigma sqrt(1 + 1/n)), -clip, +clip)
  S+_t     = max(0, S+_{t-1} + z_t - k)
  S-_t     = max(0, S-_{t-1} - z_t - k)
  alarm    when S+_t > h or S-_t > h.

Until n, the values that taught them, reaches `learn`, mu and sigma stay
running means, and sqrt(1 + 1/n) widens the noise by the uncertainty of a
mean of n values; then mu stays (a held configuration's quantities are
stationary, and a slow drift that adds up is a change too) and sigma
follows the successive differences with weight `NOISE_SMOOTHING`. Only a
value within `LEARN_WITHIN` sigmas teaches them: a value that looks like a
change must not teach that it is noise. The clip makes an outlier (a pause
of the host) unable to raise an alarm alone: with the defaults (k 1.5, h 8,
clip 4.5) it takes three consecutive values beyond 4.5 sigma (3 x 3 = 9 >
8), so a 20% shift under 3% noise (7 sigma in log units) alarms at its
third or fourth value. Chosen on simulated streams (1,000 seeds of 3%
normal noise on log values): with k 1 and h 6, or with mu and sigma fixed
after 8 values, 2-11% of the 300-step streams raised a false alarm; with
these defaults 2 of 1,000 did, and 995 of 1,000 shifts by 20% alarmed at
their third value (all but one within four).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

# CUSUM reference value k and decision interval h, in noise sigmas.
DRIFT = 1.5
THRESHOLD = 8.0
# Largest standardized value one observation contributes.
CLIP = 4.5
# Values that set the reference mean and the first noise estimate.
WARMUP = 8
# Values over which the mean and the noise stay running means.
LEARN = 40
# The noise estimate never goes below this (a stream without noise, such as
# the usable CPUs, then alarms on any move of a few percent).
MIN_SIGMA = 0.01
# Only values within this many sigmas of the mean teach the mean and the
# noise (one that looks like a change must not teach that it is noise).
LEARN_WITHIN = 3.5
# Weight of the newest difference in the running noise estimate after
# `LEARN` values.
NOISE_SMOOTHING = 0.05
# sigma = mean |x_t - x_{t-1}| * sqrt(pi) / 2 for independent normal noise:
# E|X - Y| = 2 sigma / sqrt(pi) when X, Y ~ N(mu, sigma^2).
_ABS_DIFF_TO_SIGMA = math.sqrt(math.pi) / 2


def noise_sigma(values: Sequence[float]) -> float:
  """The noise standard deviation of `values` from their successive
  differences: mean |x_t - x_{t-1}| x sqrt(pi) / 2 (0 for fewer than two
  values). Unlike the standard deviation it ignores a level shift.

  noise_sigma([1, 3, 1]) = mean(2, 2) x 0.886 = 1.772.
  """
  if len(values) < 2:
    return 0.0
  diffs = [abs(b - a) for a, b in zip(values, values[1:])]
  return sum(diffs) / len(diffs) * _ABS_DIFF_TO_SIGMA


def cusum_step(high: float, low: float, z: float,
               drift: float = DRIFT) -> tuple[float, float]:
  """One step of the two-sided CUSUM on a standardized value `z`:
  (max(0, high + z - drift), max(0, low - z - drift)).

  cusum_step(0, 0, 3) = (2, 0); cusum_step(2, 0, -0.5) = (0.5, 0).
  """
  return max(0.0, high + z - drift), max(0.0, low - z - drift)


class Cusum:
  """A two-sided CUSUM on one stream, standardized by a running noise
  estimate (module docstring).

  Args:
    drift: k, in noise sigmas. Default `DRIFT` (1.5).
    threshold: h, in noise sigmas. Default `THRESHOLD` (8).
    warmup: values that set the reference mean and noise. Default
      `WARMUP` (8).
    learn: values over which the mean and the noise are running means.
      Default `LEARN` (40).
    min_sigma: floor of the noise estimate, in the stream's units. Default
      `MIN_SIGMA` (0.01).
    clip: largest |z| one value contributes. Default `CLIP` (4.5).
  """

  def __init__(self, drift: float = DRIFT, threshold: float = THRESHOLD,
               warmup: int = WARMUP, learn: int = LEARN,
               min_sigma: float = MIN_SIGMA, clip: float = CLIP):
    if warmup < 2:
      raise ValueError(f"Cusum needs a warm-up of at least 2 values (a noise "
                       f"estimate needs a difference), got {warmup}.")
    self.drift = drift
    self.threshold = threshold
    self.warmup = warmup
    self.learn = learn
    self.min_sigma = min_sigma
    self.clip = clip
    self.reset()

  def reset(self) -> None:
    """Forgets everything: the next values are a new warm-up."""
    self._first: list[float] = []
    self.mean: float | None = None
    self._abs_diff = 0.0
    self._n = 0
    self._last: float | None = None
    self.high = self.low = 0.0

  @property
  def sigma(self) -> float | None:
    """The noise estimate (None during the warm-up)."""
    if self.mean is None:
      return None
    return max(self.min_sigma, self._abs_diff * _ABS_DIFF_TO_SIGMA)

  def update(self, x: float) -> bool:
    """Takes one value; True when the stream has moved beyond its noise
    (the detector then resets itself and warms up again)."""
    x = float(x)
    if not math.isfinite(x):
      return False
    if self.mean is None:
      self._first.append(x)
      self._last = x
      if len(self._first) >= self.warmup:
        self._n = len(self._first)
        self.mean = sum(self._first) / self._n
        self._abs_diff = noise_sigma(self._first) / _ABS_DIFF_TO_SIGMA
      return False
    sigma = self.sigma
    z = (x - self.mean) / (sigma * math.sqrt(1 + 1 / self._n))
    z = max(-self.clip, min(self.clip, z))
    diff = abs(x - self._last)
    self._last = x
    if abs(z) <= LEARN_WITHIN:
      if self._n < self.learn:
        self._n += 1
        # n values give n - 1 differences.
        self._abs_diff += (diff - self._abs_diff) / (self._n - 1)
        self.mean += (x - self.mean) / self._n
      else:
        self._abs_diff += NOISE_SMOOTHING * (diff - self._abs_diff)
    self.high, self.low = cusum_step(self.high, self.low, z, self.drift)
    if self.high > self.threshold or self.low > self.threshold:
      self.reset()
      return True
    return False


class ChangeMonitor:
  """`Cusum`s over named streams, created on a name's first value.

  Args:
    **kwargs: each stream's `Cusum` arguments.
  """

  def __init__(self, **kwargs):
    self._kwargs = kwargs
    self._streams: dict[str, Cusum] = {}

  def reset(self) -> None:
    """Forgets every stream."""
    self._streams = {}

  def update(self, values: Mapping[str, float | None]) -> list[str]:
    """Takes one value per stream (None: no value this time); returns the
    names of the streams that moved beyond their noise, sorted ([] when
    none did). On an alarm every stream starts a new warm-up."""
    moved = []
    for name, value in values.items():
      if value is None:
        continue
      if name not in self._streams:
        self._streams[name] = Cusum(**self._kwargs)
      if self._streams[name].update(value):
        moved.append(name)
    if moved:
      self.reset()
    return sorted(moved)
