"""From a sampler's knob values to a row of the candidate table, and to its nearest open row.

A sampler proposes one value per knob. `LayoutIndex` maps the proposal to its candidate row
(sequence parallelism at tp = 1 folds onto its "off" twin, and a layout of one data-parallel
rank onto its one optimizer and overlap setting, as the candidate table does) and,
when the proposal cannot be evaluated — it breaks a rule, the cost model would return no
figures for it (`unpriced`: a replay's unmeasured layout), or it was evaluated already —
finds the closest row that can: the fewest steps along each knob's list of values (tp 2 -> 4
is one step) plus one per differing choice (flash1 vs flash2). Drivers then try that row
next, so a search keeps making progress in spaces where most combinations are infeasible.

    index = LayoutIndex.of(problem)
    row = index.position(params)                       # None: not a candidate
    nearest = index.nearest(params, taken={row}, rng=np.random.default_rng(0))
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.costs.base import unpriced_reasons
from layoutsearch.layout import DATA_PARALLEL_NO_OPS
from layoutsearch.problem import SearchProblem
from layoutsearch.space import INTEGER_KNOBS, KNOBS


@dataclass(frozen=True, slots=True)
class LayoutIndex:
    params: dict[str, tuple[Any, ...]]
    """The knobs a sampler varies (those with more than one value) and their values."""
    fixed: dict[str, Any]
    """Knobs with a single value in the space."""
    labels: list[str]
    """A readable, unique label per candidate row ("tp=2 pp=4 ..."), in table order."""
    rows: dict[str, int]
    """Label -> row position."""
    codes: np.ndarray
    """(rows, sampled knobs): position of each row's value in the knob's value list."""
    num_gpus: int
    """The job's GPUs: where tp·pp fills them at cp = 1, dp·cp = 1."""
    unpriced: dict[int, str]
    """Position -> why the cost model would price no figures for a row that passes the
    rules (costs.base.unpriced_reasons); such rows are not open."""
    open: np.ndarray
    """Positions of the rows that pass every rule and that the cost model can price."""

    @classmethod
    def of(cls, problem: SearchProblem) -> LayoutIndex:
        axes = problem.space.axes()
        table = problem.candidates
        params = {k: v for k, v in axes.items() if len(v) > 1}
        labels = pd.Series("", index=table.index, dtype=object)
        for i, knob in enumerate(KNOBS):
            labels = labels + ("" if i == 0 else " ") + f"{knob}=" + table[knob].astype(str)
        codes = np.column_stack(
            [pd.Index(values).get_indexer(table[knob]) for knob, values in params.items()]
        ) if params else np.zeros((len(table), 0), dtype=np.int64)
        passing = np.flatnonzero((table["rule_reason"] == "").to_numpy())
        reasons = unpriced_reasons(problem.cost_model,
                                   table.iloc[passing].drop(columns="rule_reason"),
                                   problem.clusters).to_numpy(dtype=object)
        unpriced = {int(i): str(r) for i, r in zip(passing, reasons, strict=True) if r}
        return cls(
            params=params,
            fixed={k: v[0] for k, v in axes.items() if len(v) == 1},
            labels=labels.tolist(),
            rows={label: i for i, label in enumerate(labels.tolist())},
            codes=codes,
            num_gpus=problem.job.num_gpus,
            unpriced=unpriced,
            open=np.array([i for i in passing if i not in unpriced], dtype=np.int64),
        )

    def label(self, params: Mapping[str, Any]) -> str:
        values = {**self.fixed, **params}
        # Sequence parallelism at tp = 1 is a no-op; the candidates keep only the "off" twin.
        values["sequence_parallel"] = bool(values["sequence_parallel"]) and values["tp"] > 1
        # At dp·cp = 1 a space offering both values keeps one (layout.DATA_PARALLEL_NO_OPS).
        if values["cp"] == 1 and values["tp"] * values["pp"] == self.num_gpus:
            values.update({k: kept for k, kept in DATA_PARALLEL_NO_OPS.items()
                           if k in self.params})
        return " ".join(f"{k}={values[k]}" for k in KNOBS)

    def position(self, params: Mapping[str, Any]) -> int | None:
        return self.rows.get(self.label(params))

    def params_of(self, position: int) -> dict[str, Any]:
        """The sampled knobs' values of a row (plain Python values)."""
        return {k: self.params[k][c] for k, c in zip(self.params, self.codes[position],
                                                      strict=True)}

    def nearest(self, params: Mapping[str, Any], taken: Collection[int],
                rng: np.random.Generator) -> int | None:
        """The open row closest to `params` outside `taken` (ties drawn by `rng`)."""
        candidates = self.open[~np.isin(self.open, np.fromiter(taken, dtype=np.int64))]
        if candidates.size == 0:
            return None
        wanted = np.array([self.params[k].index(params[k]) for k in self.params])
        steps = np.abs(self.codes[candidates] - wanted)
        ordinal = np.array([k in INTEGER_KNOBS for k in self.params])
        distance = np.where(ordinal, steps, steps > 0).sum(axis=1)
        closest = candidates[distance == distance.min()]
        return int(rng.choice(closest))
