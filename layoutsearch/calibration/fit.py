"""Calibrate the analytic constants per GPU kind, and cross-validate leaving one job out.

Per GPU kind: the memory constants first (ok/oom agreement, memory.py), then the time
constants with those fixed (step time and ranking, timing.py). The honest figure is the
leave-one-job-out cross-validation: fit on the other sweeps, score the held-out one, and
compare with the starting (a-priori) constants on that same sweep.

    fitted = fit_constants(rows, load_constants("analytic_prior"))
    table = cross_validate(rows, load_constants("analytic_prior"))
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from layoutsearch.api import predict
from layoutsearch.calibration.bounds import DISCRETE, PHYSICAL
from layoutsearch.calibration.memory import fit_memory
from layoutsearch.calibration.timing import TimeObjective, fit_time, time_free
from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.costs.analytic import AnalyticCostModel
from layoutsearch.costs.constants import AnalyticConstants
from layoutsearch.errors import LayoutSearchError, closest_names
from layoutsearch.fidelity import (
    GROUP_COLUMNS,
    distinct_layouts,
    fidelity,
    spearman_change_interval,
)
from layoutsearch.measurements import check_units
from layoutsearch.rules import violations
from layoutsearch.specs import ClusterSpec
from layoutsearch.table_files import row_names

MEMORY_CONSTANTS = ("gradient_bytes", "logits_sharded_by_tp", "activation_memory_factor",
                    "logit_bytes", "memory_overhead_gib")
"""What the memory fit sets (memory.py)."""
FIDELITY_COLUMNS = ("fit_accuracy", "spearman", "regret_points", "mape")
"""The per-job figures compared before and after (docs/fidelity.md)."""


def usable_rows(rows: pd.DataFrame, clusters: Mapping[str, ClusterSpec], *,
                warn: bool = True) -> pd.DataFrame:
    """The rows a fit uses: ok/oom rows that pass the rules (others say nothing about speed
    or memory); ok/oom rows that break a rule are left out, with a warning (`warn`) naming
    the first (a measured run the rules reject is worth a look: a typo in the file, or a
    rule stricter than Megatron-LM's)."""
    measured = rows["status"].isin(["ok", "oom"])
    reasons = violations(rows, clusters)
    broken = np.flatnonzero(measured & (reasons != ""))
    if len(broken) and warn:
        i = broken[0]
        row = rows.iloc[i]
        warnings.warn(
            f"{len(broken)} of {int(measured.sum())} ok/oom rows break a rule and are left "
            f"out of the fit, e.g. {row_names(rows)[i]} ({row['model']}, {row['gpu']}, tp "
            f"{row['tp']} pp {row['pp']} dp {row['dp']}): {reasons.iloc[i]}", stacklevel=3)
    return rows[measured & (reasons == "")]


def checked_free(names: Sequence[str]) -> list[str]:
    """`--free` as time constants, each once: the memory fit sets the memory constants (all
    of them, or none with `--keep-memory`), so naming one would change nothing."""
    known = set(PHYSICAL) | set(DISCRETE)
    unknown = [n for n in names if n not in known]
    if unknown:
        named = [f"{n} (did you mean {' or '.join(map(repr, close))}?)"
                 if (close := closest_names(n, known)) else n for n in unknown]
        raise LayoutSearchError(
            f"--free: unknown constant(s) {', '.join(named)}; constants: "
            f"{', '.join(sorted(known))}")
    memory = [n for n in names if n in MEMORY_CONSTANTS]
    if memory:
        time_constants = sorted(known - set(MEMORY_CONSTANTS))
        raise LayoutSearchError(
            f"--free: {', '.join(memory)} is a memory constant, which the memory fit sets "
            f"with the others (leave out --keep-memory); --free names time constants: "
            f"{', '.join(time_constants)}")
    return list(dict.fromkeys(names))


def fit_constants(rows: pd.DataFrame, base: Mapping[str, AnalyticConstants],
                  free: Sequence[str] | None = None, *, max_evals: int = 600,
                  fit_memory_constants: bool = True, memory_grid: int = 17,
                  clusters: Mapping[str, ClusterSpec] | None = None,
                  ) -> dict[str, AnalyticConstants]:
    """Constants fitted to `rows` (validated measurement rows), for each GPU kind they cover.

    `free` names the time constants to fit (default: those that move a predicted step time
    on these rows); memory constants are fitted unless `fit_memory_constants` is false. A kind
    with too few rows for its constants is left out with a warning that says why (a few H100
    runs beside hundreds on A100 must not cost the A100 fit); none fitted is an error.
    """
    clusters = dict(clusters or clusters_by_gpu())
    if free is not None:
        free = checked_free(free)
    for name, value, least, most in (("max_evals", max_evals, 1, None),
                                     ("memory_grid", memory_grid, 2, MAX_MEMORY_GRID)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise LayoutSearchError(f"{name}={value!r}: must be an integer >= {least}")
        if most is not None and value > most:
            raise LayoutSearchError(
                f"{name}={value!r}: must be at most {most} (its square of grid points is "
                "priced for every row; the fit refines around the best cell anyway)")
    check_units(rows, clusters)
    usable = usable_rows(rows, clusters)
    if usable.empty:
        raise LayoutSearchError(
            f"no measured row has status ok or oom and passes the rules ({len(rows)} rows "
            f"given): calibration needs runs that finished or ran out of memory")
    fitted: dict[str, AnalyticConstants] = {}
    left_out: list[str] = []
    for gpu, group in usable.groupby("gpu"):
        try:
            fitted[str(gpu)] = _fit_kind(str(gpu), group, base, free, clusters,
                                         max_evals=max_evals, memory_grid=memory_grid,
                                         fit_memory_constants=fit_memory_constants)
        except LayoutSearchError as error:
            left_out.append(str(error))
    if not fitted:
        raise LayoutSearchError("; ".join(left_out))
    for reason in left_out:
        warnings.warn(f"{reason}; its constants are not fitted", stacklevel=2)
    return fitted


def memory_is_pinned(group: pd.DataFrame) -> bool:
    """Whether one GPU kind's rows pin its memory constants: runs that fit beside runs that
    did not. With one kind of outcome every memory constant agrees with all rows once pushed
    far enough (all oom: 8 GiB of overhead "fits" perfectly)."""
    return set(group["status"]) >= {"ok", "oom"}


def _fit_kind(gpu: str, group: pd.DataFrame, base: Mapping[str, AnalyticConstants],
              free: Sequence[str] | None, clusters: Mapping[str, ClusterSpec], *,
              max_evals: int, memory_grid: int,
              fit_memory_constants: bool) -> AnalyticConstants:
    """One GPU kind's constants: memory from its ok/oom rows, then time from its ok rows."""
    if gpu not in base:
        raise LayoutSearchError(f"the base constants have no GPU kind {gpu!r} to start from")
    start = base[gpu]
    if not memory_is_pinned(group):
        if set(group["status"]) == {"oom"}:
            raise LayoutSearchError(
                f"{gpu}: every row has status oom, which pins no constant (the memory fit "
                "needs runs that fit beside runs that did not; the time fit needs runs that "
                "finished)")
        if fit_memory_constants:
            warnings.warn(f"{gpu}: no row with status oom; its memory constants stay the "
                          "base's (their fit needs runs that ran out of memory beside runs "
                          "that fit)", stacklevel=3)
    elif fit_memory_constants:
        _enough_rows(gpu, "ok or oom", distinct_layouts(group), MEMORY_CONSTANTS, "--keep-memory")
        start = fit_memory(group, start, clusters, grid=memory_grid).constants
    objective = TimeObjective(group, clusters)
    moving = time_free(objective, start, skip=MEMORY_CONSTANTS)
    names = [n for n in free if n not in MEMORY_CONSTANTS] if free is not None else moving
    still = [n for n in names if n not in moving]
    if still:
        warnings.warn(f"{gpu}: --free {', '.join(still)} moves no predicted step time of these "
                      "rows (e.g. flash3_efficiency without FlashAttention-3 runs): kept as "
                      "the base's", stacklevel=3)
        names = [n for n in names if n in moving]
        if not names:
            return start
    _enough_rows(gpu, "ok", distinct_layouts(group[group["status"] == "ok"]), names, "--free")
    return fit_time(objective, start, names, max_evals=max_evals)


MAX_MEMORY_GRID = 101
"""Grid points per memory axis at most: 101² cells are 35 times the default's 17², and a grid
of 100,000 points ran out of RAM building its mesh (74.5 GiB)."""
MIN_ROWS_PER_CONSTANT = 3
"""Measured rows a fit needs per constant it sets: fewer, and the constants chase the noise
of a few runs to their bounds (11 constants on 2 rows fit them to 0.3 % and moved the best
layout of a 13B job)."""


def _enough_rows(gpu: str, kind: str, rows: int, names: Sequence[str], option: str) -> None:
    needed = MIN_ROWS_PER_CONSTANT * len(names)
    if rows < needed:
        raise LayoutSearchError(
            f"{gpu}: {rows} layouts with status {kind} (repeated runs count once) for "
            f"{len(names)} constants "
            f"({', '.join(names)}); a fit needs at least {MIN_ROWS_PER_CONSTANT} per constant "
            f"({needed}): measure more layouts, or fit fewer ({option})")


def scored(rows: pd.DataFrame, constants: Mapping[str, AnalyticConstants],
           clusters: Mapping[str, ClusterSpec]) -> tuple[pd.DataFrame, dict[str, float]]:
    """docs/fidelity.md's per-job table and summary of the analytic model with `constants`."""
    return fidelity(predict(rows, cost_model=AnalyticCostModel(constants), clusters=clusters))


def job_keys(rows: pd.DataFrame) -> pd.Series:
    """One key per sweep (docs/fidelity.md's group), "|"-joined (a key, never split back:
    a model name may hold "|")."""
    return rows[list(GROUP_COLUMNS)].astype(str).agg("|".join, axis=1)


def at_least_as_good(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, bool]:
    """Per figure, whether `after` is at least as good as `before` (1e-9 tolerance). A
    figure neither has (ρ, regret and MAPE of a job with no ok row) counts as no worse."""
    eps = 1e-9

    def no_worse(figure: str, higher_is_better: bool) -> bool:
        a, b = before[figure], after[figure]
        if np.isnan(a) and np.isnan(b):
            return True
        return b >= a - eps if higher_is_better else b <= a + eps

    return {"fit_accuracy": no_worse("fit_accuracy", True), "spearman": no_worse("spearman", True),
            "regret_points": no_worse("regret_points", False), "mape": no_worse("mape", False)}


def cross_validate(rows: pd.DataFrame, base: Mapping[str, AnalyticConstants],
                   free: Sequence[str] | None = None, *, max_evals: int = 600,
                   fit_memory_constants: bool = True, memory_grid: int = 17,
                   clusters: Mapping[str, ClusterSpec] | None = None,
                   ) -> tuple[pd.DataFrame, dict[str, float]]:
    """Leave one job out: per sweep, `base` vs constants fitted on the other sweeps.

    Returns one row per held-out sweep (`<figure>_prior`, `<figure>_cv`, the 95 % paired
    bootstrap interval of the change in ρ, `spearman_change_low` and `_high`, and `verdict`)
    and the pooled figures of the held-out predictions (each row predicted by the fit that did
    not see its sweep): overall fit accuracy and MFU MAPE, min ρ, max regret.
    """
    clusters = dict(clusters or clusters_by_gpu())
    keys = job_keys(rows)
    if keys.nunique() < 2:
        raise LayoutSearchError(
            f"leave-one-job-out needs measurements of at least 2 jobs (model, seq_length, "
            f"gpu, num_gpus, global_batch_size); these rows hold {keys.nunique()}")
    records, held_out = [], []
    for key in keys.unique():
        held, rest = rows[keys == key], rows[keys != key]
        record: dict[str, object] = held[list(GROUP_COLUMNS)].iloc[0].to_dict()
        job = " ".join(str(v) for v in record.values())
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fitted = fit_constants(rest, base, free, max_evals=max_evals,
                                       fit_memory_constants=fit_memory_constants,
                                       memory_grid=memory_grid, clusters=clusters)
            for warning in caught:  # which fold said it
                warnings.warn(f"holding out {job}: {warning.message}", stacklevel=2)
        except LayoutSearchError as error:
            # The other jobs are too few for a fit (say one small job beside this big one):
            # this job is not scored; the others still are.
            records.append({**record, "verdict": f"not scored: without it, {error}"})
            continue
        predicted_before = predict(held, cost_model=AnalyticCostModel(base), clusters=clusters)
        predicted_after = predict(held, cost_model=AnalyticCostModel({**base, **fitted}),
                                  clusters=clusters)
        first_before = fidelity(predicted_before)[0].iloc[0]
        first_after = fidelity(predicted_after)[0].iloc[0]
        before = {c: float(first_before[c]) for c in FIDELITY_COLUMNS}
        after = {c: float(first_after[c]) for c in FIDELITY_COLUMNS}
        held_out.append(predicted_after)
        for column in FIDELITY_COLUMNS:
            record[f"{column}_prior"] = before[column]
            record[f"{column}_cv"] = after[column]
        # How far the job's own runs let ρ wander: a "worse on spearman" inside it is noise.
        _, record["spearman_change_low"], record["spearman_change_high"] = (
            spearman_change_interval(predicted_before, predicted_after))
        good = at_least_as_good(before, after)
        record["verdict"] = ("at least as good" if all(good.values()) else
                             "worse on " + ", ".join(n for n, ok in good.items() if not ok))
        records.append(record)
    if not held_out:
        raise LayoutSearchError("no job could be held out: " + "; ".join(
            str(r["verdict"]).removeprefix("not scored: ") for r in records))
    _, pooled = fidelity(pd.concat(held_out, ignore_index=True))
    columns = [*GROUP_COLUMNS, *(f"{c}_{w}" for c in FIDELITY_COLUMNS for w in ("prior", "cv")),
               "spearman_change_low", "spearman_change_high", "verdict"]
    return pd.DataFrame(records).reindex(columns=columns), pooled
