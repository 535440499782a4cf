"""A conformance suite for cost models: the contract of `CostModel.score` (and of
`unpriced`, for a model that has it), checked.

Any cost model (built in or a plug-in) can run it on its own candidates; it raises an
AssertionError naming the first broken rule.

    check_cost_model(build_cost_model("analytic"))
    check_cost_model(my_model, candidates=my_table, clusters=my_clusters)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from layoutsearch.catalog import clusters_by_gpu, load_cluster
from layoutsearch.costs.base import PREDICTION_COLUMNS, CostModel
from layoutsearch.rules import violations
from layoutsearch.space import SearchSpace
from layoutsearch.specs import ClusterSpec, Job, ModelSpec

TINY_MODEL = ModelSpec(name="tiny", num_layers=4, hidden_size=256, ffn_hidden_size=688,
                       num_attention_heads=8, vocab_size=32000)


def conformance_candidates(limit: int = 12) -> pd.DataFrame:
    """A small rule-passing candidate table of a tiny model on 8 A100s, index not 0..n-1."""
    job = Job(model=TINY_MODEL, cluster=load_cluster("a100_80gb"), num_gpus=8,
              seq_length=512, global_batch_size=64)
    space = SearchSpace(tp=(1, 2), pp=(1, 2), micro_batch_size=(1, 2),
                        sequence_parallel=(False,), attention=("flash2",),
                        rmsnorm_kernel=(True,), recompute=("none", "full"))
    table = space.candidates(job)
    table = table[violations(table, clusters_by_gpu()) == ""].head(limit)
    table.index = table.index * 10 + 7  # a cost model must keep the caller's index
    return table


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"cost model conformance: {message}")


def check_cost_model(model: CostModel, candidates: pd.DataFrame | None = None,
                     clusters: Mapping[str, ClusterSpec] | None = None) -> pd.DataFrame:
    """Score `candidates` and check the contract; returns the scored frame."""
    table = conformance_candidates() if candidates is None else candidates
    clusters = clusters_by_gpu() if clusters is None else clusters
    _check(isinstance(getattr(model, "name", None), str), "needs a `name` string")
    # Asked first: for a measured model, scoring makes recorded what was not.
    unpriced = model.unpriced(table, clusters) if hasattr(model, "unpriced") else None
    scored = model.score(table, clusters)
    if unpriced is not None:
        _check(isinstance(unpriced, pd.Series) and unpriced.index.equals(table.index)
               and bool(unpriced.map(lambda r: isinstance(r, str)).all()),
               "unpriced must return a Series of strings on the candidates' index")
        named = (unpriced != "").to_numpy()
        _check(not scored["fits"].to_numpy()[named].any()
               and bool(scored["mfu"].isna().to_numpy()[named].all()),
               "a row `unpriced` names must get no figures from score")
    _check(isinstance(scored, pd.DataFrame), "score must return a DataFrame")
    _check(scored.index.equals(table.index), "the result must keep the candidates' index")
    missing = [c for c in PREDICTION_COLUMNS if c not in scored.columns]
    _check(not missing, f"missing columns {missing}")
    _check(scored["fits"].dtype == bool, "`fits` must be a bool column")
    reasons = scored["cost_reason"]
    _check(bool(reasons.map(lambda r: isinstance(r, str)).all()), "`cost_reason` must hold strings")
    fits = scored["fits"].to_numpy()
    ok = scored[fits]
    _check(bool((ok["step_time_s"] > 0).all()), "a fitting row needs step_time_s > 0")
    _check(bool(((ok["mfu"] > 0) & (ok["mfu"] <= 1)).all()), "a fitting row needs 0 < mfu <= 1")
    _check(bool((scored.loc[~fits, "cost_reason"] != "").all()),
           "a row that does not fit must say why in cost_reason")
    tokens = table["global_batch_size"] * table["seq_length"]
    expected = (tokens / scored["step_time_s"])[fits]
    _check(bool(np.allclose(ok["tokens_per_s"], expected, rtol=1e-6)),
           "tokens_per_s must equal global_batch_size·seq_length / step_time_s")
    memory = scored["peak_memory_gib"].dropna()
    _check(bool((memory >= 0).all()), "peak_memory_gib must be >= 0")
    for prefix, total in (("time_", "step_time_s"), ("memory_", "peak_memory_gib")):
        parts = [c for c in scored.columns if c.startswith(prefix)]
        if parts:
            _check(bool(np.allclose(scored[parts].sum(axis=1), scored[total], rtol=1e-6,
                                    equal_nan=True)),
                   f"the {prefix}* breakdown must sum to {total}")
    # Rows are priced independently: a subset scores as it did inside the whole table.
    half = table.iloc[::2]
    again = model.score(half, clusters)
    for column in ("step_time_s", "mfu", "fits"):
        _check(bool(np.array_equal(again[column].to_numpy(), scored.loc[half.index, column]
                                   .to_numpy(), equal_nan=column != "fits")),
               f"{column} of a row must not depend on the other rows scored with it")
    empty = model.score(table.iloc[:0], clusters)
    _check(len(empty) == 0 and all(c in empty.columns for c in PREDICTION_COLUMNS),
           "an empty table must give an empty result with the prediction columns")
    return scored
