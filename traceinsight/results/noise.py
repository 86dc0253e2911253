"""How sure a change is: the interval of a difference of medians, and a verdict.

A figure of a run (its step time, the GPU's work per step, an idle cause per step) is a sample of
steps, and often of several runs (profiler cycles, repeated runs). :func:`estimate` compares two
such samples the same way for every figure (see ``docs/noise.md`` for the method and its
assumptions):

- **the change** is the median of the after side's steps minus the before side's (all of a side's
  runs pooled), as ``diff`` always printed it;
- **the steps' part of its interval** is a seeded, deterministic bootstrap (:data:`RESAMPLES`
  resamples, the same seed every time, so one input gives one output): each run's steps drawn with
  replacement, pooled, the medians of the two sides subtracted; half the middle 68 % of those
  differences is the steps' standard deviation;
- **the runs' part**: each side adds its run-to-run variance, spread² / runs, the spread being
  the one the caller gives (measured: :data:`HOST_RUN_SPREAD`, :data:`GPU_RUN_SPREAD`) or, with
  several runs, their medians' standard deviation when larger; the interval is the change ±
  z · √(steps² + runs before + runs after), so it holds what a second run could have shown too;
- **the verdict**: ``lower`` when the whole interval is below 0, ``higher`` when above, ``no
  change`` when it lies within ± the ``margin`` (a change too small to matter), else ``cannot
  tell``.

Pure functions of numbers: no I/O, no globals but the constants below.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Final

import polars as pl

from traceinsight.model import Model

__all__ = [
    "CONFIDENCE",
    "GPU_RUN_SPREAD",
    "HOST_RUN_SPREAD",
    "NO_CHANGE_MARGIN",
    "RESAMPLES",
    "SEED",
    "VERDICTS",
    "Estimate",
    "estimate",
    "median",
    "step_verdict",
    "verdict",
]

#: The share of the bootstrap's differences the interval holds (a 95 % interval).
CONFIDENCE: Final = 0.95
#: Bootstrap resamples per side: enough for the 16th/84th percentiles the steps' spread is read
#: from to move by a few percent of it from one seed to another.
RESAMPLES: Final = 1000
#: The bootstrap's seed: one input, one output (a diff is deterministic, and its JSON too).
SEED: Final = 20_260_605
#: Run-to-run spread of the host-paced figures (step time; GPU idle and its causes), as a share of
#: the side's step time: one standard deviation of a run's median step time around the setup's.
#: Measured on pytorch/kineto's ResNet-50 samples, two profiler cycles of each of two unchanged runs
#: (V100, workers 0: 177.44 vs 152.07 ms per step; workers 4: 126.68 vs 122.87 ms): the log-ratios
#: 0.154 and 0.030 of the two pairs are each the difference of two runs, so one run's spread is
#: sqrt((0.154² + 0.030²) / 2) / sqrt(2) = 0.078. See docs/noise.md.
HOST_RUN_SPREAD: Final = 0.078
#: Run-to-run spread of the GPU's own work per step (its kernels, copies, collectives), as a share
#: of it: the same cycles' GPU work per step moved 0.2 % (100.62 vs 100.40 ms) and 0.3 %
#: (102.21 vs 101.93 ms); 1 % is that with room for a busier GPU's clocks.
GPU_RUN_SPREAD: Final = 0.01
#: "No change": the interval lies within ± this share of the before side's median.
NO_CHANGE_MARGIN: Final = 0.05
#: Every verdict a comparison writes (a stored one holds only these: each is shown as it is).
VERDICTS: Final = ("faster", "slower", "lower", "higher", "no change", "cannot tell")


class Estimate(Model, frozen=True, kw_only=True):
    """A figure's change from before to after, with its interval and verdict (in the figure's unit)."""

    #: Median of the after side's steps − the before side's.
    change: float
    #: The interval of the change at :attr:`confidence`.
    lower: float
    upper: float
    #: The change and its interval as shares of the before side's median (None when that is 0).
    relative: float | None
    relative_lower: float | None
    relative_upper: float | None
    confidence: float
    #: ``lower``, ``higher``, ``no change`` or ``cannot tell``.
    verdict: str


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (0 for none)."""
    return float(statistics.median(values)) if len(values) else 0.0


#: Resampled steps drawn at most per side and group of figures: fewer resamples for runs of many
#: steps (the spread of a median of many steps needs fewer to settle).
_MOST_DRAWN: Final = 400_000


def bootstrap_medians(
    runs: Sequence[Mapping[str, Sequence[float]]], resamples: int = RESAMPLES, seed: int = SEED
) -> dict[str, list[float]]:
    """Bootstrap medians of a side, every figure at once: in each resample, each run's steps are
    drawn with replacement (every run kept, so a draw moves only as its steps do; the same steps
    for every figure of a run), pooled over the runs, and each figure's median taken. ``runs``:
    each run's figures by key, each a value per step (a run's figures of one length are drawn
    together). Seeded: one input, one output."""
    draw = random.Random(seed)
    runs = [{key: _thinned(values) for key, values in run.items()} for run in runs]
    longest = max((len(values) for run in runs for values in run.values()), default=0)
    if not longest:
        return {}
    count = max(50, min(resamples, _MOST_DRAWN // longest))
    frames = []
    for run in runs:
        by_length: dict[int, list[str]] = {}
        for key, values in run.items():
            if len(values):
                by_length.setdefault(len(values), []).append(key)
        for size, keys in by_length.items():
            picks = draw.choices(range(size), k=count * size)
            table = pl.DataFrame({key: [float(value) for value in run[key]] for key in keys})
            frames.append(
                table[picks].with_columns(resample=pl.int_range(0, count * size, dtype=pl.Int32) // size)
            )
    pooled = pl.concat(frames, how="diagonal").group_by("resample").agg(pl.exclude("resample").median())
    pooled = pooled.sort("resample")
    return {
        key: [float(value) for value in pooled[key].to_list() if value is not None]
        for key in pooled.columns
        if key != "resample"
    }


#: Steps of a run the bootstrap draws from at most: a longer run (a stored result is untrusted
#: input, and may list millions) is thinned to this many, evenly spaced, so memory stays bounded.
MOST_STEPS: Final = 20_000


def _thinned(values: Sequence[float]) -> Sequence[float]:
    """``values``, or :data:`MOST_STEPS` of them evenly spaced when there are more."""
    if len(values) <= MOST_STEPS:
        return values
    return [values[index * len(values) // MOST_STEPS] for index in range(MOST_STEPS)]


def _percentile(values: Sequence[float], share: float) -> float:
    """The ``share`` (0-1) percentile of ``values``, linear between order statistics."""
    ordered = sorted(values)
    place = share * (len(ordered) - 1)
    low = math.floor(place)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (place - low)


def _between(runs: Sequence[Sequence[float]], run_sd: float) -> float:
    """The variance the side's runs add to its median: (the run-to-run spread)² / runs, the
    spread being ``run_sd`` or, with several runs, their medians' standard deviation when larger
    (two runs can show that runs vary more than measured elsewhere, never that they vary less)."""
    middles = [median(run) for run in runs if len(run)]
    spread = run_sd
    if len(middles) > 1:
        spread = max(spread, statistics.stdev(middles))
    return spread**2 / len(middles)


def estimate(
    before: Sequence[Sequence[float]],
    after: Sequence[Sequence[float]],
    *,
    run_sd_before: float = 0.0,
    run_sd_after: float = 0.0,
    margin: float = 0.0,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    drawn: tuple[Sequence[float], Sequence[float]] | None = None,
) -> Estimate | None:
    """The change of a figure from ``before`` to ``after`` (each a side's runs, each run its steps'
    values), its interval and verdict (see the module doc). ``run_sd_*``: the run-to-run spread
    of a side's median (one standard deviation, the figure's unit); ``margin``: the largest
    change that is "no change" (the figure's unit); ``drawn``: each side's bootstrap medians of
    the figure when already drawn (:func:`bootstrap_medians`, every figure at once). None when a
    side has no steps."""
    if not any(len(run) for run in before) or not any(len(run) for run in after):
        return None
    if drawn is None:
        drawn = (
            bootstrap_medians([{"x": run} for run in before], resamples, seed)["x"],
            bootstrap_medians([{"x": run} for run in after], resamples, seed + 1)["x"],
        )
    middle_before = median([value for run in before for value in run])
    middle_after = median([value for run in after for value in run])
    differences = [now - was for was, now in zip(drawn[0], drawn[1], strict=False)]
    # The steps' part as a standard deviation: half the middle 68 % of the draws (robust to the
    # few extreme draws a median of a handful of steps makes).
    within = (_percentile(differences, 0.84135) - _percentile(differences, 0.15865)) / 2
    spread = math.sqrt(within**2 + _between(before, run_sd_before) + _between(after, run_sd_after))
    change = middle_after - middle_before
    half = _Z.get(confidence, statistics.NormalDist().inv_cdf((1 + confidence) / 2)) * spread
    low, high = change - half, change + half
    relative = relative_low = relative_high = None
    if middle_before > 0:
        relative, relative_low, relative_high = (
            change / middle_before,
            low / middle_before,
            high / middle_before,
        )
    return Estimate(
        change=change,
        lower=low,
        upper=high,
        relative=relative,
        relative_lower=relative_low,
        relative_upper=relative_high,
        confidence=confidence,
        verdict=verdict(low, high, margin),
    )


def verdict(lower: float, upper: float, margin: float) -> str:
    """The verdict of an interval [``lower``, ``upper``] of a change: ``higher`` when all of it is
    above 0, ``lower`` when below, ``no change`` when it lies within ± ``margin``, else ``cannot tell``."""
    if lower > 0:
        return "higher"
    if upper < 0:
        return "lower"
    if -margin <= lower and upper <= margin:
        return "no change"
    return "cannot tell"


def step_verdict(verdict: str) -> str:
    """A step time's verdict in its own words: ``higher`` is ``slower``, ``lower`` ``faster``."""
    return {"higher": "slower", "lower": "faster"}.get(verdict, verdict)


#: Two-sided normal quantiles of the confidences used.
_Z: Final = {0.95: 1.959964, 0.9: 1.644854, 0.99: 2.575829}
