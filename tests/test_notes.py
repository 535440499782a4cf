"""The notes a ranking carries about its best layout: tight memory, a close call, a capped
batch, the MFU convention at long context, a slow fabric, constants not fitted to the GPU."""

from __future__ import annotations

import re

import pandas as pd
import pytest

import layoutsearch
from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.costs import AnalyticCostModel
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import Layout
from layoutsearch.notes import (
    batch_note,
    cap_raising_batch,
    close_call_note,
    constants_note,
    fabric_note,
    headroom_note,
    mfu_convention_note,
)
from layoutsearch.results import rank
from layoutsearch.specs import Job
from tests.rankings import scored


def test_a_global_batch_that_caps_data_parallelism_is_named() -> None:
    # dp divides both the batch and the GPUs: 1000 and 64 share 8, so a 13B job that runs
    # best at dp 16 with 1008 is pushed into tp·pp = 8.
    capped = layoutsearch.search(model="llama_13b", num_gpus=64, seq_length=2048,
                                 global_batch_size=1000)
    assert capped.loc[0, "dp"] == 8
    lifted = layoutsearch.search(model="llama_13b", num_gpus=64, seq_length=2048,
                                 global_batch_size=1008)
    best = Layout.from_row(lifted.iloc[0].to_dict())
    assert best.dp == 16
    assert capped.attrs["batch_note"] == (
        "global_batch_size=1000 caps data parallelism at dp=8: dp must divide the global "
        "batch and the 64 GPUs, and 8 is the largest that divides both. The best layout sits "
        "at that cap, so the rest of the GPUs go to model parallelism. With a global batch "
        f"of 1008 dp may reach 16, and the best layout would be {best.describe()}, MFU "
        f"{lifted.loc[0, 'mfu']:.3f} against {capped.loc[0, 'mfu']:.3f} here.")
    free = layoutsearch.search(model="llama_13b", num_gpus=64, seq_length=2048,
                               global_batch_size=1024)
    assert free.loc[0, "dp"] > 8 and free.attrs["batch_note"] == ""
    assert free.loc[0, "mfu"] > capped.loc[0, "mfu"] + 0.05


def test_no_batch_note_when_memory_forces_model_parallelism() -> None:
    # 70B at 4k on 64 GPUs: no layout that fits has dp > 8 at any batch, so the batch's
    # cap of 8 holds nothing back.
    for gpus, model in ((64, "llama3_70b"), (1024, "llama3_405b")):
        ranked = layoutsearch.search(model=model, num_gpus=gpus, seq_length=4096,
                                     global_batch_size=1000)
        assert ranked.loc[0, "dp"] == 8 and ranked.attrs["batch_note"] == ""


def test_the_suggested_batch_is_the_nearest_that_lifts_the_cap() -> None:
    def job(batch: int, gpus: int) -> Job:
        return Job(model=load_model("llama_13b"), cluster=load_cluster("a100_80gb"),
                   num_gpus=gpus, seq_length=2048, global_batch_size=batch)
    assert cap_raising_batch(job(1536, 16384)) == 2048  # not 16384
    assert cap_raising_batch(job(1000, 64)) == 1008
    assert cap_raising_batch(job(2047, 64)) == 2048
    assert cap_raising_batch(job(3, 64)) == 4  # as near as 2: the larger


def test_a_batch_note_without_a_check_of_its_suggestion_is_not_given() -> None:
    ranked = rank(scored([{"tp": 8, "mfu": 0.5, "fits": True}]))  # dp 8 of JOB's 64 GPUs
    capped = Job(model=load_model("llama_13b"), cluster=load_cluster("a100_80gb"),
                 num_gpus=64, seq_length=2048, global_batch_size=1000)
    assert batch_note(ranked, capped) == ""
    still_8 = rank(scored([{"tp": 8, "mfu": 0.6, "fits": True}]))
    assert batch_note(ranked, capped, lambda batch: still_8) == ""


def test_a_tight_best_layout_names_the_best_one_with_room() -> None:
    ranked = rank(scored([
        {"tp": 1, "mfu": 0.60, "fits": True, "headroom_gib": 0.5},
        {"tp": 2, "mfu": 0.58, "fits": True, "headroom_gib": 3.0},
        {"tp": 4, "mfu": 0.55, "fits": True, "headroom_gib": 12.0},
    ]))
    note = headroom_note(ranked)
    # The study's figures, by kernel (tests/costs/test_analytic.py checks them on its runs).
    assert note.startswith("the best layout leaves 0.5 GiB of GPU memory free; on the study's "
                           "runs every FlashAttention layout predicted to fit that ran out of "
                           "memory had less than 5 GiB free by the prediction, so it may run "
                           "out of memory.")
    assert note.endswith("The best with that much free for its kernel: tp4 pp1 dp1 mb1 flash2 "
                         "recompute=none, MFU 0.550 (5.0 points lower, 12.0 GiB free).")


def test_the_headroom_a_fused_or_torch_layout_needs_is_what_theirs_ran_out_with() -> None:
    # On the study's runs a fused layout predicted to fit ran out of memory with 12.6 GiB
    # free: 9 GiB is no margin for it, though it would be for FlashAttention; the roomier
    # alternative must clear its own kernel's margin (the torch row's 11 GiB does not).
    ranked = rank(scored([
        {"tp": 1, "mfu": 0.60, "fits": True, "headroom_gib": 9.0, "attention": "fused"},
        {"tp": 2, "mfu": 0.58, "fits": True, "headroom_gib": 11.0, "attention": "torch"},
        {"tp": 4, "mfu": 0.55, "fits": True, "headroom_gib": 6.0, "attention": "flash2"},
    ]))
    note = headroom_note(ranked)
    assert note.startswith("the best layout leaves 9.0 GiB of GPU memory free; on the study's "
                           "runs every layout with the fused or torch attention kernel "
                           "predicted to fit that ran out of memory had less than 13 GiB free")
    assert "with that much free for its kernel: tp4 pp1 dp1 mb1 flash2" in note
    flash = rank(scored([{"tp": 1, "mfu": 0.6, "fits": True, "headroom_gib": 9.0}]))
    assert headroom_note(flash) == ""


def test_no_headroom_note_with_room_or_without_a_memory_estimate() -> None:
    roomy = rank(scored([{"tp": 1, "mfu": 0.6, "fits": True, "headroom_gib": 5.0}]))
    assert headroom_note(roomy) == ""
    assert headroom_note(rank(scored([{"tp": 1, "mfu": 0.6, "fits": True}]))) == ""
    tight = rank(scored([{"tp": 1, "mfu": 0.6, "fits": True, "headroom_gib": 1.0}]))
    assert headroom_note(tight).endswith("No layout that fits leaves that much for its kernel.")


def test_the_headroom_note_of_a_sampling_driver_speaks_for_the_rows_it_priced() -> None:
    # driver=paper or optuna returns the layouts it priced: "no layout leaves 5 GiB" would
    # speak for the whole space, where the grid may find one.
    tight = rank(scored([{"tp": 1, "mfu": 0.6, "fits": True, "headroom_gib": 1.0}]))
    tight.attrs["space_size"] = 2240
    assert headroom_note(tight).endswith(
        "Of the layouts this driver priced (1), none that fits leaves that much for its "
        "kernel; driver=grid prices every layout.")
    tight = rank(scored([{"tp": 1, "mfu": 0.6, "fits": True, "headroom_gib": 1.0},
                         {"tp": 2, "mfu": 0.5, "fits": True, "headroom_gib": 9.0}]))
    tight.attrs["space_size"] = 2240
    assert ("The best this driver priced with that much free for its kernel: tp2"
            in headroom_note(tight))


def test_runners_up_within_5_percent_are_a_close_call() -> None:
    ranked = rank(scored([
        {"tp": 1, "mfu": 0.600, "fits": True},
        {"tp": 2, "mfu": 0.585, "fits": True},                 # 2.5 % below: close
        {"tp": 4, "mfu": 0.700, "fits": False},                # does not fit: not counted
        {"tp": 8, "mfu": 0.560, "fits": True},                 # 6.7 % below: not close
    ]))
    note = close_call_note(ranked)
    assert note.startswith("1 other layout is within 5 % of the best's predicted MFU (the "
                           "next: tp2 pp1 dp1 mb1 flash2 recompute=none, MFU 0.585)")
    assert note.endswith("Measure the top 2 before committing: cost_models=measured "
                         "cost_models.prescreen=analytic cost_models.top_k=2 "
                         "cost_models.launcher=slurm.")


def test_a_close_call_suggests_at_most_eight_trials() -> None:
    ranked = rank(scored([{"tp": 1, "mfu": 0.6 - 0.001 * i, "fits": True}
                          for i in range(12)]))
    assert close_call_note(ranked).startswith("11 other layouts are within 5 %")
    assert "Measure the top 8 (the best 8 of 12: a tie-break, not a sweep) before" \
        in close_call_note(ranked)
    assert close_call_note(ranked).endswith("cost_models.top_k=8 cost_models.launcher=slurm.")


def test_no_close_call_note_with_a_clear_winner_or_nothing_fitting() -> None:
    clear = rank(scored([{"tp": 1, "mfu": 0.6, "fits": True}, {"tp": 2, "mfu": 0.5, "fits": True}]))
    assert close_call_note(clear) == ""
    assert close_call_note(rank(scored([{"tp": 1, "mfu": 0.6}, {"tp": 2, "mfu": 0.6}]))) == ""


def test_long_context_mfu_is_read_by_both_conventions() -> None:
    job = Job(model=load_model("llama3_8b"), cluster=load_cluster("h100_sxm"), num_gpus=128,
              seq_length=524_288, global_batch_size=16)
    ranked = pd.DataFrame({"mfu": [1.05], "fits": [True]})
    note = mfu_convention_note(ranked, job)
    # Llama 3 8B: N = 8,030,261,248 (tests/test_specs.py), L = 32, h = 4096, s = 524,288.
    # The study counts 6N + 12·L·h·s = 48,181,567,488 + 824,633,720,832 = 872,815,288,320
    # FLOPs per token; the masked half, 6·L·h·s = 412,316,860,416, is 47 % of it.
    assert "that half is 47 % of the FLOPs counted" in note
    # Megatron-LM's count, 3 x forward per matmul (tests/test_specs.py), with 8 K/V groups
    # of 128 and a 128,256 vocabulary: per layer Q, K, V, O 2·(2·4096² + 2·4096·1024) =
    # 83,886,080, SwiGLU 6·4096·14,336 = 352,321,536, causal scores 2·s·h = 4,294,967,296;
    # logits 2·4096·128,256 = 1,050,673,152: 3·(32·4,731,174,912 + 1,050,673,152) =
    # 457,344,811,008. An MFU of 1.05 by the study is 1.05 x 457.34 / 872.82 = 0.5502.
    assert "the best layout's MFU is 0.550" in note
    assert "(the best layout's is 1.050)" in note
    # At 2k tokens the two counts differ by a few per cent: nothing to say.
    short = Job(model=load_model("llama3_8b"), cluster=load_cluster("h100_sxm"), num_gpus=128,
                seq_length=2048, global_batch_size=1024)
    assert mfu_convention_note(ranked.assign(mfu=0.5), short) == ""


def _best(network_s: float, num_gpus: int = 64, dp: int = 64) -> pd.DataFrame:
    return pd.DataFrame({"fits": [True], "step_time_s": [20.0], "time_dp_comm_s": [network_s],
                         "time_pp_comm_s": [0.0], "gpu": ["a100_80gb"], "num_gpus": [num_gpus],
                         "gpus_per_node": [8], "tp": [1], "cp": [1], "dp": [dp]})


def test_a_slow_fabric_is_named_when_its_traffic_matters() -> None:
    note = fabric_note(_best(3.0), 0.053, lambda: "cost_models=analytic")
    assert note.startswith("cost_models=analytic prices inter-node traffic on a100_80gb at 5 % "
                           "of the NICs' rate (network_efficiency 0.053")
    assert "3.00 s of the best layout's 20.00 s step" in note
    assert "cost_models=analytic_prior" in note
    assert fabric_note(_best(3.0), 0.8, lambda: "x") == ""            # a fabric at nccl-tests' rate
    assert fabric_note(_best(0.5), 0.053, lambda: "x") == ""          # 2.5 % of the step
    assert fabric_note(_best(3.0, num_gpus=8), 0.053, lambda: "x") == ""  # one node: NVLink only
    # 16 GPUs in two pipeline stages of dp 8: each data-parallel group is one node's NVLink.
    assert fabric_note(_best(3.0, num_gpus=16, dp=8), 0.053, lambda: "x") == ""


def test_constants_not_fitted_to_the_gpu_kind_are_named() -> None:
    # The shipped constants were fitted to the study's A100 80GB runs only (their
    # provenance.gpus); the H100's are a-priori, and a ranking on it says so.
    job = {"model": "llama_7b", "num_gpus": 8, "seq_length": 2048, "global_batch_size": 256,
           "search_space": "paper"}
    h100 = layoutsearch.search(**job, cluster="h100_sxm").attrs["constants_note"]
    assert h100.startswith("cost_models=analytic was not fitted to measured runs of h100_sxm "
                           "(fitted: a100_80gb): its h100_sxm constants come from datasheets")
    # One node: the measured search it suggests runs on the local launcher, with flash3,
    # which the study's space lacks and Hopper runs for its flash2 layouts.
    assert h100.endswith("measure the best layouts (cost_models=measured "
                         "cost_models.prescreen=analytic cost_models.top_k=8 "
                         "search_spaces.attention=[torch,fused,flash1,flash2,flash3]) or fit "
                         "the constants to a few runs of your cluster (layoutsearch-calibrate).")
    assert layoutsearch.search(**job, cluster="a100_80gb").attrs["constants_note"] == ""
    prior = layoutsearch.search(**job, cluster="a100_80gb", cost_model="analytic_prior")
    # A-priori constants borrow from no fit, and the note claims none.
    assert prior.attrs["constants_note"].startswith(
        "cost_models=analytic_prior was not fitted to measured runs of a100_80gb (fitted to "
        "no GPU kind's runs): its a100_80gb constants come from datasheets, published kernel "
        "and NCCL figures (its file says which), so the MFU")


def test_the_constants_note_needs_the_fitted_kinds_and_names_slurm_beyond_a_node() -> None:
    best = pd.DataFrame({"num_gpus": [64], "gpus_per_node": [8]})
    note = constants_note(best, "h200", frozenset({"a100_80gb"}), lambda: "analytic")
    assert ("(cost_models=measured cost_models.prescreen=analytic cost_models.top_k=8 "
            "cost_models.launcher=slurm)") in note
    assert constants_note(best, "h200", None, lambda: "x") == ""      # the file does not say
    assert constants_note(best, "h200", frozenset({"h200"}), lambda: "x") == ""  # fitted to it


def test_provenance_gpus_is_read_and_checked() -> None:
    assert AnalyticCostModel.load("analytic").fitted == frozenset({"a100_80gb"})
    assert AnalyticCostModel.load("analytic_prior").fitted == frozenset()
    config = {"gpus": {"a100_80gb": AnalyticCostModel.load().constants["a100_80gb"].to_dict()}}
    assert AnalyticCostModel.from_config(config).fitted is None
    with pytest.raises(LayoutSearchError, match=r"mine.yaml: provenance.gpus='a100_80gb': must "
                       r"be a list of the GPU kinds whose constants were fitted"):
        AnalyticCostModel.from_config({**config, "provenance": {"gpus": "a100_80gb"}},
                                      source="mine.yaml")
    with pytest.raises(LayoutSearchError, match=re.escape(
            "mine.yaml: provenance.gpus names 'a100_80g', which the file has no constants "
            "for; its GPU kinds: a100_80gb")):
        AnalyticCostModel.from_config({**config, "provenance": {"gpus": ["a100_80g"]}},
                                      source="mine.yaml")


def test_a_suggested_measured_search_on_hopper_adds_flash3_where_the_space_lacks_it() -> None:
    # On H100 a flash2 layout's command runs FlashAttention 3, so a measured search passes it
    # over: in the study's space (no flash3) the suggested one would measure no FlashAttention.
    job = dict(model="llama3_8b", cluster="h100_sxm", num_gpus=16, seq_length=8192,
               global_batch_size=128)
    paper = layoutsearch.search(**job)
    assert ("cost_models.launcher=slurm search_spaces.attention=[torch,fused,flash1,flash2,"
            "flash3]) or fit") in paper.attrs["constants_note"]
    default = layoutsearch.search(**job, search_space="default")
    assert "search_spaces.attention" not in default.attrs["constants_note"]
