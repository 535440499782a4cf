"""The study's rules checked on a result: verdicts and the comparison with the rules' pick."""

from __future__ import annotations

import pandas as pd
import pytest

import layoutsearch
from layoutsearch.reporting.explain import compare, label, why_rejected
from layoutsearch.reporting.study_rules import RuleVerdict, check_study_rules
from layoutsearch.results import job_of

JOB = dict(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048,
           vocab_size=128000)


@pytest.fixture(scope="module")
def ranked() -> pd.DataFrame:
    return layoutsearch.search(**JOB)


def _verdict(rows: pd.DataFrame, rule: str, job_from: pd.DataFrame | None = None) -> RuleVerdict:
    """The study-rules check's verdict on `rule` for `rows`, the job read from `job_from`
    (by default `rows` itself)."""
    check = check_study_rules(rows, job_of(rows if job_from is None else job_from, "test"))
    assert check is not None
    return next(v for v in check.verdicts if v.rule == rule)


def test_the_rules_pick_replayed_on_the_grid_equals_the_paper_driver(ranked: pd.DataFrame) -> None:
    check = check_study_rules(ranked, job_of(ranked, "test"))
    assert check is not None and check.paper is not None
    pick = layoutsearch.search(driver="paper", **JOB).iloc[0]
    for knob in ("tp", "pp", "micro_batch_size", "recompute", "attention", "sequence_parallel"):
        assert check.paper[knob] == pick[knob]
    assert check.gap_points == pytest.approx(100 * (ranked["mfu"].iloc[0] - pick["mfu"]))
    rules = {v.rule: v for v in check.verdicts}
    assert "micro-batch 1" in rules
    best = ranked.iloc[0]
    assert rules["micro-batch 1"].follows == (best["micro_batch_size"] == 1)
    assert rules["FlashAttention 2 with the RMSNorm kernel"].follows == (
        best["attention"] == "flash2" and bool(best["rmsnorm_kernel"]))


def test_a_departure_is_explained_by_the_layout_the_rule_prefers(ranked: pd.DataFrame) -> None:
    # Put a full-recompute layout on top: the check must say it departs and why.
    idx = ranked.index[ranked["fits"] & (ranked["recompute"] == "full")][0]
    reordered = pd.concat([ranked.loc[[idx]], ranked.drop(index=idx)])
    check = check_study_rules(reordered, job_of(ranked, "test"))
    assert check is not None
    verdict = next(v for v in check.verdicts if v.rule.startswith("prefer model parallelism"))
    assert verdict.follows is False
    assert "recompute=full; without it:" in verdict.detail


def test_compare_names_the_component_that_costs_the_most() -> None:
    base = {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "vp": 1, "micro_batch_size": 1,
            "sequence_parallel": False, "attention": "flash2", "rmsnorm_kernel": True,
            "recompute": "none", "distributed_optimizer": True, "fits": True, "reason": ""}
    winner = pd.Series({**base, "mfu": 0.6, "step_time_s": 10.0, "time_gemm_s": 9.0,
                        "time_bubble_s": 1.0})
    loser = pd.Series({**base, "pp": 4, "mfu": 0.5, "step_time_s": 12.0, "time_gemm_s": 9.0,
                       "time_bubble_s": 3.0})
    text = compare(winner, loser)
    assert "10.0 points lower" in text
    assert "the pipeline bubble takes 25 % of its step vs 10 % (+2.00 s)" in text
    broken = pd.Series({**base, "fits": False, "reason": "needs 95 GiB > 80 GiB"})
    assert compare(winner, broken).endswith("does not fit: needs 95 GiB > 80 GiB")


def test_why_rejected_covers_each_varied_knob(ranked: pd.DataFrame) -> None:
    lines = why_rejected(ranked)
    titles = [line.split("**")[1] for line in lines]
    assert titles == ["model parallelism (tp, pp)", "micro-batch size",
                      "activation recomputation", "attention kernel", "RMSNorm kernel",
                      "sequence parallelism"]


def test_context_parallelism_counts_as_model_parallelism(ranked: pd.DataFrame) -> None:
    # A replica spans tp·pp·cp GPUs: a tp1 pp1 layout with cp 2 on top spans twice the
    # rules' pick (tp1 pp1, cp 1).
    fitting = ranked["fits"].astype(bool) & (ranked["tp"] == 1) & (ranked["pp"] == 1)
    idx = ranked.index[fitting][1]
    with_cp = ranked.assign(cp=1)
    with_cp.loc[idx, "cp"] = 2
    check = check_study_rules(pd.concat([with_cp.loc[[idx]], with_cp.drop(index=idx)]),
                              job_of(ranked, "test"))
    assert check is not None and check.paper is not None and check.paper.name != idx
    verdict = {v.rule: v for v in check.verdicts}["the least model parallelism that fits"]
    assert verdict.follows is False and verdict.detail.startswith("tp·pp·cp=2, but tp·pp·cp=1")


def test_pipeline_before_tensor_compares_splits_of_the_same_tp_pp_under_context_parallelism(
) -> None:
    # tp2 pp4 cp4 wins; its pipeline-heavier split of tp·pp = 8 is tp1 pp8 (cp4), which does
    # not fit: the rule is followed. tp2 pp16, four times the model parallelism, is not the
    # same split and must not be named as the rule's alternative.
    ranked = layoutsearch.search(
        model="llama3_70b", cluster="h100_sxm", num_gpus=512, seq_length=8192,
        global_batch_size=1024, search_space="default", cp=[4], tp=[1, 2], pp=[4, 8, 16],
        attention=["flash3"], recompute=["none"], vp=[1])
    best = ranked.iloc[0]
    assert (best["tp"], best["pp"], best["cp"]) == (2, 4, 4)
    assert not ranked[(ranked["tp"] == 1) & (ranked["pp"] == 8)]["fits"].any()
    verdict = _verdict(ranked, "pipeline before tensor parallelism")
    assert (verdict.follows, verdict.detail) == (True, "tp2 pp4")


def test_pipeline_before_tensor_weighs_the_tp1_split_without_sequence_parallelism(
        ranked: pd.DataFrame) -> None:
    # A tp2 sp layout on top: its pipeline-heavier split is tp1 pp2, which has no sequence
    # parallelism, fits and loses; the rule is departed from, naming it.
    idx = ranked.index[ranked["fits"] & (ranked["tp"] == 2) & (ranked["pp"] == 1)
                       & ranked["sequence_parallel"]][0]
    verdict = _verdict(pd.concat([ranked.loc[[idx]], ranked.drop(index=idx)]),
                       "pipeline before tensor parallelism", job_from=ranked)
    assert verdict.follows is False
    assert "more pipeline stages lose: tp1 pp2 dp32" in verdict.detail


def test_a_layernorm_model_follows_the_kernel_rule_with_flash2_alone() -> None:
    # GPT-3 uses LayerNorm: the fused RMSNorm kernel is not for it, so flash2 without the
    # kernel follows the rule, and the rule's alternative is not a layout no rule lets run.
    ranked = layoutsearch.search(model="gpt3_175b", num_gpus=1024, seq_length=2048,
                                 global_batch_size=1536,
                                 tp=[4], pp=[16], recompute=["none"], micro_batch_size=[1])
    best = ranked.iloc[0]
    assert (best["attention"], bool(best["rmsnorm_kernel"])) == ("flash2", False)
    verdict = _verdict(ranked, "FlashAttention 2 with the RMSNorm kernel")
    assert verdict.follows is True
    assert "does not apply to a LayerNorm model" in verdict.detail
    assert "was not priced" not in verdict.detail
    fused = pd.concat([ranked[ranked["attention"] == "fused"].head(1),
                       ranked[ranked["attention"] != "fused"]])
    verdict = _verdict(fused, "FlashAttention 2 with the RMSNorm kernel", job_from=ranked)
    assert verdict.follows is False
    assert "; with them: tp4 pp16 dp16 mb1 sp flash2 recompute=none reaches" in verdict.detail


def test_rules_judged_on_a_sample_say_so(ranked: pd.DataFrame) -> None:
    # An optuna search's rows, or a selection, may leave out the layout the rules would take
    # on the whole space (here tp1 pp1): "the rules pick the best layout" is of the rows.
    sample = ranked[ranked["pp"] == 4]
    check = check_study_rules(sample, job_of(ranked, "test"))
    assert check is not None
    assert check.summary == (f"the study's rules pick the best layout, "
                             f"{label(sample.iloc[0])} "
                             f"(judged on the {len(sample)} of the space's 2240 layouts these "
                             f"rows hold)")
    whole = check_study_rules(ranked, job_of(ranked, "test"))
    assert whole is not None and "judged on" not in whole.summary


def test_compare_says_a_layout_whose_runs_failed_did_not_run() -> None:
    # A replay's out-of-memory run has no MFU, like an unmeasured layout, but it was tried.
    base = {"tp": 1, "pp": 1, "dp": 64, "cp": 1, "vp": 1, "micro_batch_size": 2,
            "sequence_parallel": False, "attention": "flash2", "rmsnorm_kernel": True,
            "recompute": "none", "distributed_optimizer": True, "mfu": float("nan"),
            "step_time_s": float("nan"), "fits": False}
    winner = pd.Series({**base, "micro_batch_size": 1, "mfu": 0.7, "step_time_s": 26.5,
                        "fits": True, "reason": ""})
    oom = pd.Series({**base, "reason": "measured: out of memory"})
    assert compare(winner, oom).endswith("mb2 flash2+rmsnorm recompute=none did not run: "
                                         "measured: out of memory")
    unmeasured = pd.Series({**base, "reason": "unmeasured: no measurement of this layout"})
    assert " was not priced: unmeasured: " in compare(winner, unmeasured)
