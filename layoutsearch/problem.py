"""A search problem: the job, its candidate table with rule verdicts, and how to price rows.

Drivers receive a `SearchProblem` and never see formulas; cost models price rows and never
see drivers. `evaluate` sends only rule-passing rows to the cost model, so an
expensive backend never launches a layout that cannot run.

    problem = SearchProblem.build(job, space, cost_model, clusters)
    scored = problem.evaluate(problem.feasible_candidates())

A `launch_check` (the Megatron-LM settings' extra flags, checked per command) marks layouts
the cost model finds to fit but that cannot be launched as not fitting, with its reason, so
every driver (a sampler's trials, the study's rules) steers by what can run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from layoutsearch.costs.base import PREDICTION_COLUMNS, CostModel
from layoutsearch.errors import LayoutSearchError
from layoutsearch.rules import violation_codes, violations
from layoutsearch.space import SearchSpace
from layoutsearch.specs import ClusterSpec, Job
from layoutsearch.text_columns import coded_text, first_text


def require_a_dividing_batch(job: Job, candidates: pd.DataFrame) -> None:
    """Reject a global batch that no layout of the space can split into micro-batches.

    Megatron-LM needs global_batch_size to be a multiple of micro_batch_size·dp; when no
    candidate allows that, the job itself is wrong, not some layouts, and the error names
    the nearest batches that work.
    """
    whole = candidates["dp"] > 0
    per_step = np.unique((candidates["micro_batch_size"] * candidates["dp"])[whole])
    batch = job.global_batch_size
    if len(per_step) == 0 or (batch % per_step == 0).any():
        return
    below = (batch // per_step) * per_step  # 0 where the step exceeds the batch
    nearest = [int(below.max())] if below.max() > 0 else []
    nearest.append(int((below + per_step).min()))
    raise LayoutSearchError(
        f"global_batch_size={batch}: no layout of the space divides it into micro-batches "
        f"(it must be a multiple of micro_batch_size·dp, and micro_batch_size·dp is at least "
        f"{int(per_step.min())} here); use {' or '.join(map(str, nearest))}, or allow "
        "larger tp·pp so dp can be smaller"
    )


SUGGESTION_CANDIDATES = 500_000
"""The most layouts tried when looking for tp·pp values to suggest (about half a second of
rule checks); a larger widened space gets no suggestion."""


@dataclass(frozen=True, slots=True)
class SearchProblem:
    job: Job
    space: SearchSpace
    candidates: pd.DataFrame
    """Every layout of the space with a `rule_reason` column ("" where all rules pass),
    categorical like the table's other text columns."""
    cost_model: CostModel
    clusters: Mapping[str, ClusterSpec]
    launch_check: Callable[[pd.DataFrame], pd.Series] | None = None
    """Why each of some rows cannot be launched ("" where it can), asked of the rows the
    cost model finds to fit; None: every layout that passes the rules can be."""

    @classmethod
    def build(cls, job: Job, space: SearchSpace, cost_model: CostModel,
              clusters: Mapping[str, ClusterSpec],
              launch_check: Callable[[pd.DataFrame], pd.Series] | None = None,
              ) -> SearchProblem:
        candidates = space.candidates(job)
        require_a_dividing_batch(job, candidates)
        candidates["rule_reason"] = coded_text(*violation_codes(candidates, clusters))
        return cls(job, space, candidates, cost_model, clusters, launch_check)

    def feasible_candidates(self) -> pd.DataFrame:
        """Rows that pass every rule (memory is the cost model's call)."""
        return self.candidates[self.candidates["rule_reason"] == ""]

    def passing_tp_pp(self) -> list[tuple[int, int]]:
        """(tp, pp) pairs that pass every rule with some setting of the space's other knobs,
        smallest tp·pp first: what to suggest when no layout of the space passes (none
        when some does: then the rules are not what stands in the way)."""
        if not self.feasible_candidates().empty:
            return []
        gpus = self.job.num_gpus
        divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
        wider = self.space.pin(tp=divisors, pp=divisors)
        if wider.size() > SUGGESTION_CANDIDATES:
            return []
        candidates = wider.candidates(self.job)
        passing = candidates.loc[violations(candidates, self.clusters) == "", ["tp", "pp"]]
        pairs = {(int(tp), int(pp)) for tp, pp in passing.itertuples(index=False, name=None)}
        return sorted(pairs, key=lambda pair: (pair[0] * pair[1], pair))

    def evaluate(self, rows: pd.DataFrame) -> pd.DataFrame:
        """`rows` with the cost model's columns; rule-breaking rows are not sent to it."""
        passing = rows[rows["rule_reason"] == ""]
        scored = self.cost_model.score(passing.drop(columns="rule_reason"), self.clusters)
        missing = [c for c in PREDICTION_COLUMNS if c not in scored.columns]
        if missing:
            raise TypeError(
                f"cost model {self.cost_model.name!r} returned no {', '.join(missing)}"
            )
        out = rows.join(scored, how="left")
        out["fits"] = out["fits"].fillna(False).astype(bool) & (out["rule_reason"] == "")
        out["reason"] = first_text(out["rule_reason"], out["cost_reason"]).array
        return self.unlaunchable_refused(out.drop(columns=["rule_reason", "cost_reason"]))

    def unlaunchable_refused(self, priced: pd.DataFrame) -> pd.DataFrame:
        """`priced` (with `fits` and `reason`) with the fitting rows `launch_check` refuses
        marked as not fitting, with its reason; as given without a check."""
        if self.launch_check is None or not priced["fits"].any():
            return priced
        refused = self.launch_check(priced[priced["fits"]])
        refused = refused[refused != ""]
        priced.loc[refused.index, "fits"] = False
        priced.loc[refused.index, "reason"] = refused
        return priced
