"""Builders for cost-model tests: candidate tables of chosen layouts for a catalog job."""

from __future__ import annotations

from typing import Any

import pandas as pd

from layoutsearch.catalog import clusters_by_gpu, load_cluster, load_model
from layoutsearch.costs import build_cost_model
from layoutsearch.costs.shapes import LayerShape, Shapes
from layoutsearch.space import SearchSpace
from layoutsearch.specs import Job

LAYOUT_DEFAULTS: dict[str, Any] = dict(
    tp=1, pp=1, cp=1, vp=1, micro_batch_size=1, sequence_parallel=False, attention="flash2",
    rmsnorm_kernel=True, recompute="none", distributed_optimizer=True, overlap_grad_reduce=False,
)


def table(model: str = "llama_13b", cluster: str = "a100_80gb", num_gpus: int = 64,
          seq_length: int = 2048, global_batch_size: int = 2048,
          model_fields: dict[str, Any] | None = None, **layout: Any) -> pd.DataFrame:
    """One candidate row per combination of the given knob values (lists allowed)."""
    job = Job(model=load_model(model, **(model_fields or {})), cluster=load_cluster(cluster),
              num_gpus=num_gpus, seq_length=seq_length, global_batch_size=global_batch_size)
    knobs = {**LAYOUT_DEFAULTS, **layout}
    space = SearchSpace(**{k: v if isinstance(v, list | tuple) else (v,) for k, v in knobs.items()})
    return space.candidates(job)


def shapes(**kwargs: Any) -> Shapes:
    return Shapes.of(table(**kwargs), clusters_by_gpu())


def layer_shape(**kwargs: Any) -> LayerShape:
    return shapes(**kwargs).layer


def score(**kwargs: Any) -> pd.DataFrame:
    candidates = table(**kwargs)
    scored = build_cost_model("analytic").score(candidates, clusters_by_gpu())
    return candidates.join(scored)
