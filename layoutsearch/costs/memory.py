"""Peak device memory per GPU, by component, for every row of a candidate table.

Sources: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (activations per layer, sequence parallelism, selective recomputation, 1F1B
micro-batches in flight, interleaving); Megatron-LM `theoretical_memory_usage.py` (weights,
gradients, optimizer state). The GPT formula is re-derived for LLaMA blocks: RMSNorm, a
SwiGLU MLP with three matrices, rotary embeddings, no dropout. Bytes are bf16 (2) unless
named fp32 (4).

Left out: the embedding lookup's activations, RoPE's cos/sin tables, the loss's per-token
scalars, fragmentation beyond the calibrated `memory_overhead_gib`.

    parts = memory_breakdown(shapes, constants)   # bytes per component, one array each
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from layoutsearch.costs.links import gradient_ranks
from layoutsearch.costs.shapes import Array, LayerShape, Shapes, at_stage, peak_stage

GIB = 2.0**30

# Bytes kept per element of the s×s attention scores, per kernel. `torch` keeps the fp32
# softmax output (4) and its bf16 copy fed to the AV matmul (2); Megatron's fused
# scale-mask-softmax keeps only its bf16 output (2); FlashAttention recomputes the scores
# in the backward pass and keeps none (Dao et al. 2022).
SCORE_BYTES = {"torch": 6.0, "fused": 2.0, "flash1": 0.0, "flash2": 0.0, "flash3": 0.0}

# Bytes kept per element of each norm's input. The fused RMSNorm kernel keeps its bf16
# input (2) and a per-token rstd; PyTorch's RMSNorm keeps the fp32 upcast for pow/mul (4)
# and the bf16 normalized value multiplied by the weight (2).
NORM_BYTES_FUSED, NORM_BYTES_UNFUSED = 2.0, 6.0

# Bytes per parameter of the fp32 optimizer state: master weights, Adam's two moments.
OPTIMIZER_BYTES = 12.0
WEIGHT_BYTES = 2.0


def activation_bytes_per_layer(layer: LayerShape) -> tuple[Array, Array, Array]:
    """Bytes of one layer for one micro-batch: (kept for backward, rebuilt during its
    backward, its input).

    `kept` is what the layer stores under the row's selective or mlp recompute (all of it
    under none or full); `rebuilt` is what the row's recompute drops and brings back for
    the layer whose backward runs; the input is what full recomputation stores instead.
    Token-wise tensors of width h are replicated on every TP rank unless sequence
    parallelism splits them (Korthikanti §4.2.2); head- and ffn-sharded tensors divide by tp.
    """
    T, h, f, t = layer.tokens, layer.hidden, layer.ffn, layer.tp
    replicated = np.where(layer.sequence_parallel, 1.0 / t, 1.0)
    width_h = 2.0 * T * h * replicated  # one bf16 token-wise tensor of width h
    norm_bytes = np.where(layer.fused_norm, NORM_BYTES_FUSED, NORM_BYTES_UNFUSED)
    norms = 2 * norm_bytes * T * h * replicated  # two norms per block
    linear_inputs = 2 * width_h  # QKV and FC1 keep the norms' outputs
    qkv = 2.0 * T * (h + 2 * layer.kv_width) / t  # q, k, v for the attention backward
    context = 2.0 * T * h / t  # attention output, input of the output projection
    scores = layer.per_attention(SCORE_BYTES) * T * layer.seq * layer.heads / t
    # SwiGLU keeps gate and up (4 bytes per ffn element) and their product for FC2 (2);
    # a GELU MLP keeps its input and output (2 + 2).
    mlp = np.where(layer.swiglu, 6.0, 4.0) * T * f / t
    # Selective recomputes softmax(QK^T)V. Under mlp recompute the MLP's checkpoint keeps
    # its input: with the local layers the pre-MLP norm's output (FC1's input, still kept);
    # with Transformer Engine's the norm is inside FC1 (TELayerNormColumnParallelLinear,
    # pre_mlp_layernorm=IdentityOp in gpt_layer_specs.py), so the checkpoint keeps the
    # residual stream, already kept as the norm's input, and FC1's input is recomputed.
    # What a checkpoint drops comes back one layer at a time (CheckpointFunction.backward).
    fc1_input = np.where(layer.transformer_engine, width_h, 0.0)
    whole = norms + linear_inputs + qkv + context + scores + mlp
    # Full recomputation reruns the layer from its checkpointed input, which the rerun
    # forward receives detached, not copied (CheckpointFunction.backward, detach_variable):
    # a fused norm keeps that very bf16 tensor as its input, so it is stored once, as the
    # checkpoint. PyTorch's RMSNorm keeps an fp32 upcast instead, which is rebuilt.
    checkpoint_reused = np.where(layer.fused_norm, width_h, 0.0)
    full = layer.is_recompute("full")
    rebuilt = np.select(
        [layer.is_recompute("selective"), layer.is_recompute("mlp"), full],
        [scores, mlp + fc1_input, whole - checkpoint_reused], default=0.0)
    kept = np.where(full, whole, whole - rebuilt)
    return kept, rebuilt, width_h


def layer_activation_bytes(layer: LayerShape) -> dict[str, Array]:
    """Bytes of one layer for one micro-batch: `stored` while other layers run (its input
    under full recomputation, else what it keeps for the backward) and `rebuilt` during its
    own backward (`activation_bytes_per_layer`)."""
    kept, rebuilt, layer_input = activation_bytes_per_layer(layer)
    return {"stored": np.where(layer.is_recompute("full"), layer_input, kept),
            "rebuilt": rebuilt}


def memory_breakdown(sh: Shapes, k: Mapping[str, Array]) -> dict[str, Array]:
    """Bytes per GPU at the peak of the most loaded pipeline stage, by component.

    Three stages can hold the peak: the first (the most micro-batches in flight and the
    input embedding), the second (one micro-batch fewer, but a full middle share of layers
    when the first is trimmed), and the last (the output layer and the logits).
    """
    P = sh.stage_params  # (3, rows)
    # The distributed optimizer shards over the data- and context-parallel ranks together.
    shard = np.where(sh.distributed_optimizer, gradient_ranks(sh.dp, sh.layer.cp), 1.0)
    static = {
        "weights": WEIGHT_BYTES * P,
        "gradients": k["gradient_bytes"] * P,
        "optimizer": OPTIMIZER_BYTES * P / shard,
    }

    # Worked out once per distinct layer shape. The tensors counted there are a floor:
    # unfused kernels keep extra copies and the caching allocator fragments (calibrated
    # `activation_memory_factor`).
    layer = sh.per_layer(layer_activation_bytes)
    stored_per_layer = layer["stored"] * k["activation_memory_factor"]
    rebuilt = layer["rebuilt"] * k["activation_memory_factor"]
    # What recomputation drops comes back for one layer during its backward, on top of
    # what every layer of every micro-batch in flight stores: with full recomputation the
    # layer's working set beside its checkpoint, with selective its attention scores, with
    # mlp its MLP.
    exists = sh.stage_layers > 0
    activations = np.where(
        exists, sh.stage_layers * sh.stage_in_flight * stored_per_layer + rebuilt, 0.0)
    # Logits at the loss, on the last stage: bf16 output, fp32 upcast, softmax and gradient
    # coexist (`logit_bytes` per value). Megatron's vocabulary-parallel cross entropy keeps
    # 1/tp of the vocabulary per rank; a loss over gathered logits (`logits_sharded_by_tp`
    # = 0) keeps all of it.
    vocab_share = np.where(k["logits_sharded_by_tp"] > 0, 1.0 / sh.layer.tp, 1.0)
    last_stage_logits = k["logit_bytes"] * sh.layer.tokens * sh.layer.vocab * vocab_share
    totals = sum(static.values()) + activations
    totals[2] += last_stage_logits
    peak = peak_stage(totals)
    parts = {name: at_stage(value, peak) for name, value in static.items()}
    parts["activations"] = at_stage(activations, peak)
    parts["logits"] = np.where(peak == 2, last_stage_logits, 0.0)
    parts["overhead"] = np.full(P.shape[1], k["memory_overhead_gib"] * GIB)
    return parts
