"""Step time: components sum to the total, the 1F1B bubble, and the effects users rely on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.costs import build_cost_model
from layoutsearch.costs.constants import load_constants
from layoutsearch.costs.timing import kernel_launches
from tests.costs.builders import layer_shape, score, table

# A tiny vocabulary makes the output layer negligible, so every stage does the same work.
EVEN = dict(model_fields={"vocab_size": 128}, num_gpus=64)


def test_time_parts_sum_to_the_step_time() -> None:
    rows = score(tp=[1, 2, 4, 8], pp=[1, 2, 4], micro_batch_size=[1, 2, 4],
                 recompute=["none", "selective", "mlp", "full"],
                 attention=["torch", "fused", "flash2"], sequence_parallel=[False, True])
    parts = rows.filter(regex=r"^time_.*_s$").sum(axis=1)
    np.testing.assert_allclose(parts, rows["step_time_s"], rtol=1e-12)


@pytest.mark.parametrize(("pp", "vp"), [(2, 1), (4, 1), (8, 1), (4, 2), (8, 5)])
def test_bubble_is_pp_minus_one_over_vp_m(pp: int, vp: int) -> None:
    # Narayanan et al. 2021: the 1F1B bubble is (pp-1)/m of the steady state; interleaving
    # with vp chunks divides it by vp. Here m = 2048 / (mb 1 · dp 64/pp).
    row = score(**EVEN, pp=pp, vp=vp).iloc[0]
    m = 2048 / (64 / pp)
    steady = row["step_time_s"] - row[["time_bubble_s", "time_dp_comm_s",
                                       "time_optimizer_s", "time_pp_comm_s"]].sum()
    assert row["time_bubble_s"] / steady == pytest.approx((pp - 1) / (vp * m), rel=1e-3)


def test_interleaving_sends_once_per_chunk() -> None:
    # Each of the vp chunks on a stage receives and sends every micro-batch: 4 chunks move 4x
    # the point-to-point bytes of one (Narayanan et al. 2021, section 2.2).
    rows = score(**EVEN, pp=4, vp=[1, 4]).set_index("vp")
    assert rows.loc[4, "time_pp_comm_s"] == pytest.approx(4 * rows.loc[1, "time_pp_comm_s"])


def test_mfu_is_the_study_formula_from_step_time() -> None:
    # MFU = tokens/s · (6N + 12·L·h·s) / (GPUs · 312 TFLOP/s), N of LLaMA 13B with 32k vocab.
    row = score().iloc[0]
    n, layers, h, s = 13_015_864_320, 40, 5120, 2048
    tokens_per_s = 2048 * s / row["step_time_s"]
    assert row["tokens_per_s"] == pytest.approx(tokens_per_s)
    assert row["mfu"] == pytest.approx(tokens_per_s * (6 * n + 12 * layers * h * s) / (64 * 312e12))


def test_recompute_costs_time() -> None:
    rows = score(recompute=["none", "selective", "mlp", "full"], attention="torch",
                 tp=2).set_index("recompute")
    t = rows["step_time_s"]
    assert t["none"] < t["selective"] < t["full"] and t["none"] < t["mlp"] < t["full"]
    assert rows.loc["none", "time_recompute_s"] == 0.0
    # Full recompute repeats the forward pass: about a third more than forward + backward.
    extra = rows.loc["full", "time_recompute_s"] / (t["none"] - rows.loc["none", "time_dp_comm_s"])
    assert 0.2 < extra < 0.4


def test_flash_attention_is_faster_than_materialized_scores() -> None:
    t = score(attention=["torch", "fused", "flash1", "flash2"], seq_length=8192,
              global_batch_size=512, tp=4, pp=2).set_index("attention")["step_time_s"]
    assert t["flash2"] < t["flash1"] < t["fused"] < t["torch"]


def test_flash_attention_backward_is_two_and_a_half_forwards() -> None:
    # FlashAttention's backward recomputes QK^T: 2.5x the forward's 4·T·s·h/2 causal FLOPs
    # (Dao-AILab benchmark_flash_attention.py), at flash2_efficiency of 312 TFLOP/s. LLaMA
    # 13B, tp 1, pp 1: 40 layers x 64 micro-batches of 2048 tokens per step.
    row = score(attention="flash2").iloc[0]
    flash2 = load_constants("analytic")["a100_80gb"].flash2_efficiency
    T, s, h = 2048, 2048, 5120
    forward_flops = 4 * T * s * h / 2
    expected = 40 * 2048 / 64 * (1 + 2.5) * forward_flops / (312e12 * flash2)
    assert row["time_attention_s"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_mlp_recompute_repeats_half_the_forward_collectives(sequence_parallel: bool) -> None:
    # Recomputing the MLP reruns its forward with FC2's all-reduce (with SP, FC1's gather and
    # FC2's reduce-scatter): one of the two per layer that full recompute repeats.
    comm = score(tp=4, recompute=["none", "mlp", "full"], sequence_parallel=sequence_parallel,
                 ).set_index("recompute")["time_tp_comm_s"]
    assert comm["mlp"] - comm["none"] == pytest.approx((comm["full"] - comm["none"]) / 2)
    assert comm["mlp"] > comm["none"]


def test_tensor_parallel_comm_is_zero_at_tp1_and_grows_across_nodes() -> None:
    rows = score(tp=[1, 8, 16], model="llama_65b", num_gpus=128).set_index("tp")
    comm = rows["time_tp_comm_s"]
    assert comm[1] == 0.0
    assert comm[16] > comm[8] > 0.0  # tp = 16 leaves the NVLink domain of 8 GPUs


def _scored_on_nodes_of(gpus_per_node: int, **layout) -> pd.Series:
    rows = table(**layout).assign(gpus_per_node=gpus_per_node)
    return build_cost_model("analytic").score(rows, clusters_by_gpu()).join(rows).iloc[0]


def test_a_group_across_a_node_boundary_is_priced_on_the_network() -> None:
    # tp 4 on 6-GPU nodes: ranks 4-7 straddle nodes 0 and 1; on one 24-GPU node they stay.
    layout = dict(num_gpus=24, global_batch_size=24, tp=4)
    straddling = _scored_on_nodes_of(6, **layout)["time_tp_comm_s"]
    inside = _scored_on_nodes_of(24, **layout)["time_tp_comm_s"]
    assert straddling > 3 * inside
    assert _scored_on_nodes_of(8, **layout)["time_tp_comm_s"] == pytest.approx(inside)


def test_a_pipeline_over_several_nodes_sends_across_one_of_their_boundaries() -> None:
    # tp2 dp2 per stage, 8 stages on 32 GPUs: stages 1 and 2 sit on nodes 0 and 1 of 8 GPUs.
    layout = dict(num_gpus=32, global_batch_size=64, tp=2, pp=8)
    across = _scored_on_nodes_of(8, **layout)["time_pp_comm_s"]
    one_node = _scored_on_nodes_of(32, **layout)["time_pp_comm_s"]
    assert across > 3 * one_node > 0.0


def test_a_context_parallel_ring_across_nodes_sends_over_one_nic_per_hop() -> None:
    # Llama-3 8B, 32k tokens on two H100 nodes, cp 16 (tp 1, dp 1, mb 1): 16 micro-batches.
    # Transformer Engine's ring attention sends each rank's K and V chunk to the next CP
    # rank, point to point; the two hops between the nodes each run over one 50 GB/s NIC
    # (not the 8 NICs an all-reduce's rings would use) and pace every step.
    row = score(model="llama3_8b", cluster="h100_sxm", num_gpus=16, seq_length=32768,
                global_batch_size=16, cp=16, attention="flash3").iloc[0]
    k = load_constants("analytic")["h100_sxm"]
    tokens, kv_width, h = 32768 / 16, 8 * 128, 4096
    kv_bytes = 2 * 2 * tokens * kv_width  # K and V of the local chunk, bf16: 8,388,608
    nic = 50e9 * k.network_efficiency
    ring_s = 15 * kv_bytes * 3 / nic  # 15 steps, forward K, V and backward K, V, dK, dV
    # FlashAttention's causal QK^T and AV of the local queries against all 32k keys, its
    # backward 2.5 forwards, at flash3_efficiency of 989 TFLOP/s; what the ring outlasts
    # of it is exposed, in each of 32 layers of 16 micro-batches.
    attention_s = 3.5 * 4 * tokens * 32768 * h * 0.5 / (989e12 * k.flash3_efficiency)
    assert ring_s > attention_s
    assert row["time_cp_comm_s"] == pytest.approx(16 * 32 * (ring_s - attention_s))


def test_context_parallel_attention_launches_a_kernel_per_ring_step() -> None:
    # cp 4: four FlashAttention launches a layer instead of one, and three steps that each
    # add a K/V send/receive and two corrections of the partial output: 3 + 9 = 12 more
    # forward kernels, and 3x that with the backward (FORWARD_AND_BACKWARD).
    forward, every = kernel_launches(layer_shape(num_gpus=64, cp=[1, 4]))
    assert forward[1] - forward[0] == 12.0
    assert every[1] - every[0] == 36.0


def test_sequence_parallelism_trades_element_wise_work_for_communication() -> None:
    rows = score(sequence_parallel=[False, True], tp=4).set_index("sequence_parallel")
    assert rows.loc[True, "time_elementwise_s"] < rows.loc[False, "time_elementwise_s"]
    comm = rows["time_tp_comm_s"]
    # Per block, 2 all-reduce volumes forward and 2 backward; SP swaps each for a gather and
    # scatter pair of the same volume and gathers each block's input once more backward
    # for the weight gradient (Korthikanti §4.2.2): 2 + 3 = 5 volumes instead of 4.
    assert comm[True] == pytest.approx(1.25 * comm[False])


def test_layernorm_runs_fused_without_the_rmsnorm_kernel() -> None:
    # Megatron-LM's LayerNorm is one kernel (Apex, Transformer Engine or PyTorch's native
    # layer_norm); the study's RMSNorm kernel changes only RMSNorm models.
    gpt3 = dict(model="gpt3_175b", num_gpus=1024, seq_length=2048, global_batch_size=1536)
    layernorm = score(**gpt3, tp=8, pp=16, rmsnorm_kernel=[False, True])
    assert layernorm["step_time_s"].nunique() == 1
    assert layernorm["memory_activations_gib"].nunique() == 1
    rmsnorm = score(**gpt3, tp=8, pp=16, rmsnorm_kernel=[False, True],
                    model_fields={"normalization": "RMSNorm"}).set_index("rmsnorm_kernel")
    assert rmsnorm.loc[False, "step_time_s"] > rmsnorm.loc[True, "step_time_s"]
    assert rmsnorm.loc[True, "step_time_s"] == pytest.approx(layernorm["step_time_s"].iloc[0])


def test_fewer_micro_batches_mean_a_larger_bubble() -> None:
    rows = score(**EVEN, pp=4, micro_batch_size=[1, 2, 4, 8]).sort_values("micro_batch_size")
    share = rows["time_bubble_s"] / rows["step_time_s"]
    assert share.is_monotonic_increasing


def test_one_row_scores_like_the_same_row_in_a_big_table() -> None:
    big = score(tp=[1, 2, 4], pp=[1, 2], micro_batch_size=[1, 2])
    one = score(tp=2, pp=2, micro_batch_size=2).iloc[0]
    match = big[(big.tp == 2) & (big.pp == 2) & (big.micro_batch_size == 2)].iloc[0]
    for column in ("step_time_s", "mfu", "peak_memory_gib"):
        assert one[column] == pytest.approx(match[column], rel=1e-12)


# One micro-batch's pass through the stage: the per-layer parts of the breakdown
# (each is micro-batches × stage layers × its per-layer time).
MICRO_BATCH_PARTS = ("time_gemm_s", "time_attention_s", "time_elementwise_s",
                     "time_recompute_s", "time_tp_comm_s", "time_cp_comm_s", "time_overhead_s")


def test_overlap_hides_data_parallel_time_behind_one_micro_batch() -> None:
    # LLaMA 13B on 64 GPUs, tp = pp = 1, micro-batch 1: 32 micro-batches per step, each far
    # shorter than the reduce-scatter or the all-gather (~2.4 s each with the fitted fabric).
    rows = score(overlap_grad_reduce=[False, True]).set_index("overlap_grad_reduce")
    exposed, overlapped = rows.loc[False], rows.loc[True]
    micro_batches = 2048 / 64
    window = sum(exposed[part] for part in MICRO_BATCH_PARTS) / micro_batches
    # The reduce-scatter hides behind the last micro-batch's backward and the all-gather
    # behind the first one's forward: together one whole pass.
    assert exposed["time_dp_comm_s"] - overlapped["time_dp_comm_s"] == pytest.approx(window)
    assert exposed["step_time_s"] - overlapped["step_time_s"] == pytest.approx(window)


def test_overlap_leaves_the_last_chunk_exposed() -> None:
    # At 8k tokens and micro-batch 8 each pass outlasts its collective; what stays on the
    # step is the last layer's share of the traffic (the model's 40 layers on one stage).
    rows = score(seq_length=8192, global_batch_size=512, micro_batch_size=8,
                 overlap_grad_reduce=[False, True]).set_index("overlap_grad_reduce")
    assert rows.loc[True, "time_dp_comm_s"] == pytest.approx(
        rows.loc[False, "time_dp_comm_s"] / 40)


def test_optimizer_step_streams_the_shard_with_its_gradient() -> None:
    # Adam over the distributed optimizer's shard (dp 32): read the gradient (2 bytes here),
    # read and write fp32 master, m and v (24), write the bf16 weight (2), at HBM speed.
    # LLaMA 13B at tp 2, one stage: 40 layers of 317,204,480 parameters and both 32,000 x
    # 5,120 vocabulary matrices (13,015,859,200; the final norm is not counted per stage),
    # halved by tp: 6,507,929,600 per GPU. A100 80GB HBM: 2,039 GB/s (catalog, datasheet).
    row = score(tp=2).iloc[0]
    k = load_constants("analytic")["a100_80gb"]
    assert k.gradient_bytes == 2.0
    params_per_gpu = (40 * 317_204_480 + 2 * 32_000 * 5_120) / 2
    assert params_per_gpu == 6_507_929_600
    bandwidth = 2039e9 * k.memory_bandwidth_efficiency
    expected = (2 + 24 + 2) * params_per_gpu / 32 / bandwidth
    assert row["time_optimizer_s"] == pytest.approx(expected, rel=1e-12)
