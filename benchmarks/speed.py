"""How fast the analytic model scores candidates, and how long one paper-space search takes.

1. A space of more than a million layouts (Llama-3 405B on 16,384 H100s): enumeration,
   rules, and the analytic model's `score` — candidates scored per second (median of 7
   after one untimed call; target ≥ 1,000,000 on a 2-core machine), in row blocks on all
   the cores this process may use, and again held to one core — then the whole `search()`
   on that space.
2. `search()` of the paper space for LLaMA 65B on 128 A100s (median of 20; target < 1 s).

    python benchmarks/speed.py
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import layoutsearch
from layoutsearch.api import resolve_cluster, resolve_model
from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.costs.blocks import block_bounds, usable_cores
from layoutsearch.rules import violations
from layoutsearch.space import SearchSpace
from layoutsearch.specs import Job

BIG_SPACE = SearchSpace(
    name="speed",
    tp=(1, 2, 4, 8, 16, 32, 64),
    pp=(1, 2, 4, 8, 16, 32, 64, 128),
    cp=(1, 2, 4, 8, 16),
    vp=(1, 2, 3, 4, 6),
    micro_batch_size=(1, 2, 4, 8, 16, 32),
    sequence_parallel=(False, True),
    attention=("torch", "fused", "flash1", "flash2", "flash3"),
    rmsnorm_kernel=(False, True),
    recompute=("none", "selective", "mlp", "full"),
    distributed_optimizer=(False, True),
)
BIG_JOB: dict[str, Any] = dict(model="llama3_405b", cluster="h100_sxm", num_gpus=16384,
                               seq_length=8192, global_batch_size=2048)


def big_job() -> Job:
    """The job of the big space, as `search()` builds it from BIG_JOB."""
    return Job(model=resolve_model(BIG_JOB["model"]), cluster=resolve_cluster(BIG_JOB["cluster"]),
               num_gpus=BIG_JOB["num_gpus"], seq_length=BIG_JOB["seq_length"],
               global_batch_size=BIG_JOB["global_batch_size"])


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls after one untimed call: the first call of a
    1.2M-row table pays the page faults of its arrays (2-4 s here against ~1 s after)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def on_one_core(run: Callable[[], float]) -> float | None:
    """`run()` held to one CPU core (the calling thread's affinity mask, which the threads
    it starts inherit: the analytic model reads it and prices in one block); None where the
    platform sets no affinity."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        return run()
    finally:
        os.sched_setaffinity(0, allowed)


def main() -> None:
    job = big_job()
    clusters = clusters_by_gpu()
    model = layoutsearch.build_cost_model("analytic")
    candidates = BIG_SPACE.candidates(job)
    rows = len(candidates)
    print(f"space: {BIG_SPACE.size():,} knob combinations, {rows:,} candidate rows "
          f"({BIG_JOB['model']} on {BIG_JOB['num_gpus']:,} {BIG_JOB['cluster']})")
    enumerate_s = median_seconds(lambda: BIG_SPACE.candidates(job), 3)
    rules_s = median_seconds(lambda: violations(candidates, clusters), 3)
    score_s = median_seconds(lambda: model.score(candidates, clusters), 7)
    print(f"enumerate {enumerate_s:.3f} s | rules {rules_s:.3f} s | analytic score "
          f"{score_s:.3f} s (median of 7)")
    cores = usable_cores()
    print(f"candidates scored per second: {rows / score_s:,.0f} (target ≥ 1,000,000), "
          f"in {len(block_bounds(rows, cores))} blocks on {cores} cores")
    one_core_s = on_one_core(lambda: median_seconds(lambda: model.score(candidates, clusters), 7))
    if one_core_s is not None:
        print(f"on one core: {rows / one_core_s:,.0f} candidates scored per second "
              f"({one_core_s:.3f} s, median of 7)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        search_s = median_seconds(lambda: layoutsearch.search(search_space=BIG_SPACE, **BIG_JOB), 3)
    print(f"whole search() on that space: {search_s:.2f} s (median of 3), "
          f"{rows / search_s:,.0f} candidates per second end to end")

    paper_job = dict(model="llama_65b", cluster="a100_80gb", num_gpus=128, seq_length=2048,
                     global_batch_size=2048, vocab_size=128000, search_space="paper")
    paper_rows = len(layoutsearch.search(**paper_job))
    paper_s = median_seconds(lambda: layoutsearch.search(**paper_job), 20)
    print(f"search() paper space, llama_65b on 128 a100_80gb: {paper_rows} candidates in "
          f"{1000 * paper_s:.1f} ms (median of 20; target < 1 s)")


if __name__ == "__main__":
    main()
