"""Scored tables for the tests of rankings, their notes and the no-fit message: rows of
chosen layouts and prices for one catalog job."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.layout import Layout
from layoutsearch.specs import Job

JOB = Job(model=load_model("llama_13b"), cluster=load_cluster("a100_80gb"), num_gpus=64,
          seq_length=2048, global_batch_size=2048)


def scored(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows of a scored table; each row gives some layout knobs and its prices."""
    records = []
    for row in rows:
        knobs = {k: v for k, v in row.items() if k in Layout.__dataclass_fields__}
        prices = {"mfu": np.nan, "step_time_s": np.nan, "tokens_per_s": np.nan,
                  "peak_memory_gib": np.nan, "fits": False, "reason": ""}
        prices.update({k: v for k, v in row.items() if k not in knobs})
        records.append({**JOB.columns(), **prices, **Layout(**knobs).to_dict(), "extra": "kept"})
    return pd.DataFrame(records)


def assert_pareto_marks(ranked: pd.DataFrame) -> None:
    """`pareto` is True exactly on the rows that fit and that no fitting row beats in MFU
    and peak memory both (at least as good in each, better in one)."""
    feasible = ranked[ranked["fits"]]
    for _, row in feasible.iterrows():
        dominated = ((feasible["mfu"] >= row["mfu"])
                     & (feasible["peak_memory_gib"] <= row["peak_memory_gib"])
                     & ((feasible["mfu"] > row["mfu"])
                        | (feasible["peak_memory_gib"] < row["peak_memory_gib"]))).any()
        assert row["pareto"] == (not dominated)
