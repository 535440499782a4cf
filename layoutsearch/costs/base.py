"""The cost-model interface: price a table of candidate layouts in one call.

A cost model is any object with a `name` and a `score(candidates, clusters)` method.
`candidates` carries the measurement-schema columns of the job and
the layout (see `space.SearchSpace.candidates`); `score` returns a frame on the same index
with at least PREDICTION_COLUMNS, plus any breakdown columns (`time_*_s`, `memory_*_gib`).
A cost model may also define `fingerprint() -> str`, what it prices with (constants, a file):
a resumed optuna study refuses to continue under a model with another fingerprint, and says
what the fingerprint covers by `fingerprint_covers() -> str`, where the model has one. And it may
define `unpriced(candidates, clusters) -> pd.Series`: for each row, why it would return no
figures for it ("" where it would), found without pricing anything — a replay's layouts the
file never measured, a measured model's layouts it will not launch. The optuna driver
treats those rows as it treats rule-breaking ones, so its budget of evaluations is spent
on layouts that get a price. Last, it may define `reprices(costs) -> bool`: whether a price
it gave in an earlier search (one row of its columns, as a stored optuna trial keeps them)
is to be asked again rather than reused — a measured model's launch that recorded nothing,
or a failure it is told to retry. And `recorded(candidates, clusters) -> pd.Series` (bool):
the rows it prices from runs earlier searches made (a measured model's measurement file),
launching nothing; a sampling driver's answer holds them beside the layouts it sampled, as
a grid search's does, so that no run of the job is left out of the ranking.

    class Constant:
        name = "constant"
        def score(self, candidates, clusters): ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import pandas as pd

from layoutsearch.specs import ClusterSpec

PREDICTION_COLUMNS = (
    "step_time_s",      # seconds per optimizer step (NaN where unknown)
    "mfu",              # model FLOPs utilization 0..1, the study's formula
    "tokens_per_s",     # trained tokens per second, whole job
    "peak_memory_gib",  # peak device memory per GPU (NaN where unknown)
    "fits",             # the go/no-go call: True if the layout is expected to run
    "cost_reason",      # why it does not fit or is unpriced ("" otherwise)
)
MEASURED = "measured"
"""How `cost_reason` starts for a layout whose measured runs say it did not fit or run: a
replay's ("measured: out of memory") and a measured search's (MEASURED_FAILURE)."""
MEASURED_FAILURE = f"{MEASURED} "
"""How `cost_reason` starts for a layout that was launched and failed ("measured oom: ...")."""
UNMEASURED = "unmeasured: "
"""How `cost_reason` starts for a layout the cost model has no figures for (a replay of a
file that never ran it): unknown, which a no-fit message must not call too big."""


@runtime_checkable
class CostModel(Protocol):
    """Prices layouts; never sees the driver that proposed them."""

    name: str

    def score(
        self, candidates: pd.DataFrame, clusters: Mapping[str, ClusterSpec]
    ) -> pd.DataFrame:
        """One row per candidate (same index) with PREDICTION_COLUMNS and breakdowns."""
        ...


def unpriced_reasons(model: CostModel, candidates: pd.DataFrame,
                     clusters: Mapping[str, ClusterSpec]) -> pd.Series:
    """Why `model` would price no figures for each row ("" where it would, and for every row
    of a model without `unpriced`), on the candidates' index."""
    unpriced = getattr(model, "unpriced", None)
    if not callable(unpriced):
        return pd.Series("", index=candidates.index, dtype=object)
    reasons = unpriced(candidates, clusters)
    return reasons.reindex(candidates.index).fillna("").astype(str)


def reprices(model: CostModel, costs: Mapping[str, Any]) -> bool:
    """Whether `model` prices again a layout it priced in an earlier search as `costs`
    (False for a model without `reprices`: its prices do not change)."""
    ask_again = getattr(model, "reprices", None)
    return bool(ask_again(costs)) if callable(ask_again) else False


def recorded_rows(model: CostModel, candidates: pd.DataFrame,
                  clusters: Mapping[str, ClusterSpec]) -> pd.Series:
    """Whether `model` prices each row from a run it has recorded (its `recorded`), on the
    candidates' index; False for every row of a model without `recorded`."""
    recorded = getattr(model, "recorded", None)
    if not callable(recorded):
        return pd.Series(False, index=candidates.index, dtype=bool)
    return recorded(candidates, clusters).reindex(candidates.index).fillna(False).astype(bool)


def cost_model_fingerprint(model: CostModel) -> str:
    """`name:fingerprint()`, or the name alone for a model without a fingerprint."""
    fingerprint = getattr(model, "fingerprint", None)
    return f"{model.name}:{fingerprint()}" if callable(fingerprint) else model.name


def fingerprint_covers(model: CostModel) -> str:
    """What `model`'s fingerprint covers and why it would change (its `fingerprint_covers()`),
    for a study refused under another: a digest alone tells a user nothing."""
    covers = getattr(model, "fingerprint_covers", None)
    return str(covers()) if callable(covers) else f"what cost model {model.name!r} prices with"
