"""The paper driver applies the study's rules and prices only a handful of layouts."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import pandas as pd
import pytest

import layoutsearch
from layoutsearch.catalog import clusters_by_gpu, load_cluster, load_model
from layoutsearch.drivers import build_driver
from layoutsearch.drivers.paper import (
    RULE_COLUMN,
    PaperDriver,
    paper_choice,
    wants_sequence_parallel,
)
from layoutsearch.problem import SearchProblem
from layoutsearch.results import job_of, rank
from layoutsearch.space import SearchSpace
from layoutsearch.specs import ClusterSpec, Job

JOB_13B = dict(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048,
               vocab_size=128000)


class FakeCost:
    """Fits when tp·pp ≥ `min_model_parallel` and recompute is allowed; MFU grows with mb.

    Counts calls and rows so a test can check how little the rules price.
    """

    name = "fake"

    def __init__(self, min_model_parallel: int = 4, fits_recompute: tuple[str, ...] = (
            "none", "selective", "mlp", "full"), max_micro_batch: int = 8,
                 failed_micro_batch: int = 0) -> None:
        self.min_model_parallel = min_model_parallel
        self.fits_recompute = fits_recompute
        self.max_micro_batch = max_micro_batch
        self.failed_micro_batch = failed_micro_batch  # a launch that failed, not for memory
        self.calls = 0
        self.rows = 0

    def score(self, candidates: pd.DataFrame,
              clusters: Mapping[str, ClusterSpec]) -> pd.DataFrame:
        self.calls += 1
        self.rows += len(candidates)
        size = candidates["tp"] * candidates["pp"]
        fits = ((size >= self.min_model_parallel)
                & candidates["recompute"].isin(self.fits_recompute)
                & (candidates["micro_batch_size"] <= self.max_micro_batch))
        failed = candidates["micro_batch_size"] == self.failed_micro_batch
        mfu = 0.5 + 0.01 * candidates["micro_batch_size"] - 0.01 * np.log2(size)
        return pd.DataFrame({
            "step_time_s": 1.0 / mfu, "mfu": mfu, "tokens_per_s": 1000 * mfu,
            "peak_memory_gib": 100.0 / size, "fits": fits & ~failed,
            "headroom_gib": np.where(failed, np.nan, np.where(fits, 10.0, -5.0)),
            "cost_reason": np.where(failed, "measured error: NCCL",
                                    np.where(fits, "", "needs more memory")),
        }, index=candidates.index)


def problem(cost: FakeCost, space: SearchSpace | None = None) -> SearchProblem:
    job = Job(model=load_model("llama_13b"), cluster=load_cluster("a100_80gb"), num_gpus=64,
              seq_length=2048, global_batch_size=2048)
    return SearchProblem.build(job, space or SearchSpace.load("paper"), cost, clusters_by_gpu())


def pick(cost: FakeCost, space: SearchSpace | None = None) -> pd.Series:
    out = PaperDriver(progress=False).run(problem(cost, space))
    chosen = out[~out[RULE_COLUMN].str.startswith("passed over")]
    assert len(chosen) == 1
    # The pick is the fastest of the rows the rules priced that fit.
    assert chosen.iloc[0]["mfu"] == out.loc[out["fits"], "mfu"].max()
    return chosen.iloc[0]


def test_paper_is_a_registered_driver() -> None:
    assert isinstance(build_driver("paper"), PaperDriver)
    assert isinstance(build_driver({"name": "paper"}), PaperDriver)


def test_least_model_parallelism_that_fits_with_pipeline_before_tensor() -> None:
    cost = FakeCost(min_model_parallel=4, fits_recompute=("none",))
    row = pick(cost)
    # tp·pp = 4 is the least that fits; among tp1·pp4, tp2·pp2, tp4·pp1 the rules take pp4.
    assert (row["tp"], row["pp"], row["recompute"]) == (1, 4, "none")
    assert row["attention"] == "flash2" and row["rmsnorm_kernel"]
    assert "pipeline before tensor" in row[RULE_COLUMN]
    # One row per call, up to the first that fits: tp1·pp1, tp1·pp2, tp2·pp1, tp1·pp4
    # (not tp2·pp2 or tp4·pp1 after it), then micro-batches 2, 4 and 8 of tp1·pp4.
    assert cost.calls == cost.rows == 4 + 3


def test_micro_batch_is_raised_only_at_the_least_model_parallelism() -> None:
    cost = FakeCost(min_model_parallel=4, fits_recompute=("none",))
    row = pick(cost)
    # The fake model makes larger micro-batches faster, so the rules raise it at tp1 pp4.
    assert row["micro_batch_size"] == 8
    assert "micro-batch is raised" in row[RULE_COLUMN]


def test_micro_batches_past_the_first_out_of_memory_are_not_priced() -> None:
    cost = FakeCost(min_model_parallel=4, fits_recompute=("none",), max_micro_batch=2)
    out = PaperDriver(progress=False).run(problem(cost))
    # A measured search would launch each: micro-batch 4 runs out of memory, so 8 would too.
    assert sorted(out.loc[out["tp"] * out["pp"] == 4, "micro_batch_size"]) == [1, 2, 4]
    assert pick(cost)["micro_batch_size"] == 2


def test_a_micro_batch_that_failed_for_another_reason_does_not_stop_the_larger_ones() -> None:
    # Micro-batch 2 failed to launch (say NCCL): that says nothing of 4 and 8, which run.
    cost = FakeCost(min_model_parallel=4, fits_recompute=("none",), failed_micro_batch=2)
    out = PaperDriver(progress=False).run(problem(cost))
    assert sorted(out.loc[out["tp"] * out["pp"] == 4, "micro_batch_size"]) == [1, 2, 4, 8]
    assert pick(cost)["micro_batch_size"] == 8


def test_a_micro_batch_the_rules_reject_does_not_stop_the_larger_ones() -> None:
    # dp 8 and a global batch of 24: micro-batch 2 does not divide the 3 sequences per
    # replica, micro-batch 3 does.
    ranked = layoutsearch.search(model="llama_7b", num_gpus=8, seq_length=1024,
                                 global_batch_size=24, micro_batch_size=[1, 2, 3],
                                 driver="paper")
    assert ranked.iloc[0]["micro_batch_size"] == 3
    assert "micro-batch is raised to 3" in ranked.iloc[0][RULE_COLUMN]


def test_every_layout_priced_is_in_the_answer_and_the_pick_ranks_first() -> None:
    cost = FakeCost(min_model_parallel=4, fits_recompute=("none",))
    out = PaperDriver(progress=False).run(problem(cost))
    assert len(out) == cost.rows
    slower = out[out["fits"] & out[RULE_COLUMN].str.startswith("passed over")]
    assert sorted(slower["micro_batch_size"]) == [1, 2, 4]
    assert (slower[RULE_COLUMN] == "passed over by the rules: fits, no faster than the pick").all()
    ranked = rank(out)
    assert ranked.iloc[0]["micro_batch_size"] == 8
    assert "micro-batch is raised" in ranked.iloc[0][RULE_COLUMN]


def test_falls_back_to_mlp_recompute_before_full() -> None:
    space = SearchSpace.load("paper").pin(recompute=["none", "mlp", "full"])
    cost = FakeCost(min_model_parallel=1, fits_recompute=("mlp", "full"))
    row = pick(cost, space)
    assert row["fits"] and row["recompute"] == "mlp"
    assert (row["tp"], row["pp"]) == (1, 1)
    assert "no model-parallel size fits without checkpointing" in row[RULE_COLUMN]


def test_nothing_fits_gives_rows_with_reasons() -> None:
    cost = FakeCost(min_model_parallel=10_000)
    out = PaperDriver(progress=False).run(problem(cost))
    assert not out["fits"].any()
    assert out[RULE_COLUMN].str.startswith("nothing fits").all()


def test_sequence_parallel_rule() -> None:
    small = Job(model=load_model("llama_13b"), cluster=load_cluster("a100_80gb"),
                num_gpus=64, seq_length=2048, global_batch_size=2048)
    assert not wants_sequence_parallel(small)
    assert wants_sequence_parallel(Job(model=small.model, cluster=small.cluster, num_gpus=64,
                                       seq_length=8192, global_batch_size=512))
    assert wants_sequence_parallel(Job(model=load_model("llama_65b"), cluster=small.cluster,
                                       num_gpus=64, seq_length=2048, global_batch_size=2048))


def test_with_the_analytic_model_the_pick_follows_the_rules_and_is_reproducible() -> None:
    paper = layoutsearch.search(driver="paper", **JOB_13B)
    grid = layoutsearch.search(**JOB_13B)
    pick = paper.iloc[0]
    # The study's kernels: FlashAttention 2 with the RMSNorm kernel.
    assert pick["fits"] and pick["attention"] == "flash2" and pick["rmsnorm_kernel"]
    fitting = grid[grid["fits"] & (grid["micro_batch_size"] == 1) & (grid["recompute"] == "none")
                   & (grid["attention"] == "flash2") & grid["rmsnorm_kernel"]]
    assert int(pick["tp"] * pick["pp"]) == int((fitting["tp"] * fitting["pp"]).min())
    # Replaying the rules on the grid's scored table picks the same layout.
    job = job_of(grid, "test")
    replay = paper_choice(grid, job, lambda rows: grid.loc[rows.index]).row
    assert replay is not None
    for knob in ("tp", "pp", "micro_batch_size", "sequence_parallel", "recompute"):
        assert replay[knob] == pick[knob]
    assert pick["mfu"] == pytest.approx(replay["mfu"])


def test_rules_over_rows_without_the_study_settings_pick_nothing_and_say_why() -> None:
    # An optuna search returns only the rows it evaluated; they may hold no mb1 /
    # flash2 + RMSNorm / no-recompute row at all. The rules then pick nothing, without error.
    ranked = layoutsearch.search(**JOB_13B, micro_batch_size=[2, 4])
    choice = paper_choice(ranked, job_of(ranked, "test"), lambda rows: ranked.loc[rows.index])
    assert choice.chosen is None
    assert choice.priced.empty


def test_when_nothing_the_rules_pick_fits_the_message_points_to_the_grid() -> None:
    # The study's rules price 40 of 2240 layouts; a 65B job on 8 GPUs fits none of them.
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        ranked = layoutsearch.search(driver="paper", model="llama_65b", num_gpus=8,
                                     seq_length=2048, global_batch_size=64)
    assert ranked.attrs["message"].startswith(
        f"none of the {len(ranked)} layouts the paper driver evaluated (of 2240 in the space) "
        "fits; price every layout with driver=grid. Among those evaluated: no layout fits")


@pytest.mark.parametrize("pins, missing", [
    ({"micro_batch_size": [2, 4]}, "add micro_batch_size 1, or search"),
    ({"search_space": "default", "recompute": ["selective"]},
     "add a recompute of none, mlp or full, or search"),
])
def test_a_space_without_the_rules_settings_is_refused_by_name(pins, missing) -> None:
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=r"driver=paper: no candidate has the settings the study's rules "
                             r"pick \(micro-batch 1 with recompute none, mlp or full\); the "
                             r"space offers micro_batch_size .*" + re.escape(missing)):
        layoutsearch.search(model="llama_7b", num_gpus=16, seq_length=2048,
                            global_batch_size=256, driver="paper", **pins)


def test_a_layernorm_model_gets_a_pick_without_the_rmsnorm_kernel() -> None:
    # GPT-3 uses LayerNorm, for which the rules reject the fused RMSNorm kernel.
    ranked = layoutsearch.search(driver="paper", model="gpt3_175b", num_gpus=1024,
                                 seq_length=2048, global_batch_size=1536)
    pick = ranked.iloc[0]
    assert pick["fits"] and not pick["rmsnorm_kernel"] and pick["attention"] == "flash2"


@pytest.mark.parametrize("overlap", [[False, True], [True, False]])
def test_a_space_with_both_overlap_settings_prices_each_size_once(overlap) -> None:
    # As the study ran: --overlap-grad-reduce off (Megatron-LM's default). With both values
    # in the space the rules priced each tp·pp twice, and the pick's overlap (and so its
    # MFU) followed the order of the space's list.
    cost = FakeCost(min_model_parallel=4, fits_recompute=("none",))
    row = pick(cost, SearchSpace.load("paper").pin(overlap_grad_reduce=overlap))
    assert not row["overlap_grad_reduce"]
    # tp1·pp1, tp1·pp2, tp2·pp1, tp1·pp4, then micro-batches 2, 4 and 8 of tp1·pp4.
    assert cost.calls == cost.rows == 4 + 3
