"""layoutsearch: which parallelization layout to use for a large language-model training run.

    import layoutsearch
    ranked = layoutsearch.search(model="llama_13b", cluster="a100_80gb", num_gpus=64,
                                 seq_length=2048, global_batch_size=2048, vocab_size=128000)
"""

from __future__ import annotations

from pathlib import Path

from pandas import DataFrame

from layoutsearch.api import NoLayoutFitsWarning, predict, search
from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.costs import AnalyticCostModel, CostModel, build_cost_model
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import Layout
from layoutsearch.measurements import read_measurements
from layoutsearch.results import TOP_K, job_of
from layoutsearch.space import SearchSpace
from layoutsearch.specs import ClusterSpec, GPUSpec, Job, ModelSpec


def report(result: DataFrame, out_dir: str | Path | None = None, *, top_k: int = TOP_K) -> Path:
    """Write `report.md` and its figures for a `search` result (see `reporting.report`).

    Imported on first use: the plotting stack costs a quarter of a second that a search in
    Python, or a launched fake Megatron-LM, should not pay.
    """
    from layoutsearch.reporting import report as write_report

    return write_report(result, out_dir, top_k=top_k)


__all__ = [
    "AnalyticCostModel",
    "ClusterSpec",
    "CostModel",
    "GPUSpec",
    "Job",
    "Layout",
    "LayoutSearchError",
    "ModelSpec",
    "NoLayoutFitsWarning",
    "SearchSpace",
    "build_cost_model",
    "job_of",
    "load_cluster",
    "load_model",
    "predict",
    "read_measurements",
    "report",
    "search",
]
