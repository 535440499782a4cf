"""Memory per GPU: Korthikanti's per-layer count, static memory by hand, monotonic effects."""

from __future__ import annotations

import numpy as np
import pytest

from layoutsearch.costs.memory import GIB, activation_bytes_per_layer
from layoutsearch.costs.shapes import at_stage, peak_stage
from tests.costs.builders import layer_shape, score, shapes

GPT3 = dict(model="gpt3_175b", num_gpus=1024, seq_length=2048, global_batch_size=1536)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_gpt_block_matches_korthikanti_without_dropout(tp: int) -> None:
    # Korthikanti et al. 2022, eq. 2 with tensor parallelism: per layer
    # s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes. The 10 replicated bytes hold two 1-byte dropout
    # masks, and 3 of the 5 score bytes are attention dropout (mask 1 + output 2). LLaMA-style
    # training has no dropout, so a GPT block with fused kernels keeps
    # s·b·h·(8 + 24/t) + 2·a·s²·b/t.
    s, b, h, a = 2048, 1, 12288, 96
    # GPT-3's LayerNorm is one kernel without the study's RMSNorm kernel (rmsnorm_kernel).
    sh = shapes(**GPT3, tp=tp, attention="fused", rmsnorm_kernel=False, recompute="none")
    kept, rebuilt, layer_input = activation_bytes_per_layer(sh.layer)
    expected = s * b * h * (8 + 24 / tp) + 2 * a * s * s * b / tp
    assert kept[0] == pytest.approx(expected, rel=1e-12)
    assert rebuilt[0] == 0.0  # no recompute, nothing rebuilt
    assert layer_input[0] == pytest.approx(2 * s * b * h)  # the checkpoint of full recompute


def test_sequence_parallelism_splits_the_replicated_part() -> None:
    # Korthikanti §4.2.2: with SP the 10·sbh term (8 without dropout) also divides by t.
    s, b, h, tp = 2048, 1, 12288, 8
    plain = activation_bytes_per_layer(layer_shape(**GPT3, tp=tp, attention="flash2"))[0][0]
    split = activation_bytes_per_layer(
        layer_shape(**GPT3, tp=tp, attention="flash2", sequence_parallel=True))[0][0]
    assert plain - split == pytest.approx(8 * s * b * h * (1 - 1 / tp))


def test_selective_recompute_drops_exactly_the_scores() -> None:
    s, a, tp = 2048, 96, 4
    none = activation_bytes_per_layer(layer_shape(**GPT3, tp=tp, attention="torch"))[0][0]
    selective = activation_bytes_per_layer(
        layer_shape(**GPT3, tp=tp, attention="torch", recompute="selective"))[0][0]
    assert none - selective == pytest.approx(6 * a * s * s / tp)  # torch keeps 6 bytes/score


def test_static_memory_of_llama_13b_by_hand() -> None:
    # LLaMA 13B: 13,015,864,320 parameters, minus the final norm (5,120, not counted per
    # stage). bf16 weights (2 bytes), bf16 gradients (gradient_bytes 2), Adam's fp32
    # master + moments (12 bytes) sharded over dp = 64.
    row = score(tp=1, pp=1).iloc[0]
    params = 13_015_864_320 - 5120
    assert row["memory_weights_gib"] == pytest.approx(2 * params / GIB)
    assert row["memory_gradients_gib"] == pytest.approx(2 * params / GIB)
    assert row["memory_optimizer_gib"] == pytest.approx(12 * params / 64 / GIB)


def test_memory_parts_sum_to_the_peak() -> None:
    rows = score(tp=[1, 2, 4, 8], pp=[1, 2, 4], micro_batch_size=[1, 4],
                 recompute=["none", "selective", "mlp", "full"], attention=["torch", "flash2"])
    parts = rows.filter(regex=r"^memory_.*_gib$").sum(axis=1)
    np.testing.assert_allclose(parts, rows["peak_memory_gib"], rtol=1e-12)
    assert (rows["fits"] == (rows["peak_memory_gib"] <= 80)).all()


def test_more_tensor_parallelism_holds_fewer_weights_per_gpu() -> None:
    rows = score(tp=[1, 2, 4, 8]).sort_values("tp")
    assert rows["memory_weights_gib"].is_monotonic_decreasing
    weights = rows["memory_weights_gib"]
    # Exactly 8x fewer but for tp 8's padded vocabulary: 32,768 rows instead of 32,000.
    h, padding = 5120, 2 * 2 * (32768 - 32000)  # two vocabulary matrices (untied), 2 bytes
    assert weights.iloc[0] / (weights.iloc[-1] - padding * h / 8 / GIB) == pytest.approx(8)


@pytest.mark.parametrize(("tp", "rows"), [(1, 32000), (2, 32000), (4, 32256), (8, 32768)])
def test_the_vocabulary_is_padded_as_megatron_pads_it(tp: int, rows: int) -> None:
    # arguments.py::_vocab_size_with_padding: a multiple of 128 · tp.
    assert layer_shape(tp=tp).vocab[0] == rows
    padded = score(tp=tp, model_fields={"vocab_size": rows})
    assert score(tp=tp)["memory_weights_gib"].iloc[0] == pytest.approx(
        padded["memory_weights_gib"].iloc[0], rel=1e-12)


def test_recompute_keeps_less_than_no_recompute() -> None:
    rows = score(recompute=["none", "mlp", "full"], pp=2).set_index("recompute")
    acts = rows["memory_activations_gib"]
    assert acts["full"] < acts["mlp"] < acts["none"]


def test_flash_attention_keeps_no_scores() -> None:
    rows = score(attention=["torch", "fused", "flash1", "flash2"], tp=2).set_index("attention")
    acts = rows["memory_activations_gib"]
    assert acts["flash2"] == acts["flash1"] < acts["fused"] < acts["torch"]


def test_fused_rmsnorm_kernel_saves_memory() -> None:
    rows = score(rmsnorm_kernel=[False, True]).set_index("rmsnorm_kernel")
    assert rows.loc[True, "memory_activations_gib"] < rows.loc[False, "memory_activations_gib"]


def test_distributed_optimizer_divides_optimizer_state_by_dp() -> None:
    rows = score(distributed_optimizer=[False, True], tp=2).set_index("distributed_optimizer")
    dp = 32
    assert rows.loc[False, "memory_optimizer_gib"] == pytest.approx(
        dp * rows.loc[True, "memory_optimizer_gib"])


def test_first_stage_holds_pp_micro_batches_in_flight() -> None:
    # 1F1B: the first stage keeps min(pp, micro-batches) micro-batches of its layers, i.e.
    # the activations of the whole model's L layers for one micro-batch (Korthikanti §4.2.3).
    one_stage = score(pp=1, rmsnorm_kernel=True, tp=2).iloc[0]
    four_stages = score(pp=4, rmsnorm_kernel=True, tp=2).iloc[0]
    assert four_stages["memory_activations_gib"] == pytest.approx(
        one_stage["memory_activations_gib"], rel=1e-12)
    assert four_stages["memory_logits_gib"] == 0.0  # the peak is on the first stage here


def test_interleaved_stages_hold_megatrons_warm_up_chunks() -> None:
    # Megatron's interleaved schedule: rank r warms up (pp-r-1)·2 + (vp-1)·pp model chunks
    # and holds one more; a chunk is 1/vp of the stage. pp=4, vp=2, 16 micro-batches:
    # first (6+4+1)/2 = 5.5 (Korthikanti's 4·(1 + 3/8)), second (4+4+1)/2 = 4.5,
    # last (0+4+1)/2 = 2.5 micro-batches of the stage's layers.
    sh = shapes(model="llama_13b", num_gpus=64, tp=2, pp=4, vp=2, global_batch_size=128)
    assert sh.micro_batches[0] == 16
    assert sh.stage_in_flight[:, 0].tolist() == [5.5, 4.5, 2.5]
    # Few micro-batches cap the warm-up at the step's m·vp chunks: 4 micro-batches, 8 chunks.
    few = shapes(model="llama_13b", num_gpus=64, tp=2, pp=4, vp=2, global_batch_size=32)
    assert few.stage_in_flight[:, 0].tolist() == [4.0, 4.0, 2.5]


def test_llama3_405b_interleaved_ends_hold_their_short_chunks_in_flight() -> None:
    # 126 layers, pp 16, vp 2: the embedding and the loss count as layers, so stages build
    # [7, 8, ..., 8, 7] in chunks of 4, the first stage's chunk 0 and the last stage's chunk 1
    # holding 3. 512 sequences over dp 8: 64 micro-batches. In flight (warm-up + 1 chunks,
    # the schedule taking 16 micro-batches through chunk 0, then 16 through chunk 1, ...):
    # first stage 30 + 16 + 1 = 47 chunks, 31 of chunk 0 (3 layers) and 16 of chunk 1 (4):
    # 157 layers; second stage 28 + 16 + 1 = 45 chunks of 4: 180; last stage 0 + 16 + 1 = 17,
    # 16 of chunk 0 (4) and one of chunk 1 (3): 67. Even chunks of 3.5 would make 164.5 and
    # 59.5.
    sh = shapes(model="llama3_405b", cluster="h100_sxm", num_gpus=1024, seq_length=8192,
                global_batch_size=512, tp=8, pp=16, vp=2)
    assert sh.micro_batches[0] == 64
    assert sh.stage_layers[:, 0].tolist() == [7.0, 8.0, 7.0]
    in_flight = sh.stage_layers[:, 0] * sh.stage_in_flight[:, 0]
    assert in_flight == pytest.approx([157.0, 180.0, 67.0], rel=1e-12)


def test_headroom_is_memory_left_and_negative_when_over() -> None:
    rows = score(micro_batch_size=[1, 8], tp=1)
    np.testing.assert_allclose(rows["headroom_gib"], 80 - rows["peak_memory_gib"])
    assert ((rows["headroom_gib"] >= 0) == rows["fits"]).all()


def test_a_trimmed_first_stage_moves_the_peak_to_the_second() -> None:
    # LLaMA 30B, 60 layers on 8 stages: [6, 8, ..., 8, 6]. Under 1F1B the first stage holds
    # 8 micro-batches of 6 layers (48), the second 7 of 8 layers (56): the second peaks.
    sh = shapes(model="llama_30b", num_gpus=256, pp=8, tp=2)
    assert sh.stage_layers[:, 0].tolist() == [6.0, 8.0, 6.0]
    acts = sh.stage_layers[:, 0] * sh.stage_in_flight[:, 0]
    assert acts.tolist() == [48.0, 56.0, 6.0]
    row = score(model="llama_30b", num_gpus=256, pp=8, tp=2).iloc[0]
    kept = activation_bytes_per_layer(sh.layer)[0]
    factor = 1.55  # activation_memory_factor of cost_models/analytic.yaml
    assert row["memory_activations_gib"] == pytest.approx(56 * factor * kept[0] / GIB)


@pytest.mark.parametrize(("attention", "rmsnorm_kernel", "kept_norm_outputs"),
                         [("fused", False, 2), ("flash2", True, 1)])
def test_mlp_recompute_keeps_fc1_input_only_with_the_local_layers(
        attention: str, rmsnorm_kernel: bool, kept_norm_outputs: int) -> None:
    # LLaMA 13B (SwiGLU, f = 13824), tp 2, no SP: mlp recompute drops the MLP's 6 bytes per
    # ffn element. The local layers' checkpoint input is the pre-MLP norm's output (FC1's
    # input, kept); Transformer Engine fuses that norm into FC1, so its checkpoint keeps the
    # residual stream (the norm's input, kept anyway) and FC1's input goes too.
    T, h, f, tp = 2048, 5120, 13824, 2
    kept = {recompute: activation_bytes_per_layer(layer_shape(
        tp=tp, attention=attention, rmsnorm_kernel=rmsnorm_kernel, recompute=recompute))[0][0]
        for recompute in ("none", "mlp")}
    dropped_norm_outputs = 2 - kept_norm_outputs
    assert kept["none"] - kept["mlp"] == pytest.approx(
        6 * T * f / tp + dropped_norm_outputs * 2 * T * h)


def test_selective_recompute_rebuilds_one_layers_scores_in_its_backward() -> None:
    # Llama-3 70B on 64 H100, tp 8, pp 4, dp 2, SP, seq 8192, mb 1, Transformer Engine's
    # fused softmax (2 bytes per score), selective recompute (core_attn). 128 sequences,
    # 64 micro-batches: the first stage stores 4 micro-batches of its 20 layers, each
    # s·b·h/t·(4 norms + 4 linear inputs + 2.5 q,k,v (8 K/V groups) + 2 context
    # + 21 SwiGLU (6·28672/8192)) = 33.5·s·b·h/t bytes, i.e. 80 × 33.5 × 8192 × 8192 / 8
    # = 22,481,469,440 bytes = 20.9375 GiB. The backward of each layer recomputes its
    # softmax(QK^T)V: one layer's scores, 2·s²·a/t = 2 × 8192² × 64 / 8 = 1 GiB, sit on
    # top of that (CheckpointFunction.backward), as one layer's working set does under
    # full recompute.
    row = score(model="llama3_70b", cluster="h100_sxm", num_gpus=64, seq_length=8192,
                global_batch_size=128, tp=8, pp=4, sequence_parallel=True,
                attention="fused", recompute="selective").iloc[0]
    assert row["memory_activations_gib"] == pytest.approx(20.9375 + 1.0, rel=1e-12)


def test_mlp_recompute_rebuilds_one_layers_mlp_in_its_backward() -> None:
    # LLaMA 13B, tp 1, pp 1, seq 2048, mb 1, FlashAttention 2 (Transformer Engine's layers),
    # fused RMSNorm, the A100 fit's activation_memory_factor 1.55. Per layer, in units of
    # s·h bytes: 4 norms + 2 QKV input + 6 q,k,v + 2 context = 14 stored for each of the
    # 40 layers; the layer in backward rebuilds FC1's input (2) and its SwiGLU tensors
    # (6·13824/5120 = 16.2): 40 × 14 + 18.2 = 578.2 s·h = 578.2 × 2048 × 5120 bytes.
    row = score(recompute="mlp").iloc[0]
    assert row["memory_activations_gib"] == pytest.approx(
        1.55 * 578.2 * 2048 * 5120 / GIB, rel=1e-12)


def test_full_recompute_stores_each_checkpoint_once() -> None:
    # Llama-3 8B on one H100 node, tp 1, pp 1, seq 8192, mb 1, FlashAttention, fused
    # RMSNorm (activation_memory_factor 1). Full recompute stores each of the 32 layers'
    # input (2·s·h bytes); the layer in backward reruns its forward from that checkpoint,
    # which CheckpointFunction hands over detached, not copied: the first norm's saved
    # input is the checkpoint itself. Per layer, in units of s·h bytes: 4 norm inputs
    # + 4 linear inputs + 2·(h + 2·1024)/h = 3 q,k,v + 2 context + 6·14336/4096 = 21
    # SwiGLU = 34, of which 2 are the checkpoint: 32 × 2 + 32 = 96 s·h.
    s, h = 8192, 4096
    row = score(model="llama3_8b", cluster="h100_sxm", num_gpus=8, seq_length=s,
                global_batch_size=8, recompute="full").iloc[0]
    assert row["memory_activations_gib"] == pytest.approx(96 * s * h / GIB, rel=1e-12)


def test_full_recompute_keeps_no_more_than_mlp_recompute_on_a_one_layer_stage() -> None:
    # Llama-3 8B on 32 stages of one layer: the last stage holds one micro-batch, whose
    # layer full recompute rebuilds whole from its checkpoint, as mlp recompute rebuilds
    # the MLP beside the rest of the layer.
    rows = score(model="llama3_8b", cluster="h200", num_gpus=64, seq_length=32768,
                 global_batch_size=256, pp=32, micro_batch_size=8,
                 recompute=["mlp", "full"]).set_index("recompute")
    acts = rows["memory_activations_gib"]
    assert acts["full"] <= acts["mlp"]


def test_llama3_405b_with_context_parallelism_by_hand() -> None:
    # Llama-3 405B on 1024 H100 (memory constants a priori, Megatron-LM's defaults), tp 8, pp 16,
    # cp 2, dp 4, SP, seq 8192, mb 1, FlashAttention, no recompute. 126 layers on 16 stages:
    # [7, 8 × 14, 7]; the second stage holds 15 micro-batches of 8 layers (120) against the
    # first's 16 of 7 (112) plus an embedding, and peaks. Per layer (h 16384, f 53248,
    # 8 K/V groups of 128): 2h² + 2·h·1024 + 3·h·f + 2h = 3,187,703,808 parameters.
    h, f, layer = 16384, 53248, 3_187_703_808
    assert 2 * h * h + 2 * h * 1024 + 3 * h * f + 2 * h == layer
    assert float(shapes(model="llama3_405b").params_per_layer) == layer  # one model: one number
    row = score(model="llama3_405b", cluster="h100_sxm", num_gpus=1024, seq_length=8192,
                global_batch_size=1024, tp=8, pp=16, cp=2, sequence_parallel=True).iloc[0]
    params = 8 * layer / 8  # 8 layers over tp 8
    # Megatron-LM's theoretical_memory_usage.py: 6 + 12/d bytes per parameter with the
    # distributed optimizer; Megatron shards it over the data- and context-parallel ranks
    # together (d = dp·cp = 8): 2 bf16 weights, 4 fp32 main gradients, 12/8 of Adam's state.
    assert row["memory_weights_gib"] == pytest.approx(2 * params / GIB)
    assert row["memory_gradients_gib"] == pytest.approx(4 * params / GIB)
    assert row["memory_optimizer_gib"] == pytest.approx(12 / 8 * params / GIB)
    # Activations: T = s/cp = 4096 tokens per rank, everything split by tp (SP), bytes per
    # T·h/t: 4 norms + 4 linear inputs + 2·(h + 2·1024)/h = 2.25 q,k,v + 2 context
    # + 6·f/h = 19.5 SwiGLU = 31.75; × 120 layer-micro-batches.
    T = 8192 / 2
    assert row["memory_activations_gib"] == pytest.approx(120 * 31.75 * T * h / 8 / GIB)
    assert row["memory_logits_gib"] == 0.0  # the second stage peaks, not the last


def test_the_peak_stage_is_the_first_largest_as_argmax_says() -> None:
    # Rows: first largest, a tie of first and middle, middle and last tied, last largest,
    # NaN in the middle, NaN first, NaN last.
    per_stage = np.array([[3.0, 2.0, 1.0, 1.0, 5.0, np.nan, 1.0],
                          [2.0, 2.0, 4.0, 2.0, np.nan, 9.0, 1.0],
                          [1.0, 1.0, 4.0, 3.0, 6.0, 9.0, np.nan]])
    assert peak_stage(per_stage).tolist() == [0, 0, 1, 2, 1, 0, 2]
    assert peak_stage(per_stage).tolist() == np.argmax(per_stage, axis=0).tolist()
    # The peak stage's own entry, row by row (NaN where that stage holds NaN).
    peaks = at_stage(per_stage, peak_stage(per_stage))
    np.testing.assert_array_equal(peaks, [3.0, 2.0, 4.0, 3.0, np.nan, np.nan, np.nan])


def test_a_number_per_recompute_kind_is_zero_for_kinds_not_named() -> None:
    layer = layer_shape(recompute=["none", "selective", "mlp", "full"])
    assert layer.per_recompute({"full": 1.0, "mlp": 0.5}).tolist() == [0.0, 0.0, 0.5, 1.0]
