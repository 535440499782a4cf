"""Seconds per optimizer step, by component, for every row of a candidate table.

One micro-batch on the slowest pipeline stage is priced from its parts — GEMMs, attention,
memory-bound element-wise kernels, tensor-parallel collectives, launch overhead — then the
1F1B schedule turns it into a step: micro-batches × stage time plus the bubble
(Narayanan et al. 2021: (pp−1)/vp stage times), plus the data-parallel gradient
communication that compute does not hide and the optimizer step.

Sources: FLOPs per GEMM as in Megatron-LM's `num_floating_point_operations` (Narayanan et
al. 2021, appendix); collectives as ring algorithms (NCCL: an all-reduce moves 2(n−1)/n of
the buffer per GPU, an all-gather or reduce-scatter (n−1)/n); element-wise traffic counted
per kernel below. Left out: the embedding lookup, RoPE tables and attention-mask creation.

    parts = time_breakdown(shapes, constants)   # seconds per component, one array each

Each component has its own function: `layer_compute` (GEMMs, attention, element-wise
kernels), `recompute_s`, `tensor_parallel_s`, `kernel_launches`, `context_parallel_exposed_s`,
`logits_s`, `pipeline_p2p_s`, `slowest_stage`, `bubble_s`, `data_parallel_exposed_s` and
`optimizer_step_s`. `layer_seconds` puts a layer's together, worked out once per distinct
layer shape (`Shapes.per_layer`), and `time_breakdown` a step's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from layoutsearch.costs.links import (
    LayerLinks,
    StepLinks,
    gradient_ranks,
    layer_links,
    step_links,
)
from layoutsearch.costs.shapes import Array, LayerShape, Shapes, at_stage, peak_stage
from layoutsearch.layout import FLASH_ATTENTION

# Element-wise traffic per token and layer, forward pass, in bytes per unit of width. The
# backward pass reads the saved inputs and the incoming gradients and writes the outgoing
# ones: about twice the forward traffic (BACKWARD_TRAFFIC).
# PyTorch RMSNorm: upcast (r2 w4), pow (r4 w4), mean (r4), x·rsqrt (r4 w4), downcast
# (r4 w2), ·weight (r2 w2) = 36 bytes per element; the fused kernel reads 2 and writes 2.
NORM_TRAFFIC_UNFUSED, NORM_TRAFFIC_FUSED = 36.0, 4.0
# Two residual adds per block, each reading two bf16 tensors and writing one.
RESIDUAL_TRAFFIC = 12.0
# Megatron's fused bias-SwiGLU reads gate and up and writes their product (per ffn element);
# a GELU MLP reads and writes one tensor.
SWIGLU_TRAFFIC, GELU_TRAFFIC = 6.0, 4.0
# Fused rotary embedding: reads and writes q and k once.
ROPE_TRAFFIC = 4.0
# Per element of the s×s scores, forward and backward together: PyTorch's softmax path
# (baddbmm output, scale and mask, fp32 softmax, downcast, and their backward) moves about
# 54 bytes; Megatron's fused scale-mask-softmax kernel 10; FlashAttention keeps scores on chip.
SCORE_TRAFFIC = {"torch": 54.0, "fused": 10.0, "flash1": 0.0, "flash2": 0.0, "flash3": 0.0}
# Vocabulary-parallel cross entropy per logit, forward and backward: upcast, max, subtract,
# exp, sum, divide and the gradient, in fp32.
LOSS_TRAFFIC = 52.0
# Kernels one layer launches in its forward pass, by part: with fused kernels two norms,
# QKV, RoPE, output projection, two residual adds, FC1, SwiGLU and FC2 (10); attention as
# one FlashAttention kernel, three for Megatron's fused softmax (QK^T, softmax, AV) or six
# for PyTorch's (baddbmm, scale, mask, softmax, downcast, AV); PyTorch's RMSNorm is seven
# kernels instead of one (upcast, pow, mean, rsqrt, multiply, downcast, weight); each
# tensor-parallel collective is one more (two forward, four with sequence parallelism).
FORWARD_KERNELS = 10.0
ATTENTION_KERNELS = {"torch": 6.0, "fused": 3.0, "flash1": 1.0, "flash2": 1.0, "flash3": 1.0}
UNFUSED_NORM_EXTRA_KERNELS = 6.0
# Context parallelism runs attention as a ring of cp steps, each launching the attention
# kernel(s) on one K/V chunk; every step after the first adds its K/V send/receive and the
# rescaling of the partial output and its log-sum-exp (Transformer Engine's
# AttnFuncWithCPAndKVP2P: flash_attn_p2p_communicate, flash_attn_fwd_out_correction and
# flash_attn_fwd_softmax_lse_correction), 3 kernels.
CP_STEP_KERNELS = 3.0
BACKWARD_TRAFFIC = 2.0
BACKWARD_FLOPS = 2.0  # dgrad and wgrad GEMMs are each as large as the forward GEMM
FORWARD_AND_BACKWARD = 1.0 + BACKWARD_FLOPS  # forward + backward, in forward equivalents
# FlashAttention's backward recomputes QK^T: five GEMMs against the forward's two, 2.5x
# its FLOPs. Its published TFLOP/s (and so the *_efficiency constants) count fwd+bwd as
# 3.5x the forward (Dao-AILab flash-attention, benchmarks/benchmark_flash_attention.py).
FLASH_BACKWARD_FLOPS = 2.5
# Adam on the local shard, besides reading the gradient (`gradient_bytes`): read and write
# fp32 master, m and v (24), write the bf16 weight (2).
OPTIMIZER_STATE_TRAFFIC = 26.0


def _memory_rate(layer: LayerShape, k: Mapping[str, Array]) -> Array:
    """Bytes/s that the memory-bound kernels reach."""
    return layer.memory_bandwidth * k["memory_bandwidth_efficiency"]


@dataclass(frozen=True, slots=True)
class LayerCompute:
    """One layer's compute for one micro-batch on one GPU, seconds, by op class."""

    attention_gemms_fwd_s: Array
    """QKV and output projections, forward."""
    mlp_gemms_fwd_s: Array
    """FC1 (gate and up with SwiGLU) and FC2, forward."""
    attention_s: Array
    """QK^T, softmax and AV, forward + backward."""
    attention_fwd_s: Array
    """QK^T, softmax and AV, forward alone (what recomputation repeats)."""
    elementwise_fwd_s: Array
    """Norms, residual adds, the MLP's activation and RoPE, forward."""
    mlp_elementwise_fwd_s: Array
    """The MLP activation's share of `elementwise_fwd_s`."""

    @property
    def gemm_s(self) -> Array:
        """All GEMMs outside attention, forward + backward."""
        return FORWARD_AND_BACKWARD * (self.attention_gemms_fwd_s + self.mlp_gemms_fwd_s)

    @property
    def elementwise_s(self) -> Array:
        """The element-wise kernels, forward + backward."""
        return (1 + BACKWARD_TRAFFIC) * self.elementwise_fwd_s

    @property
    def forward_s(self) -> Array:
        """The whole forward pass of the layer's compute."""
        return (self.attention_gemms_fwd_s + self.mlp_gemms_fwd_s + self.attention_fwd_s
                + self.elementwise_fwd_s)


def gemm_fwd_s(layer: LayerShape, k: Mapping[str, Array]) -> tuple[Array, Array]:
    """Forward seconds of one layer's GEMMs for one micro-batch: the attention block's (QKV
    and output projection) and the MLP's."""
    T, h, f, t = layer.tokens, layer.hidden, layer.ffn, layer.tp
    mlp_matrices = np.where(layer.swiglu, 3.0, 2.0)
    attn_gemm_flops = 2 * T * (2 * h * h + 2 * h * layer.kv_width) / t
    mlp_gemm_flops = 2 * T * mlp_matrices * h * f / t
    gemm_rate = layer.peak_flops * k["gemm_efficiency"]
    return attn_gemm_flops / gemm_rate, mlp_gemm_flops / gemm_rate


def attention_core_s(layer: LayerShape, k: Mapping[str, Array]) -> tuple[Array, Array]:
    """Seconds of one layer's QK^T, softmax and AV for one micro-batch: forward + backward,
    and the forward alone."""
    T, h, t, s = layer.tokens, layer.hidden, layer.tp, layer.seq
    bandwidth = _memory_rate(layer, k)
    # QK^T and AV: 4·T·s·h FLOPs per layer; FlashAttention skips the masked causal half.
    flash = layer.is_attention(*FLASH_ATTENTION)
    score_flops = 4 * T * s * h / t * np.where(flash, 0.5, 1.0)
    attention_efficiency = np.select(
        [layer.is_attention(kernel) for kernel in FLASH_ATTENTION],
        [k[f"{kernel}_efficiency"] for kernel in FLASH_ATTENTION],
        default=k["gemm_efficiency"],  # torch and fused run QK^T and AV as batched GEMMs
    )
    attention_rate = layer.peak_flops * attention_efficiency
    score_traffic = layer.per_attention(SCORE_TRAFFIC) * T * s * layer.heads / t  # fwd + bwd
    attention_passes = np.where(flash, 1.0 + FLASH_BACKWARD_FLOPS, FORWARD_AND_BACKWARD)
    attention_s = attention_passes * score_flops / attention_rate + score_traffic / bandwidth
    attention_fwd_s = (score_flops / attention_rate
                       + score_traffic / (1 + BACKWARD_TRAFFIC) / bandwidth)
    return attention_s, attention_fwd_s


def elementwise_fwd_s(layer: LayerShape, k: Mapping[str, Array]) -> tuple[Array, Array]:
    """Forward seconds of one layer's memory-bound element-wise kernels for one micro-batch:
    all of them, and the MLP activation's share."""
    T, h, f, t = layer.tokens, layer.hidden, layer.ffn, layer.tp
    bandwidth = _memory_rate(layer, k)
    replicated = np.where(layer.sequence_parallel, 1.0 / t, 1.0)
    norm_traffic = np.where(layer.fused_norm, NORM_TRAFFIC_FUSED, NORM_TRAFFIC_UNFUSED)
    token_traffic = (2 * norm_traffic + RESIDUAL_TRAFFIC) * T * h * replicated
    mlp_traffic = np.where(layer.swiglu, SWIGLU_TRAFFIC, GELU_TRAFFIC) * T * f / t
    rope_traffic = ROPE_TRAFFIC * T * (h + layer.kv_width) / t
    return (token_traffic + mlp_traffic + rope_traffic) / bandwidth, mlp_traffic / bandwidth


def layer_compute(layer: LayerShape, k: Mapping[str, Array]) -> LayerCompute:
    """One layer's compute for one micro-batch, by op class."""
    attention_gemms, mlp_gemms = gemm_fwd_s(layer, k)
    attention, attention_fwd = attention_core_s(layer, k)
    elementwise, mlp_elementwise = elementwise_fwd_s(layer, k)
    return LayerCompute(attention_gemms_fwd_s=attention_gemms, mlp_gemms_fwd_s=mlp_gemms,
                        attention_s=attention, attention_fwd_s=attention_fwd,
                        elementwise_fwd_s=elementwise, mlp_elementwise_fwd_s=mlp_elementwise)


def _recompute_kinds(layer: LayerShape) -> list[Array]:
    """Flags of full, selective and MLP recomputation, in the order the selects use."""
    return [layer.is_recompute("full"), layer.is_recompute("selective"),
            layer.is_recompute("mlp")]


def recompute_s(layer: LayerShape, compute: LayerCompute) -> Array:
    """Seconds one layer spends on recomputation for one micro-batch: recomputation repeats
    forward work before the backward pass (the whole layer's, the attention core's, or the
    MLP's)."""
    return np.select(
        _recompute_kinds(layer),
        [compute.forward_s, compute.attention_fwd_s,
         compute.mlp_gemms_fwd_s + compute.mlp_elementwise_fwd_s],
        default=0.0,
    )


def tensor_parallel_s(layer: LayerShape, links: LayerLinks) -> tuple[Array, Array]:
    """Seconds of one layer's tensor-parallel collectives for one micro-batch: those of the
    forward pass, and all of them (forward, backward and those recomputation repeats)."""
    T, h, t = layer.tokens, layer.hidden, layer.tp
    # Tensor parallelism: two all-reduces of the T×h activations forward and two backward.
    # Sequence parallelism swaps each all-reduce for an all-gather + reduce-scatter pair of
    # the same volume, and its backward gathers each block's input once more for the weight
    # gradient (Korthikanti §4.2.2; Megatron's LinearWithGradAccumulationAndAsyncCommunication):
    # 5 gather/scatter units per block instead of 4.
    # All of it is priced as exposed, though Megatron-LM and Transformer Engine issue the
    # backward collectives of QKV and FC1 asynchronously beside a GEMM of the same linear
    # (CUDA_DEVICE_MAX_CONNECTIONS=1): the NCCL kernels then take SMs from that GEMM, and
    # the evidence does not favour pricing them hidden. Hidden up to the GEMM's length, the
    # study's runs refit no better (min ρ 0.902 against 0.902, MFU MAPE 5.3 % against 5.0 %)
    # and Megatron-LM's published GPT-3 175B run on 96 H100s is overshot (50.7 % predicted,
    # 47 % measured, against 46.8 % priced exposed; on 4,608 GPUs 42.2 % against 40.9 %, 42 %
    # measured; figures from before FlashAttention's backward counted 2.5 forwards, which
    # moved the exposed ones 0.1-0.2 points).
    tp_collective_s = np.where(t > 1, 2 * (t - 1) / t * 2.0 * T * h / links.tensor_parallel,
                               0.0)
    tp_fwd_s = 2 * tp_collective_s
    tp_bwd_s = tp_fwd_s * np.where(layer.sequence_parallel, 1.5, 1.0)
    # Recomputation repeats forward collectives: all of them (full), or the MLP's half.
    tp_comm_s = tp_fwd_s + tp_bwd_s + tp_fwd_s * layer.per_recompute({"full": 1.0, "mlp": 0.5})
    return tp_fwd_s, tp_comm_s


def kernel_launches(layer: LayerShape) -> tuple[Array, Array]:
    """Kernels one layer launches for one micro-batch: in its forward pass, and in all
    (forward, backward and recomputation)."""
    t = layer.tp
    # Launch overhead: the backward pass launches about twice the forward kernels;
    # recomputation launches the recomputed part's kernels again.
    cp = layer.cp
    attention_kernels = (cp * layer.per_attention(ATTENTION_KERNELS)
                         + (cp - 1) * CP_STEP_KERNELS)
    forward_kernels = (
        FORWARD_KERNELS + attention_kernels
        + np.where(layer.fused_norm, 0.0, 2 * UNFUSED_NORM_EXTRA_KERNELS)
        + np.where(t > 1, np.where(layer.sequence_parallel, 4.0, 2.0), 0.0)
    )
    # The MLP's recomputed forward reruns FC1, SwiGLU and FC2, and FC2's all-reduce (with
    # SP, FC1's all-gather and FC2's reduce-scatter).
    mlp_collectives = np.where(t > 1, np.where(layer.sequence_parallel, 2.0, 1.0), 0.0)
    recompute_kernels = np.select(
        _recompute_kinds(layer), [forward_kernels, attention_kernels, 3.0 + mlp_collectives],
        default=0.0)
    return forward_kernels, FORWARD_AND_BACKWARD * forward_kernels + recompute_kernels


def context_parallel_exposed_s(layer: LayerShape, links: LayerLinks, attention_s: Array,
                               ) -> Array:
    """Seconds of one layer's context-parallel ring transfers for one micro-batch that its
    attention (`attention_s`, forward + backward) does not hide."""
    T, t, cp = layer.tokens, layer.tp, layer.cp
    # Context parallelism passes each rank's K and V chunk around a ring (cp-1 steps) forward,
    # and K, V and their gradients backward; the transfers overlap the attention kernels
    # (Megatron/Transformer Engine ring attention), so only the excess is exposed.
    # Each step is a point-to-point send to the next CP rank (links.context_ring).
    kv_bytes = 2 * 2.0 * T * layer.kv_width / t  # K and V of the local chunk, bf16
    cp_transfer_s = (cp - 1) * kv_bytes * (1 + 2) / links.context_ring  # forward + backward
    return np.where(cp > 1, np.maximum(0.0, cp_transfer_s - attention_s), 0.0)


def logits_s(layer: LayerShape, k: Mapping[str, Array]) -> Array:
    """Seconds of the output layer and the loss for one micro-batch, forward + backward."""
    T, h, t = layer.tokens, layer.hidden, layer.tp
    # The last stage also runs the output layer and the loss (the slowest stage). The loss
    # works on 1/tp of the vocabulary when it is vocabulary-parallel, else on all of it.
    logits_flops = 2 * T * h * layer.vocab / t
    vocab_share = np.where(k["logits_sharded_by_tp"] > 0, 1.0 / t, 1.0)
    gemm_rate = layer.peak_flops * k["gemm_efficiency"]
    return (FORWARD_AND_BACKWARD * logits_flops / gemm_rate
            + LOSS_TRAFFIC * T * layer.vocab * vocab_share / _memory_rate(layer, k))


def pipeline_p2p_s(sh: Shapes, links: StepLinks) -> Array:
    """Seconds a stage spends sending and receiving across its boundaries, per micro-batch."""
    # Pipeline: activations cross each stage boundary forward and their gradients backward;
    # neighbouring stages sit tp·cp·dp ranks apart, on another node beyond gpus_per_node.
    # Each TP rank sends its 1/tp slice (legacy Megatron-LM's scatter-gather, or the SP
    # shard) over its own link: a pair of ranks tp·cp·dp apart. Megatron-core dropped the
    # scatter-gather: without SP each rank sends the whole activations, tp times these bytes.
    # The slice stays because the study's runs need it (whole sends drop the refit's min ρ
    # from 0.90 to 0.79), and a switch per GPU kind, fitted, is not learnt without the one
    # 256-GPU sweep (left out, its held-out ρ fell from 0.86 to 0.73). With vp interleaved
    # chunks every stage sends and receives once per chunk: vp times the traffic (Narayanan
    # et al. 2021, §2.2: "the amount of communication also increases by v").
    # A pipeline over more than one node paces at its hop across a node boundary
    # (links.pipeline_hop).
    p2p_bytes = 2.0 * sh.layer.tokens * sh.layer.hidden / sh.layer.tp
    return np.where(sh.pp > 1, sh.vp * 2 * p2p_bytes / links.pipeline_hop, 0.0)


def slowest_stage(sh: Shapes, layer_s: Array, logits: Array) -> tuple[Array, Array]:
    """The layers and the output layer's seconds (`logits`, or 0) of the pipeline stage
    that takes longest per micro-batch, given one layer's seconds `layer_s`."""
    # The slowest stage paces the pipeline: the first, a middle or the last stage (with the
    # output layer and loss), their layers split as layoutsearch.pipeline says.
    stage_s = sh.stage_layers * layer_s
    stage_s[2] += logits
    slowest = peak_stage(stage_s)
    return at_stage(sh.stage_layers, slowest), np.where(slowest == 2, logits, 0.0)


def bubble_s(sh: Shapes, layer_s: Array, logits: Array) -> Array:
    """Seconds of the pipeline's fill and drain in one step."""
    mean_stage_mb = (sh.num_layers * layer_s + logits) / sh.pp
    # 1F1B fill and drain: (pp-1)/vp stage times of the average stage (Narayanan et al. 2021).
    return (sh.pp - 1) / sh.vp * mean_stage_mb


def data_parallel_exposed_s(sh: Shapes, k: Mapping[str, Array], links: StepLinks,
                            stage_layers: Array, layer_s: Array, forward_layer_s: Array,
                            ) -> Array:
    """Seconds of one step's data-parallel communication that compute does not hide, on the
    slowest stage (`stage_layers` layers of `layer_s` seconds per micro-batch, of which
    `forward_layer_s` forward)."""
    # Data parallelism: reduce-scatter the gradients and all-gather the updated bf16 weights
    # (distributed optimizer), or all-reduce the gradients.
    d = gradient_ranks(sh.dp, sh.layer.cp)
    P = sh.params_per_gpu
    dp_bandwidth = links.gradient
    gradient_s = np.where(sh.distributed_optimizer, 1.0, 2.0) * (
        (d - 1) / d * P * k["gradient_bytes"] / dp_bandwidth)
    gather_s = np.where(sh.distributed_optimizer, (d - 1) / d * P * 2.0 / dp_bandwidth, 0.0)
    # With --overlap-grad-reduce, Megatron's DistributedDataParallel reduces each gradient
    # bucket as the last micro-batch's backward produces it; with --overlap-param-gather,
    # each weight bucket is gathered just ahead of its layers in the next step's first
    # forward. What outlasts that one micro-batch's pass on the slowest stage is exposed, and
    # never less than the last chunk, about one layer's share (NeMo's communication-overlap
    # guide: "exposes only one DP communication chunk"). Left out: compute slowed by the
    # NCCL kernels it runs beside, and the longer windows of stages that finish early.
    # Without overlap (the study's runs, the `paper` space) all of it is exposed, and the
    # windows are not worked out.
    overlap = sh.overlap_grad_reduce
    if np.any(overlap):
        forward_window = stage_layers * forward_layer_s
        backward_window = stage_layers * layer_s - forward_window
        last_chunk = 1.0 / np.maximum(stage_layers, 1.0)
        gradient_s = np.where(overlap, np.maximum(gradient_s - backward_window,
                                                  gradient_s * last_chunk), gradient_s)
        gather_s = np.where(overlap, np.maximum(gather_s - forward_window,
                                                gather_s * last_chunk), gather_s)
    return k["dp_comm_exposed"] * (gradient_s + gather_s)


def optimizer_step_s(sh: Shapes, k: Mapping[str, Array]) -> Array:
    """Seconds of the optimizer step: Adam over the local shard of the parameters (all of
    them without the distributed optimizer)."""
    sharded_over = np.where(sh.distributed_optimizer, gradient_ranks(sh.dp, sh.layer.cp), 1.0)
    shard = sh.params_per_gpu / sharded_over
    return (OPTIMIZER_STATE_TRAFFIC + k["gradient_bytes"]) * shard / _memory_rate(sh.layer, k)


LAYER_PARTS = ("gemm", "attention", "elementwise", "recompute", "tp_comm", "cp_comm",
               "overhead")
"""The parts of one layer's seconds for one micro-batch (`layer_seconds`), each a component
of the step (times the layer passes of the slowest stage)."""


def layer_seconds(layer: LayerShape, k: Mapping[str, Array]) -> dict[str, Array]:
    """Seconds of one layer for one micro-batch: each of `LAYER_PARTS`, `layer` (their sum),
    `forward` (its forward pass, compute, collectives and launches: the window behind which
    a weight gather can hide) and `logits` (the output layer and loss of the last stage)."""
    compute = layer_compute(layer, k)
    links = layer_links(layer, k)
    tp_fwd_s, tp_comm_s = tensor_parallel_s(layer, links)
    forward_kernels, kernels = kernel_launches(layer)
    # The recomputed forward's collectives are counted with the communication (tp_comm).
    parts = {
        "gemm": compute.gemm_s,
        "attention": compute.attention_s,
        "elementwise": compute.elementwise_s,
        "recompute": recompute_s(layer, compute),
        "tp_comm": tp_comm_s,
        "cp_comm": context_parallel_exposed_s(layer, links, compute.attention_s),
        "overhead": kernels * k["kernel_overhead_s"],
    }
    return {
        **parts,
        "layer": sum(parts.values()),
        "forward": compute.forward_s + tp_fwd_s + forward_kernels * k["kernel_overhead_s"],
        "logits": logits_s(layer, k),
    }


def time_breakdown(sh: Shapes, k: Mapping[str, Array]) -> dict[str, Array]:
    """Seconds per optimizer step by component; the components sum to the step time.

    A layer's parts for one micro-batch (worked out once per distinct layer shape), times
    the slowest stage's layers and the micro-batches, plus that stage's output layer, the
    stage-boundary sends, the bubble, the exposed data-parallel communication and the
    optimizer step.
    """
    layer = sh.per_layer(layer_seconds, k)
    links = step_links(sh, k)
    layer_s, logits = layer["layer"], layer["logits"]
    stage_layers, stage_logits = slowest_stage(sh, layer_s, logits)
    m = sh.micro_batches
    layers_per_step = m * stage_layers  # layer passes of the slowest stage in one step
    parts = {name: layers_per_step * layer[name] for name in LAYER_PARTS}
    return {
        **parts,
        "logits": m * stage_logits,
        "pp_comm": m * pipeline_p2p_s(sh, links),
        "bubble": bubble_s(sh, layer_s, logits),
        "dp_comm": data_parallel_exposed_s(
            sh, k, links, stage_layers, layer_s, layer["forward"]),
        "optimizer": optimizer_step_s(sh, k),
    }
