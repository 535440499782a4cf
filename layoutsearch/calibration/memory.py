"""Fit the memory constants to measured ok/oom outcomes: the go/no-go call a user acts on.

The objective is the count of wrong calls (`ok` predicted over the device memory, `oom`
predicted under it), tie-broken by the margin: the width of the band of
`memory_overhead_gib` values that give that count, whose middle is taken, so the nearest
`ok` run sits as far under the limit as the nearest `oom` run sits over it. The overhead
adds the same GiB to every row, so for each choice of the other constants its best value
follows exactly from the sorted per-row slack; `gradient_bytes` and `logits_sharded_by_tp`
are tried at each of their values and `activation_memory_factor` × `logit_bytes` on a log
grid, refined once around the best cell. One vectorized `memory_breakdown` call prices a
whole block of grid points.

    fit = fit_memory(rows, start, clusters)   # rows of one GPU kind with status ok/oom
    fit.constants, fit.errors, fit.margin_gib
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from layoutsearch.calibration.bounds import DISCRETE, PHYSICAL, Bound
from layoutsearch.costs.constants import AnalyticConstants
from layoutsearch.costs.memory import GIB, memory_breakdown
from layoutsearch.costs.shapes import Array, Shapes, total
from layoutsearch.specs import ClusterSpec

GRID = 17
"""Grid points per continuous axis (activation factor, logit bytes), log-spaced in bounds."""
ROWS_PER_BLOCK = 1_000_000
"""Row × grid-point pairs priced in one `memory_breakdown` call (bounds peak RAM, ~0.5 GB)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryFit:
    """The fitted constants and how well they call ok/oom on the rows they were fitted to."""

    constants: AnalyticConstants
    errors: int
    """Rows called wrongly (ok predicted not to fit, or oom predicted to fit)."""
    rows: int
    margin_gib: float
    """Half the width of the band of overheads with this error count."""


def _tile(shapes: Shapes, times: int) -> Shapes:
    """The same rows `times` over: one block row per grid point."""
    return shapes.pick(np.tile(np.arange(len(shapes.gpu_codes)), times))


def _slack_gib(shapes: Shapes, start: AnalyticConstants,
               points: Mapping[str, Array]) -> Array:
    """Device memory minus the predicted peak without overhead, GiB: (grid point, row)."""
    n = len(shapes.gpu_codes)
    count = len(next(iter(points.values())))
    per_block = max(1, ROWS_PER_BLOCK // max(n, 1))
    out = np.empty((count, n))
    for begin in range(0, count, per_block):
        end = min(begin + per_block, count)
        tiled = _tile(shapes, end - begin)
        k = {name: np.full(n * (end - begin), float(value))
             for name, value in start.to_dict().items()}
        k["memory_overhead_gib"][:] = 0.0
        for name, values in points.items():
            k[name] = np.repeat(values[begin:end], n)
        # Added part by part in the order the analytic model adds its peak (shapes.total).
        peak = total(memory_breakdown(tiled, k).values())
        out[begin:end] = ((tiled.memory_bytes - peak) / GIB).reshape(end - begin, n)
    return out


def best_overhead(slack: Array, ran: Array, bound: Bound) -> tuple[Array, Array, Array]:
    """Per grid point: fewest wrong calls, the overhead in the middle of its widest band, and
    half that band's width (the margin), over overheads within `bound`.

    A row fits iff overhead <= its slack. With slacks sorted s_1 <= ... <= s_n, an overhead
    in (s_j, s_j+1] calls rows 1..j out of memory and the rest fitting: the wrong calls are
    the `ok` rows among the first j plus the `oom` rows among the others.
    """
    count = len(slack)
    order = np.argsort(slack, axis=1)
    s = np.take_along_axis(slack, order, axis=1)
    ok_sorted = ran[order]
    zeros = np.zeros((count, 1))
    ok_below = np.hstack([zeros, np.cumsum(ok_sorted, axis=1)])
    oom_below = np.hstack([zeros, np.cumsum(~ok_sorted, axis=1)])
    errors = ok_below + (oom_below[:, -1:] - oom_below)  # (count, n + 1) bands
    low = np.maximum(np.hstack([np.full((count, 1), -np.inf), s]), bound.lo)
    high = np.minimum(np.hstack([s, np.full((count, 1), np.inf)]), bound.hi)
    width = high - low
    errors = np.where(width >= 0, errors, np.inf)
    fewest = errors.min(axis=1, keepdims=True)
    band = np.argmax(np.where(errors == fewest, width, -np.inf), axis=1)
    pick = band[:, None]
    middle = ((np.take_along_axis(low, pick, 1) + np.take_along_axis(high, pick, 1)) / 2)[:, 0]
    margin = np.take_along_axis(width, pick, 1)[:, 0] / 2
    return fewest[:, 0], middle, margin


def _axis(bound: Bound, points: int) -> Array:
    return np.geomspace(bound.lo, bound.hi, points) if bound.log else np.linspace(
        bound.lo, bound.hi, points)


def fit_memory(rows: pd.DataFrame, start: AnalyticConstants,
               clusters: Mapping[str, ClusterSpec], *, grid: int = GRID) -> MemoryFit:
    """Memory constants of one GPU kind fitted to the ok/oom `rows`; the others as `start`."""
    rows = rows[rows["status"].isin(["ok", "oom"])].reset_index(drop=True)
    shapes = Shapes.of(rows, clusters)
    ran = (rows["status"] == "ok").to_numpy()
    factor_bound = PHYSICAL["activation_memory_factor"]
    logit_bound = PHYSICAL["logit_bytes"]
    overhead_bound = PHYSICAL["memory_overhead_gib"]

    def search(base: AnalyticConstants, factors: Array, logit_bytes: Array,
               ) -> tuple[float, float, AnalyticConstants]:
        f, b = (a.ravel() for a in np.meshgrid(factors, logit_bytes, indexing="ij"))
        slack = _slack_gib(shapes, base, {"activation_memory_factor": f, "logit_bytes": b})
        errors, overhead, margin = best_overhead(slack, ran, overhead_bound)
        i = int(np.lexsort((-margin, errors))[0])
        fitted = dataclasses.replace(base, activation_memory_factor=float(f[i]),
                                     logit_bytes=float(b[i]),
                                     memory_overhead_gib=float(overhead[i]))
        return float(errors[i]), float(margin[i]), fitted

    results = []
    for values in itertools.product(*DISCRETE.values()):
        base = dataclasses.replace(start, **dict(zip(DISCRETE, values, strict=True)))
        results.append(search(base, _axis(factor_bound, grid), _axis(logit_bound, grid)))
    errors, margin, coarse = min(results, key=lambda r: (r[0], -r[1]))
    # Refine inside the neighbouring cells of the coarse grid's best point.
    step_f = (factor_bound.hi / factor_bound.lo) ** (1 / (grid - 1))
    step_b = (logit_bound.hi / logit_bound.lo) ** (1 / (grid - 1))
    fine_f = np.clip(coarse.activation_memory_factor * np.geomspace(1 / step_f, step_f, grid),
                     factor_bound.lo, factor_bound.hi)
    fine_b = np.clip(coarse.logit_bytes * np.geomspace(1 / step_b, step_b, grid),
                     logit_bound.lo, logit_bound.hi)
    fine = search(coarse, fine_f, fine_b)
    if (fine[0], -fine[1]) <= (errors, -margin):
        errors, margin, coarse = fine
    return MemoryFit(constants=coarse, errors=int(errors), rows=len(rows), margin_gib=margin)
