"""Fit the analytic model's constants to measured runs; score the fit honestly.

The objective, per GPU kind, is what makes a ranking right: the squared log error of the
step time over `ok` rows (MFU error is the same error; every sweep weighs the same) plus a
hinge on the memory estimate for wrong go/no-go calls (an `ok` run predicted over the
device memory, an `oom` run predicted under it), in log units. Constants are fitted in an
unconstrained space (logit for fractions, log for positive amounts) by Nelder-Mead, written
here in numpy: a dozen parameters need no more, and layoutsearch does not take on scipy
for one optimizer. The honest figure is the leave-one-job-out cross-validation: fit on the
other sweeps, score the held-out one.

    fit = calibrate(read_measurements("runs.csv"), base="analytic")
    fit.write("cost_models/calibrated.yaml", provenance)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from layoutsearch.api import predict
from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.costs.analytic import AnalyticCostModel
from layoutsearch.costs.constants import AnalyticConstants, load_constants
from layoutsearch.errors import LayoutSearchError
from layoutsearch.fidelity import GROUP_COLUMNS, fidelity
from layoutsearch.measurements import read_measurements
from layoutsearch.rules import violations
from layoutsearch.specs import ClusterSpec

FIXED = ("gradient_bytes", "logits_sharded_by_tp")
"""Discrete choices (bytes per gradient, a 0/1 switch), never fitted."""
FRACTIONS = ("dp_comm_exposed",)
"""Constants in (0, 1] besides the `*_efficiency` ones."""
MEMORY_WEIGHT = 1.0
"""Weight of the wrong-fit hinge (log units) against the step-time squared log error."""
PRIOR_WEIGHT = 0.002
"""A weak pull of each fitted constant towards its base value (in the unconstrained space):
constants the data cannot tell apart (exposed DP time vs network efficiency) stay physical."""
FIDELITY_COLUMNS = ("fit_accuracy", "spearman", "regret_points", "top3_hit", "mape")


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, *, max_evals: int = 600,
                step: float = 0.3, tol: float = 1e-7) -> tuple[np.ndarray, float]:
    """Minimize f from x0 (standard coefficients: reflect 1, expand 2, contract ½, shrink ½)."""
    n = len(x0)
    simplex = np.vstack([x0] + [x0 + step * np.eye(n)[i] for i in range(n)])
    values = np.array([f(x) for x in simplex])
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(values)
        simplex, values = simplex[order], values[order]
        if values[-1] - values[0] < tol:
            break
        centroid = simplex[:-1].mean(axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        evals += 1
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            evals += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            evals += 1
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [f(x) for x in simplex[1:]]
                evals += n
    best = int(np.argmin(values))
    return simplex[best], float(values[best])


def _is_fraction(name: str) -> bool:
    return name.endswith("_efficiency") or name in FRACTIONS


def _to_free(name: str, value: float) -> float:
    value = max(value, 1e-9)
    if _is_fraction(name):
        value = min(value, 1 - 1e-6)
        return float(np.log(value / (1 - value)))
    return float(np.log(value))


def _from_free(name: str, z: float) -> float:
    return float(1 / (1 + np.exp(-z))) if _is_fraction(name) else float(np.exp(z))


def default_free(rows: pd.DataFrame, base: AnalyticConstants,
                 clusters: Mapping[str, ClusterSpec]) -> list[str]:
    """The constants the step-time objective informs: those that move a predicted step time.

    Found by perturbing each constant by 10% on the rows themselves, so new constants of the
    analytic model are picked up without a list here. Memory-only constants (overheads,
    activation factors) are kept from the base by default: the go/no-go accuracy they
    govern is a count of wrong calls, which the hinge only approximates; free them with
    `--free` to fit them too. Discrete switches (FIXED) are never fitted.
    """
    gpu = str(rows["gpu"].iloc[0])
    reference = AnalyticCostModel({gpu: base}).score(rows, clusters)["step_time_s"].to_numpy()
    names = []
    for field in dataclasses.fields(base):
        if field.name in FIXED:
            continue
        nudged = dataclasses.replace(base, **{field.name: getattr(base, field.name) * 1.1})
        step = AnalyticCostModel({gpu: nudged}).score(rows, clusters)["step_time_s"].to_numpy()
        if not np.allclose(step, reference, rtol=1e-9, equal_nan=True):
            names.append(field.name)
    return names


class Objective:
    """The calibration loss of one GPU kind's measured rows (arrays precomputed once)."""

    def __init__(self, rows: pd.DataFrame, clusters: Mapping[str, ClusterSpec]) -> None:
        self.rows = rows.reset_index(drop=True)
        self.clusters = clusters
        self.gpu = str(self.rows["gpu"].iloc[0])
        status = self.rows["status"].to_numpy()
        self.ok, self.oom = status == "ok", status == "oom"
        self.log_measured = np.log(self.rows["step_time_s"].to_numpy(dtype=float))
        keys = self.rows[list(GROUP_COLUMNS)].astype(str).agg("|".join, axis=1)
        self.group, _ = pd.factorize(keys)
        # Each sweep weighs the same: a row's weight is 1 / (ok rows of its sweep).
        counts = np.bincount(self.group[self.ok], minlength=self.group.max() + 1)
        sweeps = max(int((counts > 0).sum()), 1)
        self.time_weight = np.where(self.ok, 1.0 / np.maximum(counts[self.group], 1), 0) / sweeps
        self.capacity_gib = clusters[self.gpu].gpu.memory_gib

    def __call__(self, constants: AnalyticConstants) -> float:
        scored = AnalyticCostModel({self.gpu: constants}).score(self.rows, self.clusters)
        error = np.log(scored["step_time_s"].to_numpy()) - self.log_measured
        time_loss = float(np.sum(self.time_weight[self.ok] * error[self.ok] ** 2))
        ratio = np.log(scored["peak_memory_gib"].to_numpy() / self.capacity_gib)
        hinge = np.where(self.ok, np.maximum(ratio, 0), 0) + np.where(
            self.oom, np.maximum(-ratio, 0), 0)
        counted = self.ok | self.oom
        memory_loss = float(hinge[counted].mean()) if counted.any() else 0.0
        total = time_loss + MEMORY_WEIGHT * memory_loss
        return total if np.isfinite(total) else float("inf")


def _usable(rows: pd.DataFrame, clusters: Mapping[str, ClusterSpec]) -> pd.DataFrame:
    """ok/oom rows that pass the rules (others say nothing about speed or memory)."""
    keep = rows["status"].isin(["ok", "oom"]) & (violations(rows, clusters) == "")
    return rows[keep].reset_index(drop=True)


def fit_constants(rows: pd.DataFrame, base: Mapping[str, AnalyticConstants],
                  free: Sequence[str] | None = None, *, max_evals: int = 600,
                  clusters: Mapping[str, ClusterSpec] | None = None,
                  ) -> dict[str, AnalyticConstants]:
    """Constants per GPU kind fitted to `rows` (validated measurement rows); others as `base`."""
    clusters = dict(clusters or clusters_by_gpu())
    usable = _usable(rows, clusters)
    fitted = dict(base)
    for gpu, group in usable.groupby("gpu"):
        gpu = str(gpu)
        if gpu not in base:
            raise LayoutSearchError(f"the base constants have no GPU kind {gpu!r} to start from")
        start = base[gpu]
        names = list(free) if free is not None else default_free(group, start, clusters)
        known = {f.name for f in dataclasses.fields(start)}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise LayoutSearchError(
                f"--free: unknown constant(s) {', '.join(unknown)}; constants: "
                f"{', '.join(sorted(known))}")
        objective = Objective(group, clusters)
        x0 = np.array([_to_free(n, getattr(start, n)) for n in names])

        def loss(z: np.ndarray, names: list[str] = names, start: AnalyticConstants = start,
                 objective: Objective = objective, x0: np.ndarray = x0) -> float:
            values = {n: _from_free(n, float(v)) for n, v in zip(names, z, strict=True)}
            prior = PRIOR_WEIGHT * float(np.sum((z - x0) ** 2))
            return objective(dataclasses.replace(start, **values)) + prior

        best, _ = nelder_mead(loss, x0, max_evals=max_evals)
        fitted[gpu] = dataclasses.replace(
            start, **{n: _from_free(n, float(v)) for n, v in zip(names, best, strict=True)})
    return fitted


def _summary(frame: pd.DataFrame, model: AnalyticCostModel,
             clusters: Mapping[str, ClusterSpec]) -> tuple[pd.DataFrame, dict[str, float]]:
    return fidelity(predict(frame, cost_model=model, clusters=clusters))


def cross_validate(rows: pd.DataFrame, base: Mapping[str, AnalyticConstants],
                   free: Sequence[str] | None = None, *, max_evals: int = 600,
                   clusters: Mapping[str, ClusterSpec] | None = None) -> pd.DataFrame:
    """Leave one job out: fit on the other sweeps, score the held-out one, per sweep."""
    clusters = dict(clusters or clusters_by_gpu())
    keys = rows[list(GROUP_COLUMNS)].astype(str).agg("|".join, axis=1)
    uncalibrated = AnalyticCostModel(base)
    records = []
    for key in keys.unique():
        held, rest = rows[keys == key], rows[keys != key]
        fitted = AnalyticCostModel(fit_constants(rest, base, free, max_evals=max_evals,
                                                 clusters=clusters))
        before, _ = _summary(held, uncalibrated, clusters)
        after, _ = _summary(held, fitted, clusters)
        record = dict(zip(GROUP_COLUMNS, str(key).split("|"), strict=True))
        for column in FIDELITY_COLUMNS:
            record[f"{column}_before"] = before[column].iloc[0]
            record[f"{column}_cv"] = after[column].iloc[0]
        records.append(record)
    return pd.DataFrame(records)


def write_config(path: str | Path, constants: Mapping[str, AnalyticConstants],
                 provenance: Mapping[str, Any]) -> Path:
    """A `cost_models/` file of the analytic model's shape plus a `provenance:` block."""
    config = {
        "_target_": "layoutsearch.costs.analytic.AnalyticCostModel",
        "gpus": {gpu: {k: float(v) for k, v in c.to_dict().items()}
                 for gpu, c in constants.items()},
        "provenance": dict(provenance),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Analytic constants calibrated by layoutsearch-calibrate; see provenance.\n"
                    + yaml.safe_dump(config, sort_keys=False))
    return path


def _figures(summary: Mapping[str, float]) -> dict[str, float]:
    names = ("fit_accuracy", "min_spearman", "max_regret_points", "top3_hits", "mape")
    return {name: round(float(summary[name]), 4) for name in names}


def main(argv: Sequence[str] | None = None) -> int:
    """`layoutsearch-calibrate MEASUREMENTS.csv`: fit, print fidelity before/after and CV."""
    parser = argparse.ArgumentParser(prog="layoutsearch-calibrate", description=main.__doc__)
    parser.add_argument("measurements", help="a measurement file (MEASUREMENTS.md schema)")
    parser.add_argument("--out", default="cost_models/calibrated.yaml")
    parser.add_argument("--base", default="analytic", help="constants to start from")
    parser.add_argument("--free", default=None,
                        help="comma-separated constants to fit (default: those that move a "
                        "predicted step time on these rows)")
    parser.add_argument("--max-evals", type=int, default=600)
    parser.add_argument("--no-cv", action="store_true", help="skip the cross-validation")
    args = parser.parse_args(argv)
    try:
        rows = read_measurements(args.measurements)
        base = load_constants(args.base)
    except LayoutSearchError as error:
        parser.error(str(error))
    free = [n.strip() for n in args.free.split(",") if n.strip()] if args.free else None
    clusters = clusters_by_gpu()
    fitted = fit_constants(rows, base, free, max_evals=args.max_evals, clusters=clusters)
    before_table, before = _summary(rows, AnalyticCostModel(base), clusters)
    after_table, after = _summary(rows, AnalyticCostModel(fitted), clusters)
    pd.set_option("display.width", 160)
    print(f"fidelity on {args.measurements} ({len(rows)} rows), in-sample")
    show = [*GROUP_COLUMNS[:2], "num_gpus", *FIDELITY_COLUMNS]
    print("before (base constants):\n" + before_table[show].round(3).to_string(index=False))
    print("after (fitted constants):\n" + after_table[show].round(3).to_string(index=False))
    print(f"summary before: {_figures(before)}\nsummary after:  {_figures(after)}")
    provenance: dict[str, Any] = {
        "data": str(Path(args.measurements).resolve()), "date": datetime.date.today().isoformat(),
        "rows": len(rows), "base": args.base, "free": free or "default",
        "in_sample_before": _figures(before), "in_sample_after": _figures(after),
    }
    if not args.no_cv:
        cv = cross_validate(rows, base, free, max_evals=args.max_evals, clusters=clusters)
        print("leave-one-job-out (fit on the other jobs, score the held-out one):")
        print(cv.drop(columns=["gpu", "global_batch_size"]).round(3).to_string(index=False))
        provenance["leave_one_job_out"] = {
            f"{r.model} {r.seq_length} {r.num_gpus}": {
                c: round(float(getattr(r, f"{c}_cv")), 4) for c in FIDELITY_COLUMNS}
            for r in cv.itertuples()}
    for gpu, constants in fitted.items():
        changed = {k: round(v, 6) for k, v in constants.to_dict().items()
                   if v != getattr(base[gpu], k)}
        print(f"fitted {gpu}: {changed}")
    path = write_config(args.out, fitted, provenance)
    print(f"wrote {path}")
    return 0
