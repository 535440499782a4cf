"""The message that explains an empty answer: why no layout fits and what to change."""

from __future__ import annotations

import pandas as pd

from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.no_fit import no_fit_message
from layoutsearch.space import SearchSpace
from layoutsearch.specs import Job
from tests.rankings import JOB, scored


def test_no_message_when_something_fits() -> None:
    table = scored([{"mfu": 0.5, "peak_memory_gib": 40.0, "fits": True}])
    assert no_fit_message(table, JOB) is None


def test_rule_message_counts_each_rule_once_per_layout() -> None:
    table = scored([
        {"tp": 3, "reason": "global_batch_size (3) must divide by micro_batch_size·dp (1·4); "
                            "num_attention_heads (40) must divide by tp (3)"},
        {"tp": 1, "reason": "global_batch_size (3) must divide by micro_batch_size·dp (1·64)"},
        {"micro_batch_size": 2,
         "reason": "global_batch_size (3) must divide by micro_batch_size·dp (2·64)"},
    ])
    message = no_fit_message(table, JOB)
    assert message == (
        "no layout passes the rules: global_batch_size (3) must divide by "
        "micro_batch_size·dp (1·4) (rejects 3 of 3 layouts); num_attention_heads (40) must "
        "divide by tp (3) (rejects 1 of 3 layouts)"
    )


def test_rule_message_names_a_dozen_passing_tp_pp_at_most() -> None:
    table = scored([{"tp": 3, "reason": "num_attention_heads (40) must divide by tp (3)"}])
    pairs = [(1, pp) for pp in range(1, 15)]
    message = no_fit_message(table, JOB, lambda: pairs)
    assert message is not None
    assert message.endswith("these tp×pp pass: 1×1, 1×2, 1×3, 1×4, 1×5, 1×6, 1×7, 1×8, 1×9, "
                            "1×10, 1×11, 1×12 and 2 more (set tp and pp to them)")
    assert no_fit_message(table, JOB, lambda: []) == no_fit_message(table, JOB)


def test_memory_message_names_the_smallest_footprint_and_untried_fixes() -> None:
    table = scored([
        {"tp": 2, "pp": 2, "dp": 16, "mfu": 0.5, "peak_memory_gib": 95.0,
         "distributed_optimizer": False},
        {"tp": 4, "pp": 2, "dp": 8, "mfu": 0.4, "peak_memory_gib": 85.31,
         "distributed_optimizer": False},
    ])
    message = no_fit_message(table, JOB)
    assert message is not None
    assert message.startswith("no layout fits: the smallest per-GPU footprint is 85.3 GiB > "
                              "80.0 GiB at tp·pp·cp ≤ 8 (tp=4 pp=2 cp=1 mb=1 recompute=none)")
    assert message.endswith("use more GPUs or GPUs with more memory, or enable "
                            "distributed_optimizer, or allow recompute=full, or allow larger "
                            "tp·pp, or enable sequence_parallel (with tp > 1)")


def test_memory_message_suggests_the_activation_fixes_not_tried() -> None:
    long_job = Job(model=load_model("llama_13b"), cluster=load_cluster("a100_80gb"),
                   num_gpus=64, seq_length=32768, global_batch_size=128)
    table = scored([
        {"tp": 8, "pp": 8, "micro_batch_size": 2, "attention": "torch", "recompute": "full",
         "sequence_parallel": True, "mfu": 0.3, "peak_memory_gib": 95.0},
    ])
    message = no_fit_message(table, long_job)
    assert message is not None
    assert message.endswith("; use more GPUs or GPUs with more memory, or allow "
                            "micro_batch_size=1, or allow "
                            "FlashAttention (attention=flash2)")
    # tp·pp = 64 takes every GPU: context parallelism has none left to take.
    wider = no_fit_message(scored([{**table.iloc[0].to_dict(), "pp": 4, "dp": 2}]), long_job)
    assert wider is not None and wider.endswith("allow context parallelism (cp > 1)")


def test_memory_message_does_not_suggest_what_was_tried() -> None:
    table = scored([
        {"tp": 8, "pp": 8, "mfu": 0.5, "peak_memory_gib": 95.0, "recompute": "full"},
        {"tp": 8, "pp": 8, "mfu": 0.5, "peak_memory_gib": 99.0, "recompute": "none",
         "distributed_optimizer": False},
    ])
    message = no_fit_message(table, JOB)
    assert message is not None
    assert message.endswith("; use more GPUs or GPUs with more memory, or enable "
                            "sequence_parallel (with tp > 1)")


def test_a_footprint_of_model_state_alone_gets_no_activation_advice() -> None:
    # 405B on 8 GPUs: weights, gradients and Adam state are over the limit before any
    # activation; recompute, FlashAttention or context parallelism cannot help.
    row = {"tp": 8, "pp": 1, "mfu": 0.5, "peak_memory_gib": 859.2,
           "memory_activations_gib": 9.0, "memory_logits_gib": 1.2, "seq_length": 8192}
    job = Job(model=load_model("llama3_405b"), cluster=load_cluster("h100_sxm"), num_gpus=8,
              seq_length=8192, global_batch_size=512)
    message = no_fit_message(scored([row]), job)
    assert message is not None
    assert message.endswith("(tp=8 pp=1 cp=1 mb=1 recompute=none) (weights, gradients, optimizer "
                            "state and overhead alone take 849.0 GiB); use more GPUs or GPUs "
                            "with more memory")
    # With the activations the larger part, the activation fixes are back.
    heavy = no_fit_message(scored([{**row, "peak_memory_gib": 90.0,
                                    "memory_activations_gib": 60.0}]), job)
    assert heavy is not None and "allow recompute=full" in heavy
    assert "allow context parallelism (cp > 1)" not in heavy  # tp·pp·cp = 8 is every GPU


def test_a_distributed_optimizer_is_no_fix_without_data_parallelism() -> None:
    row = {"tp": 8, "pp": 8, "mfu": 0.5, "peak_memory_gib": 95.0,
           "distributed_optimizer": False}
    message = no_fit_message(scored([row]), JOB)  # dp = 1: nothing to shard over
    assert message is not None and "distributed_optimizer" not in message
    sharded = no_fit_message(scored([{**row, "pp": 4, "dp": 2}]), JOB)
    assert sharded is not None and "enable distributed_optimizer" in sharded


def test_activation_fixes_stay_when_activations_dominate_a_heavy_model_state() -> None:
    # 58 GiB of state over a 40 GiB limit, yet most of the footprint is activations.
    job = Job(model=load_model("llama_13b"), cluster=load_cluster("a100_40gb"), num_gpus=8,
              seq_length=8192, global_batch_size=64)
    row = {"tp": 8, "micro_batch_size": 2, "attention": "torch", "mfu": 0.3,
           "peak_memory_gib": 720.9, "memory_activations_gib": 660.0,
           "memory_logits_gib": 2.9, "distributed_optimizer": False}
    message = no_fit_message(scored([row]), job)
    assert message is not None and "allow FlashAttention (attention=flash2)" in message
    assert "allow recompute=full" in message and "allow micro_batch_size=1" in message


def test_with_the_cost_model_only_fixes_that_fit_are_named() -> None:
    row = {"tp": 4, "pp": 2, "dp": 8, "micro_batch_size": 2, "attention": "torch",
           "mfu": 0.3, "peak_memory_gib": 95.0, "distributed_optimizer": False}
    tried: list[pd.DataFrame] = []

    def fits(rows: pd.DataFrame) -> pd.Series:  # FlashAttention, or tp ≥ 16
        tried.append(rows)
        return (rows["attention"] == "flash2") | (rows["tp"] >= 16)
    message = no_fit_message(scored([row]), JOB, fits=fits)
    assert message is not None and message.endswith(
        "; use more GPUs or GPUs with more memory, or allow FlashAttention (attention=flash2), "
        "or set tp=16 (dp=2)")
    variants = tried[0]
    assert (variants["tp"] * variants["pp"] * variants["cp"] * variants["dp"] == 64).all()
    none = no_fit_message(scored([row]), JOB, fits=lambda rows: rows["tp"] < 0)
    assert none is not None and none.endswith(
        "; no single change of its layout brings it under the limit (enable "
        "distributed_optimizer, allow recompute=full, allow micro_batch_size=1, allow "
        "FlashAttention (attention=flash2), enable sequence_parallel, larger tp, larger pp, "
        "larger cp): use more GPUs or GPUs with more memory")


def test_the_smallest_layout_of_a_no_fit_message_names_its_cp() -> None:
    job = Job(model=load_model("llama3_70b"), cluster=load_cluster("a100_80gb"), num_gpus=64,
              seq_length=131072, global_batch_size=64)
    row = {"tp": 8, "cp": 8, "mfu": 0.3, "peak_memory_gib": 92.0}
    message = no_fit_message(scored([row]), job)
    assert message is not None and "(tp=8 pp=1 cp=8 mb=1 recompute=none)" in message


def test_a_model_state_over_the_limit_gets_the_fewest_gpus_it_needs() -> None:
    # 405B on 8 A100s: 760.8 GiB of state at tp2 pp4. Its 190 GiB of weights and gradients
    # divide by tp·pp, its 570 GiB of Adam state (unsharded at dp = 1) by every GPU:
    # 1520 / 64 + 4560 / 64 > 79.25 GiB on 64 GPUs; 72 to 120 GPUs allow tp·pp ≤ 32 of the
    # paper space; 1520 / 128 + 4560 / 128 = 47.5 GiB on 128.
    job = Job(model=load_model("llama3_405b"), cluster=load_cluster("a100_80gb"), num_gpus=8,
              seq_length=8192, global_batch_size=64)
    row = {"tp": 2, "pp": 4, "recompute": "full", "attention": "flash2",
           "sequence_parallel": True, "mfu": 0.5, "peak_memory_gib": 782.4,
           "memory_weights_gib": 95.0, "memory_gradients_gib": 95.0,
           "memory_optimizer_gib": 570.0, "memory_activations_gib": 21.65,
           "memory_logits_gib": 0.0, "memory_overhead_gib": 0.75}
    message = no_fit_message(scored([row]), job, space=SearchSpace.load("paper"))
    assert message is not None and message.endswith(
        "alone take 760.8 GiB); use at least 128 GPUs (the weights, gradients and optimizer "
        "state alone fit from there, at tp·pp=128 with the distributed optimizer; activations "
        "need more) or GPUs with more memory")
    # No GPU count helps while tp·pp stays at most 8: 1520 / 8 = 190 GiB of weights and
    # gradients alone.
    narrow = no_fit_message(scored([row]), job, space=SearchSpace(tp=(1, 2), pp=(1, 2, 4)))
    assert narrow is not None and narrow.endswith(
        "; use GPUs with more memory, or allow larger tp·pp: at tp·pp=8, the space's largest, "
        "the weights and gradients alone take 190.0 GiB per GPU")
    # Without the space, the tp and pp values the ranking holds are all there is.
    assert no_fit_message(scored([row]), job) == narrow
