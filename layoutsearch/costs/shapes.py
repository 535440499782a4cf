"""The numbers every analytic formula shares, computed once per candidate table.

`Shapes` turns the measurement-schema columns of a candidate table into float arrays
(one entry per row) plus derived sizes: tokens per micro-batch, micro-batches per step,
layers per stage and parameters per GPU. Formulas in `memory.py` and `timing.py` read only
these arrays, so each formula is written once and scores every row in one call. What every
row shares (a search's model, cluster and batch) is held as one number; the pipeline's
shapes are worked out once per distinct layout size (`distinct.per_distinct`), and one
layer's figures once per distinct `LayerShape` (`Shapes.per_layer`): a million rows hold a
few thousand of each.

    shapes = Shapes.of(table, clusters)
    shapes.params_per_gpu  # parameters held by the most loaded pipeline stage, per GPU
    shapes.layer.tokens    # tokens of one micro-batch on one GPU
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.costs.distinct import groups, per_distinct, pick
from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.layout import (
    ATTENTION_KERNELS,
    FLASH_ATTENTION,
    RECOMPUTE_KINDS,
    uses_transformer_engine,
)
from layoutsearch.pipeline import chunk_forwards, counts_embedding_and_loss, stage_split
from layoutsearch.specs import ClusterSpec, paper_flops_per_token

VOCAB_DIVISIBLE_BY = 128
"""Megatron-LM's --make-vocab-size-divisible-by default: the vocabulary is padded to a
multiple of it times tp."""

Array = np.ndarray
END_STAGES = np.array([[True], [False], [True]])
"""Which of the three priced stages (first, second, last) are the pipeline's ends."""


def _floats(table: pd.DataFrame, column: str) -> Array:
    return table[column].to_numpy(dtype=np.float64)


def _flags(table: pd.DataFrame, column: str) -> Array:
    return table[column].to_numpy(dtype=bool)


def _uniform(values: Array) -> Array:
    """`values` as one number (a 0-d array) where every row has the same one, as the model,
    the cluster and the job of a search's rows do: numpy broadcasts it over the rows alike,
    and the formulas of such numbers alone (parameters per layer, a GPU's bandwidth) cost
    one operation instead of one per row. Compared bit for bit: -0.0 is not 0.0."""
    bits = values.view(f"u{values.itemsize}")
    if len(bits) and (bits == bits[0]).all():
        return np.asarray(values[0])
    return values


def _job_floats(table: pd.DataFrame, column: str) -> Array:
    return _uniform(_floats(table, column))


def _codes(table: pd.DataFrame, column: str, names: tuple[str, ...]) -> Array:
    """Integer codes of a categorical column, indices into `names` (fast to look up)."""
    return pd.Categorical(table[column], categories=list(names)).codes.astype(np.intp)


def _named(codes: Array, names: tuple[str, ...], chosen: tuple[str, ...]) -> Array:
    """Per row, whether its code (an index into `names`, -1 for a value outside them) is one
    of the `chosen` names: one gather from a flag per name, the last flag (False) read by
    -1 (np.isin hashes or sorts the million codes instead, ~5x slower)."""
    flags = np.zeros(len(names) + 1, dtype=bool)
    flags[[names.index(name) for name in chosen]] = True
    return flags[codes]


def peak_stage(per_stage: Array) -> Array:
    """Per row, which of the three stages of a (3, rows) array (`Shapes.stage_layers`) has
    the largest value: np.argmax(per_stage, axis=0), the first of equal ones, the first NaN
    where there is one. Compared row against row: argmax reads the array across its rows,
    ~2.5x slower."""
    first, middle, last = per_stage
    return np.where(np.isnan(first) | ((first >= middle) & (first >= last)), 0,
                    np.where(np.isnan(middle) | (middle >= last), 1, 2))


def at_stage(per_stage: Array, stage: Array) -> Array:
    """Per row, the entry of a (3, rows) array at that row's `stage` (0, 1 or 2, as
    `peak_stage` gives it): one gather from the flattened array (per_stage[stage, rows]
    gathers by two indices, ~2.5x slower)."""
    rows = per_stage.shape[1]
    return per_stage.reshape(-1).take(stage * rows + np.arange(rows))


def total(parts: Iterable[Array]) -> Array:
    """Per row, the sum of `parts`, added in their order, without copying them into one
    (parts, rows) block first (~120 MB and its page faults for a million rows). The order is
    the same for one row as for many (np.sum over the block sums a single row pairwise), so
    a layout priced alone, as a sampling driver prices it, gets the same bits as in a grid."""
    return functools.reduce(operator.add, parts)


def by_gpu_kind(values: Sequence[float], codes: Array) -> Array:
    """Per row, the value of its GPU kind (`values` in the order of `gpu_codes`' kinds). A
    table of one kind (every search) gets one number, which numpy broadcasts over the rows
    alike: a column of a million copies costs a gather and a read per formula."""
    lookup = np.array(values)
    return np.asarray(lookup[0]) if len(lookup) == 1 else lookup[codes]


def gpu_codes(table: pd.DataFrame) -> tuple[Array, list[str]]:
    """Integer code per row and the GPU kind of each code (one hash pass over the column)."""
    codes, kinds = pd.factorize(table["gpu"])
    return np.asarray(codes), [str(k) for k in kinds]


def _layout_shapes(num_layers: Array, hidden: Array, vocab: Array, untied: Array,
                   per_layer: Array, global_batch: Array, tp: Array, pp: Array, dp: Array,
                   vp: Array, micro_batch: Array,
                   ) -> tuple[Array, Array, Array, Array, Array, Array]:
    """Per row, `Shapes.vocab`, `micro_batches`, the (3, rows) `stage_layers`,
    `stage_in_flight` and `stage_params`, and `params_per_gpu`: the shapes of a model that
    follow from the layout's sizes."""
    # Megatron pads the vocabulary to a multiple of 128·tp (make_vocab_size_divisible_by,
    # arguments.py::_vocab_size_with_padding): the embedding, output layer and logits have
    # that many rows. The model's own parameter count (MFU) stays unpadded.
    divisor = VOCAB_DIVISIBLE_BY * tp
    padded_vocab = np.ceil(vocab / divisor) * divisor
    micro_batches = global_batch / (micro_batch * dp)
    layer_counts, pp_counts, vp_counts = (np.asarray(a).astype(np.int64)
                                          for a in (num_layers, pp, vp))
    first, middle, last = stage_split(layer_counts, pp_counts, vp_counts)
    single = pp == 1
    stage_layers = np.stack([  # pp = 1: one stage, counted as the last (all layers)
        np.where(single, 0, first), np.where(pp > 2, middle, 0), last,
    ], dtype=np.float64)
    # Pipeline ranks of the three stages: the first, the second (the middle stage that
    # holds the most) and the last.
    rank = np.stack([np.zeros_like(pp), np.ones_like(pp), pp - 1])
    # 1F1B: rank r runs pp-r-1 warm-up forwards and holds one more in steady state.
    # Interleaved 1F1B (Megatron's forward_backward_pipelining_with_interleaving):
    # (pp-r-1)·2 + (vp-1)·pp warm-up forwards of model chunks, each 1/vp of the stage's
    # layers, capped at the m·vp chunks of the step; on the first stage that is
    # Korthikanti's pp·(1 + (pp-1)/(pp·vp)) micro-batches (§4.2.3).
    from_here = pp - rank  # stages from each of the three to the last, itself included
    chunks = np.minimum((from_here - 1) * 2 + (vp - 1) * pp + 1, micro_batches * vp)
    stage_in_flight = np.where(vp > 1, chunks / vp, np.minimum(from_here, micro_batches))
    # Where the embedding and the loss count as layers, the first stage's chunk 0 and the
    # last stage's chunk vp-1 are a layer short (pipeline.stage_split): the stage holds
    # chunks·(layers+1)/vp layers less one for each of those chunks in flight.
    trimmed = END_STAGES & counts_embedding_and_loss(layer_counts, pp_counts, vp_counts)
    if trimmed.any():
        short_chunk = np.stack([np.zeros_like(vp), np.zeros_like(vp), vp - 1])
        short = chunk_forwards(chunks, pp, vp, short_chunk)
        stage_in_flight += np.where(
            trimmed, (chunks / vp - short) / np.maximum(stage_layers, 1.0), 0.0)
    # Each end stage holds one vocabulary matrix (input embedding or output layer); a
    # single stage of an untied model holds both. Megatron keeps a copy of a tied
    # embedding on the last stage, so with pp > 1 each end stage holds one either way.
    stage_embeddings = np.stack([
        np.where(single, 0.0, 1.0), np.zeros_like(pp),
        np.where(single & untied, 2.0, 1.0),
    ])
    stage_params = (stage_layers * per_layer + stage_embeddings * padded_vocab * hidden) / tp
    return (padded_vocab, micro_batches, stage_layers, stage_in_flight, stage_params,
            stage_params.max(axis=0))


@dataclass(frozen=True, slots=True)
class LayerShape:
    """What one transformer layer's cost for one micro-batch on one GPU depends on: the
    model's widths, the layout's tensor and context parallelism, micro-batch and kernels,
    and the GPU with the links its collectives run over. Per-row arrays (all float64 unless
    named as flags or indices), or one number for every row.

    Not the pipeline: how the layers split into stages, the micro-batches of a step and the
    gradients' reduction are `Shapes`' own fields. A million candidate rows hold a few
    thousand distinct layer shapes, so the layer's formulas (`timing.layer_seconds`,
    `memory.layer_activation_bytes`) are worked out once per distinct one
    (`Shapes.per_layer`): every field here is part of its key.
    """

    # model
    hidden: Array
    ffn: Array
    heads: Array
    kv_width: Array
    """Width of the K (or V) projection: query groups × head dimension."""
    vocab: Array
    """Vocabulary rows as Megatron pads them (a multiple of VOCAB_DIVISIBLE_BY · tp)."""
    seq: Array
    swiglu: Array  # flags
    # layout
    tokens: Array
    """Tokens of one micro-batch on one GPU: micro_batch · seq / cp."""
    tp: Array
    cp: Array
    sequence_parallel: Array  # flags, False where tp = 1 (a no-op there)
    fused_norm: Array
    """Flags: each norm runs as one kernel. RMSNorm only with the study's RMSNorm kernel;
    LayerNorm always (Apex's FusedLayerNorm, Transformer Engine's, or PyTorch's native
    layer_norm, whichever Megatron-LM's layers use)."""
    transformer_engine: Array
    """Flags: the emitted command runs Transformer Engine's layers, each norm fused into
    the linear after it (layout.uses_transformer_engine)."""
    attention: Array
    """Index into layout.ATTENTION_KERNELS."""
    recompute: Array
    """Index into layout.RECOMPUTE_KINDS."""
    # GPU and cluster
    peak_flops: Array
    """Dense bf16 peak, FLOP/s."""
    memory_bandwidth: Array
    """HBM bytes/s."""
    gpus_per_node: Array
    num_gpus: Array
    intra_node_bandwidth: Array
    inter_node_bandwidth: Array

    def pick(self, rows: Array) -> LayerShape:
        """The rows at the indices `rows`; one number for every row stays as it is."""
        return LayerShape(*(pick(getattr(self, name), rows) for name in LAYER_FIELDS))

    def per_attention(self, values: Mapping[str, float]) -> Array:
        """A number per row looked up by its attention kernel (e.g. bytes per score)."""
        return np.array([values[k] for k in ATTENTION_KERNELS])[self.attention]

    def is_attention(self, *kernels: str) -> Array:
        return _named(self.attention, ATTENTION_KERNELS, kernels)

    def is_recompute(self, *kinds: str) -> Array:
        return _named(self.recompute, RECOMPUTE_KINDS, kinds)

    def per_recompute(self, values: Mapping[str, float]) -> Array:
        """A number per row looked up by its recompute kind, 0 for a kind not in `values`
        (one gather: np.select over the kinds' masks is ~8x slower)."""
        lookup = np.array([values.get(kind, 0.0) for kind in RECOMPUTE_KINDS] + [0.0])
        return lookup[self.recompute]  # -1, a kind outside RECOMPUTE_KINDS, reads the 0


LAYER_FIELDS = tuple(field.name for field in fields(LayerShape))


@dataclass(frozen=True, slots=True)
class Shapes:
    """Per-row arrays of a candidate table (all float64 unless named as flags): one layer's
    shape (`layer`) and how the layout splits the model and the step. A field of the model,
    the cluster or the job is one number (a 0-d array) where every row has the same one, as
    in a search; numpy broadcasts it over the rows alike."""

    layer: LayerShape
    # model
    num_layers: Array
    params_per_layer: Array
    num_parameters: Array
    # job and cluster
    global_batch: Array
    memory_bytes: Array
    # layout
    pp: Array
    dp: Array
    vp: Array
    distributed_optimizer: Array  # flags
    overlap_grad_reduce: Array  # flags
    # derived
    micro_batches: Array
    """Micro-batches per pipeline per optimizer step."""
    stage_layers: Array
    """Shape (3, rows): layers of the first, a middle and the last pipeline stage
    (`pipeline.stage_split`); 0 where a stage does not exist (pp = 1 is one "last" stage)."""
    stage_in_flight: Array
    """Shape (3, rows): micro-batches of its layers each of those stages holds under 1F1B:
    min(pp, m) on the first, min(pp-1, m) on the second, one on the last (Narayanan et al.
    2021); with vp interleaved chunks, Megatron's warm-up counts in chunks over vp, and where
    a stage's chunks differ (`pipeline.stage_split`) its layers in flight over its layers."""
    stage_params: Array
    """Shape (3, rows): parameters on one GPU of each of those stages (layers and the
    vocabulary matrices of the end stages, split over tp)."""
    params_per_gpu: Array
    """Parameters on one GPU of the stage that holds the most."""
    gpu_codes: Array
    """Per row, an index into `gpu_kinds`."""
    gpu_kinds: list[str]
    """The GPU kinds of the table (one lookup per kind, not per row)."""
    layer_groups: tuple[Array, Array] | None
    """A row of each distinct `layer` and, per row, the index of its own among them
    (`distinct.groups`); None where the table is small or no layer shape repeats."""

    @classmethod
    def of(cls, table: pd.DataFrame, clusters: Mapping[str, ClusterSpec]) -> Shapes:
        codes, kinds = gpu_codes(table)
        unknown = set(kinds) - set(clusters)
        if unknown:
            raise LayoutSearchError(unknown_name_message("gpu", sorted(unknown)[0], clusters))

        def per_gpu(attribute: str) -> Array:
            return by_gpu_kind([float(getattr(clusters[k].gpu, attribute)) for k in kinds],
                               codes)

        def per_cluster(attribute: str) -> Array:
            return by_gpu_kind([float(getattr(clusters[k], attribute)) for k in kinds], codes)

        L = _job_floats(table, "num_layers")
        h = _job_floats(table, "hidden_size")
        f = _job_floats(table, "ffn_hidden_size")
        a = _job_floats(table, "num_attention_heads")
        kv = _job_floats(table, "num_query_groups") * h / a
        V = _job_floats(table, "vocab_size")
        swiglu = _uniform(_flags(table, "swiglu"))
        untied = _uniform(_flags(table, "untie_embeddings"))
        # Q and output projections h×h, K and V h×kv, MLP 3 (gated) or 2 matrices, two
        # RMSNorm weights. Biases and LayerNorm's extra vector are below 0.01 % and left out.
        per_layer = 2 * h * h + 2 * h * kv + np.where(swiglu, 3.0, 2.0) * h * f + 2 * h
        num_parameters = L * per_layer + V * h * np.where(untied, 2.0, 1.0) + h
        tp, pp = _floats(table, "tp"), _floats(table, "pp")
        dp = np.maximum(_floats(table, "dp"), 1.0)
        cp = _floats(table, "cp")
        mb = _floats(table, "micro_batch_size")
        seq = _job_floats(table, "seq_length")
        global_batch = _job_floats(table, "global_batch_size")
        vp = _floats(table, "vp")
        # A few thousand distinct (tp, pp, dp, vp, micro-batch size) among a million rows.
        padded_vocab, micro_batches, stage_layers, stage_in_flight, stage_params, \
            params_per_gpu = per_distinct(_layout_shapes, L, h, V, untied, per_layer,
                                          global_batch, tp, pp, dp, vp, mb)
        layer = LayerShape(
            hidden=h, ffn=f, heads=a, kv_width=kv, vocab=padded_vocab, seq=seq, swiglu=swiglu,
            tokens=mb * seq / cp, tp=tp, cp=cp,
            sequence_parallel=_flags(table, "sequence_parallel") & (tp > 1),
            fused_norm=_flags(table, "rmsnorm_kernel") | (table["normalization"] != "RMSNorm")
            .to_numpy(),
            transformer_engine=uses_transformer_engine(
                table["attention"].isin(FLASH_ATTENTION).to_numpy(),
                _flags(table, "rmsnorm_kernel"), _flags(table, "sequence_parallel"), tp),
            attention=_codes(table, "attention", ATTENTION_KERNELS),
            recompute=_codes(table, "recompute", RECOMPUTE_KINDS),
            peak_flops=per_gpu("peak_tflops") * 1e12,
            memory_bandwidth=per_gpu("memory_bandwidth_gbps") * 1e9,
            gpus_per_node=_job_floats(table, "gpus_per_node"),
            num_gpus=_job_floats(table, "num_gpus"),
            intra_node_bandwidth=per_cluster("intra_node_bandwidth_gbps") * 1e9,
            inter_node_bandwidth=per_cluster("inter_node_bandwidth_gbps") * 1e9,
        )
        return cls(
            layer=layer, num_layers=L, params_per_layer=per_layer,
            num_parameters=num_parameters,
            global_batch=global_batch,
            memory_bytes=per_gpu("memory_gib") * 2.0**30,
            pp=pp, dp=dp, vp=vp,
            distributed_optimizer=_flags(table, "distributed_optimizer"),
            overlap_grad_reduce=_flags(table, "overlap_grad_reduce"),
            micro_batches=micro_batches,
            stage_layers=stage_layers,
            stage_in_flight=stage_in_flight,
            stage_params=stage_params,
            params_per_gpu=params_per_gpu,
            gpu_codes=codes,
            gpu_kinds=kinds,
            layer_groups=_layer_groups(layer),
        )

    def pick(self, rows: Array) -> Shapes:
        """The rows at the indices `rows` (e.g. every row several times over, as a memory
        fit prices them); one number for every row stays as it is. Their layers are priced
        row by row: finding the layer shapes of a table many times over costs more than it
        saves (a fit's 218,000-row block of the study's 755 rows: ~60 ms against ~5 ms)."""
        picked: dict[str, Any] = {
            field.name: pick(getattr(self, field.name), rows) for field in fields(self)
            if isinstance(getattr(self, field.name), np.ndarray)}
        return replace(self, **picked, layer=self.layer.pick(rows), layer_groups=None)

    def per_layer(self, formula: Callable[..., dict[str, Array]],
                  *constants: Mapping[str, Array]) -> dict[str, Array]:
        """`formula(self.layer, *constants)`: figures of one layer, each an array per row
        (or one number), worked out on one row of each distinct layer shape and gathered
        back to every row, the same bit for bit as on every row (the formulas are
        element-wise). Constants that differ by row are not part of the layer's key: with
        any, the formula is worked out row by row."""
        per_row_constants = any(np.ndim(value) for c in constants for value in c.values())
        if self.layer_groups is None or per_row_constants:
            return formula(self.layer, *constants)
        first, inverse = self.layer_groups
        return {name: pick(value, inverse)
                for name, value in formula(self.layer.pick(first), *constants).items()}

    def mfu(self, step_time_s: Array) -> Array:
        """The study's MFU of a step of `step_time_s` seconds (Hagemann et al. 2023, after
        PaLM): tokens/s x (6N + 12·L·h·s) FLOPs per token over the GPUs' dense peak."""
        layer = self.layer
        flops_per_token = paper_flops_per_token(self.num_parameters, self.num_layers,
                                                layer.hidden, layer.seq)
        tokens_per_step = self.global_batch * layer.seq
        return tokens_per_step * flops_per_token / (
            step_time_s * layer.num_gpus * layer.peak_flops)


def _layer_groups(layer: LayerShape) -> tuple[Array, Array] | None:
    return groups([v for name in LAYER_FIELDS if np.ndim(v := getattr(layer, name))])
