"""Feasibility rules: which candidate layouts cannot run, each with a readable reason.

Most rules are the ones Megatron-LM enforces in `megatron/training/arguments.py`
(`validate_args`) and at model construction; the others are kernel limits
(Megatron's fused softmax `is_kernel_available`, FlashAttention's head-size limits and
GPU requirements). Every rule works on a whole candidate table at once; an infeasible row
stays in the result with its reasons, it is never an exception.

    reasons = violations(table, clusters)   # "" where a row passes every rule
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.layout import FLASH_ATTENTION, uses_transformer_engine
from layoutsearch.pipeline import EMBEDDING_AND_LOSS, counts_embedding_and_loss
from layoutsearch.specs import ClusterSpec

Frame = pd.DataFrame


def _text(column: pd.Series) -> pd.Series:
    return column.astype(str)


@dataclass(frozen=True, slots=True)
class Rule:
    """One condition a layout must meet."""

    name: str
    violated: Callable[[Frame], np.ndarray]
    """Boolean mask over the rows that break the rule."""
    explain: Callable[[Frame], pd.Series]
    """The reason for each row of a sub-table of violating rows."""
    columns: tuple[str, ...]
    """The columns `explain` reads: reasons are formatted once per distinct combination."""


def _head_dim(t: Frame) -> pd.Series:
    return t["hidden_size"] // t["num_attention_heads"]


def _num_micro_batches(t: Frame) -> pd.Series:
    per_step = t["micro_batch_size"] * t["dp"].clip(lower=1)
    return t["global_batch_size"] // per_step


def _softmax_batches_per_block(seq_per_rank: Any) -> Any:
    # get_batch_per_block in Megatron's scaled_masked_softmax.h: a block is 128 threads,
    # 4 warps of 32 lanes, and a warp takes 2 rows where sk rounds up to <= 128, else 1.
    return np.where(seq_per_rank <= 128, 8, 4)


def _seq_per_rank(t: Frame | Mapping[str, Any]) -> Any:
    return t["seq_length"] // t["cp"]


def _attention_batches(t: Frame | Mapping[str, Any]) -> Any:
    return t["micro_batch_size"] * (t["num_attention_heads"] // t["tp"])


def _te_softmax(t: Frame | Mapping[str, Any]) -> Any:
    """Whether a `fused` layout's command runs Transformer Engine's layers, and so its
    softmax kernel, not Megatron-LM's (layout.uses_transformer_engine)."""
    return uses_transformer_engine(False, t["rmsnorm_kernel"], t["sequence_parallel"], t["tp"])


def _megatron_softmax_takes(s: Any, batches: Any) -> Any:
    # Megatron's FusedScaleMaskSoftmax.is_kernel_available (megatron/core/fusions/
    # fused_softmax.py): 16 < sk <= 4096, sq and sk multiples of 4, and micro-batch x heads
    # per TP rank a multiple of the kernel's batches per block.
    return ((s > 16) & (s <= 4096) & (s % 4 == 0)
            & (batches % _softmax_batches_per_block(s) == 0))


def _te_softmax_takes(s: Any, batches: Any) -> Any:
    # Transformer Engine's FusedScaleMaskSoftmax.is_kernel_available (pytorch/attention/
    # dot_product_attention/softmax.py): 16 < sk < 16384, sk a multiple of 8, micro-batch x
    # heads per TP rank a multiple of 4, and sq (= sk here) of the batches per block.
    return ((s > 16) & (s < 16384) & (s % 8 == 0) & (batches % 4 == 0)
            & (s % _softmax_batches_per_block(s) == 0))


def fused_softmax_takes(t: Frame | Mapping[str, Any]) -> Any:
    """Whether the fused softmax kernel the layout's command runs takes its scores:
    Transformer Engine's or Megatron-LM's, whose limits differ. Per row of a candidate
    table; one numpy bool for one row's mapping of plain values (a single command is checked
    without building a table: ~3 ms each, 1,000 per search)."""
    s, batches = _seq_per_rank(t), _attention_batches(t)
    return np.where(_te_softmax(t), _te_softmax_takes(s, batches),
                    _megatron_softmax_takes(s, batches))


def _fused_softmax_refusal(t: Frame) -> pd.Series:
    s, batches = _seq_per_rank(t), _attention_batches(t)
    per_block = _text(pd.Series(_softmax_batches_per_block(s), index=t.index))
    te = ("Transformer Engine's fused softmax kernel unavailable: needs 16 < seq_length/cp ("
          + _text(s) + ") < 16384, a multiple of 8 and of " + per_block
          + ", and micro_batch_size·heads/tp (" + _text(batches) + ") divisible by 4")
    megatron = ("fused softmax kernel unavailable: needs 16 < seq_length/cp (" + _text(s)
                + ") <= 4096, a multiple of 4, and micro_batch_size·heads/tp ("
                + _text(batches) + ") divisible by " + per_block)
    return pd.Series(np.where(_te_softmax(t), te, megatron), index=t.index)


FUSED_SOFTMAX_SHAPE = Rule(
    "fused_softmax_shape",
    lambda t: ((t["attention"] == "fused") & ~fused_softmax_takes(t)).to_numpy(),
    _fused_softmax_refusal,
    ('seq_length', 'cp', 'micro_batch_size', 'num_attention_heads', 'tp', 'rmsnorm_kernel',
     'sequence_parallel'),
)
"""Where the fused softmax kernel takes the attention scores; elsewhere FusedScaleMaskSoftmax
(Megatron-LM's, or Transformer Engine's where the command runs TE's layers) silently runs
PyTorch's softmax, so a `fused` layout would measure `torch` attention."""


def _flash_head_dim_limit(t: Frame) -> pd.Series:
    # FlashAttention 1 supports head dimensions up to 128, FlashAttention 2 and 3 up to 256.
    limits = t["attention"].map({"flash1": 128.0, "flash2": 256.0, "flash3": 256.0})
    return limits.astype(float).fillna(np.inf)


FLASH_HEAD_DIM_MULTIPLE = 8
"""Transformer Engine turns FlashAttention off for a head dimension that is not a multiple
of 8 (dot_product_attention/utils.py, get_attention_backend), and with
--attention-backend flash no other backend is left: the run fails."""


def _flash_head_dim_refused(t: Frame) -> pd.Series:
    flash = t["attention"].isin(FLASH_ATTENTION)
    return (_head_dim(t) > _flash_head_dim_limit(t)) | (
        flash & (_head_dim(t) % FLASH_HEAD_DIM_MULTIPLE != 0))


def build_rules(clusters: Mapping[str, ClusterSpec]) -> list[Rule]:
    """The rules, bound to the GPU facts they need (FlashAttention 3 needs Hopper)."""
    hopper = {name for name, c in clusters.items() if c.gpu.supports_flash3}
    return [
        Rule(
            "world_size",
            lambda t: (t["num_gpus"] % (t["tp"] * t["pp"] * t["cp"]) != 0).to_numpy(),
            lambda t: "tp·pp·cp (" + _text(t["tp"] * t["pp"] * t["cp"])
            + ") must divide num_gpus (" + _text(t["num_gpus"]) + ")",
            ('tp', 'pp', 'cp', 'num_gpus'),
        ),
        Rule(
            "global_batch",
            lambda t: ((t["dp"] > 0) & (t["global_batch_size"]
                       % (t["micro_batch_size"] * t["dp"].clip(lower=1)) != 0)).to_numpy(),
            lambda t: "global_batch_size (" + _text(t["global_batch_size"])
            + ") must divide by micro_batch_size·dp (" + _text(t["micro_batch_size"]) + "·"
            + _text(t["dp"]) + ")",
            ('global_batch_size', 'micro_batch_size', 'dp'),
        ),
        Rule(
            # Uneven stages are allowed (Megatron-LM: --decoder-first/last-pipeline-num-layers;
            # the study ran 60 layers on 8 and 16 stages); each stage needs a layer.
            "layers_per_stage",
            lambda t: (t["num_layers"] < t["pp"] * t["vp"]).to_numpy(),
            lambda t: "num_layers (" + _text(t["num_layers"]) + ") must be at least pp·vp ("
            + _text(t["pp"] * t["vp"]) + ")",
            ('num_layers', 'pp', 'vp'),
        ),
        Rule(
            # Megatron-LM interleaves equal chunks of num_layers/(pp·vp) layers, or, with the
            # embedding and the loss counted as a layer each, of (num_layers+2)/(pp·vp) slots
            # (pipeline.stage_split): the command emits those flags where it needs them.
            "interleaving_layer_split",
            lambda t: ((t["vp"] > 1) & (t["num_layers"] % (t["pp"] * t["vp"]) != 0)).to_numpy()
            & ~counts_embedding_and_loss(*(t[c].to_numpy() for c in ("num_layers", "pp", "vp"))),
            lambda t: "interleaving needs num_layers (" + _text(t["num_layers"])
            + ") to divide by pp·vp (" + _text(t["pp"] * t["vp"]) + "), or num_layers + 2 ("
            + _text(t["num_layers"] + EMBEDDING_AND_LOSS) + ") with the embedding and the "
            "loss counted as layers (Megatron-LM's --account-for-embedding-in-pipeline-split "
            "and --account-for-loss-in-pipeline-split): layoutsearch's commands do not emit "
            "Megatron-LM's other uneven interleaving (--num-virtual-stages-per-pipeline-rank "
            "with --decoder-first/last-pipeline-num-layers)",
            ('num_layers', 'pp', 'vp'),
        ),
        Rule(
            "heads_per_tp",
            lambda t: (t["num_attention_heads"] % t["tp"] != 0).to_numpy(),
            lambda t: "num_attention_heads (" + _text(t["num_attention_heads"])
            + ") must divide by tp (" + _text(t["tp"]) + ")",
            ('num_attention_heads', 'tp'),
        ),
        Rule(
            # ColumnParallelLinear splits FC1's output over TP ranks: divide() asserts it.
            "ffn_per_tp",
            lambda t: (t["ffn_hidden_size"] % t["tp"] != 0).to_numpy(),
            lambda t: "ffn_hidden_size (" + _text(t["ffn_hidden_size"])
            + ") must divide by tp (" + _text(t["tp"]) + ")",
            ('ffn_hidden_size', 'tp'),
        ),
        Rule(
            # Sequence parallelism splits each CP rank's sequence chunk over the TP ranks;
            # scatter_to_sequence_parallel_region asserts the first dimension divides by tp.
            "sequence_parallel_split",
            lambda t: (t["sequence_parallel"] & (t["tp"] > 1)
                       & ((t["seq_length"] // t["cp"]) % t["tp"] != 0)).to_numpy(),
            lambda t: "sequence parallelism needs seq_length/cp ("
            + _text(t["seq_length"] // t["cp"]) + ") to divide by tp (" + _text(t["tp"]) + ")",
            ('seq_length', 'cp', 'tp'),
        ),
        Rule(
            "query_groups_per_tp",
            lambda t: ((t["num_attention_heads"] % t["tp"] == 0)
                       & (t["num_query_groups"] % t["tp"] != 0)).to_numpy(),
            # Megatron-LM's Attention splits the K/V groups over the TP ranks:
            # divide(num_query_groups, tensor-parallel world size) asserts it.
            lambda t: "num_query_groups (" + _text(t["num_query_groups"])
            + ") must divide by tp (" + _text(t["tp"]) + "): Megatron-LM splits the K/V "
            "groups over the TP ranks",
            ('num_query_groups', 'tp'),
        ),
        Rule(
            "context_parallel_chunks",
            lambda t: ((t["cp"] > 1) & (t["seq_length"] % (2 * t["cp"]) != 0)).to_numpy(),
            lambda t: "seq_length (" + _text(t["seq_length"]) + ") must divide by 2·cp ("
            + _text(2 * t["cp"]) + ") for load-balanced causal context parallelism",
            ('seq_length', 'cp'),
        ),
        Rule(
            # Megatron-LM splits the sequence over CP ranks only inside Transformer Engine's
            # flash/fused attention: its own DotProductAttention asserts "Context parallelism
            # is only supported by TEDotProductAttention!" (megatron/core/transformer/
            # dot_product_attention.py) and TE turns its unfused attention off under CP.
            "context_parallel_needs_flash",
            lambda t: ((t["cp"] > 1) & ~t["attention"].str.startswith("flash")).to_numpy(),
            lambda t: "cp (" + _text(t["cp"]) + ") > 1 needs FlashAttention, not "
            + _text(t["attention"]) + " attention",
            ('cp', 'attention'),
        ),
        Rule(
            "interleaving_needs_pipeline",
            lambda t: ((t["vp"] > 1) & (t["pp"] == 1)).to_numpy(),
            lambda t: "vp (" + _text(t["vp"]) + ") > 1 needs pp > 1",
            ('vp',),
        ),
        Rule(
            "interleaving_micro_batches",
            lambda t: ((t["vp"] > 1) & (t["pp"] > 1) & (t["dp"] > 0)
                       & (_num_micro_batches(t) % t["pp"] != 0)).to_numpy(),
            lambda t: "interleaving needs micro-batches per step (" + _text(_num_micro_batches(t))
            + ") to divide by pp (" + _text(t["pp"]) + ")",
            ('global_batch_size', 'micro_batch_size', 'dp', 'pp'),
        ),
        FUSED_SOFTMAX_SHAPE,
        Rule(
            "flash_head_dim",
            lambda t: _flash_head_dim_refused(t).to_numpy(),
            lambda t: _text(t["attention"]) + " supports head dimensions up to "
            + _flash_head_dim_limit(t).astype(int).astype(str) + " that are multiples of "
            + str(FLASH_HEAD_DIM_MULTIPLE) + ", the model has " + _text(_head_dim(t)),
            ('attention', 'hidden_size', 'num_attention_heads'),
        ),
        Rule(
            "flash3_needs_hopper",
            lambda t: ((t["attention"] == "flash3") & ~t["gpu"].isin(hopper)).to_numpy(),
            lambda t: f"flash3 needs a Hopper GPU ({', '.join(sorted(hopper)) or 'none known'}), "
            + "not " + _text(t["gpu"]),
            ('gpu',),
        ),
        Rule(
            "rmsnorm_kernel_needs_rmsnorm",
            lambda t: (t["rmsnorm_kernel"] & (t["normalization"] != "RMSNorm")).to_numpy(),
            lambda t: "the fused RMSNorm kernel needs normalization RMSNorm, the model uses "
            + _text(t["normalization"]),
            ('normalization',),
        ),
    ]


def _explain_once_each(rule: Rule, rows: Frame) -> tuple[np.ndarray, list[str]]:
    """Codes of the rows' distinct value combinations and one reason per combination.

    Each column is factorized and the codes combined into one integer key (mixed radix);
    decoding the distinct keys gives the value combinations to explain.
    """
    key = np.zeros(len(rows), dtype=np.int64)
    levels = []
    for column in rule.columns:
        codes, uniques = pd.factorize(rows[column])
        key = key * len(uniques) + codes
        levels.append(np.asarray(uniques))
    inverse, distinct = _distinct(key)
    values: dict[str, np.ndarray] = {}
    remainder = distinct
    for column, uniques in reversed(list(zip(rule.columns, levels, strict=True))):
        values[column] = uniques[remainder % len(uniques)]
        remainder = remainder // len(uniques)
    frame = pd.DataFrame({column: values[column] for column in rule.columns})
    return inverse, rule.explain(frame).astype(str).tolist()


def _distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per key the index of its value among the distinct ones, and those values in order of
    first appearance: hashing a million keys, not sorting them (10x faster)."""
    inverse, distinct = pd.factorize(keys)
    return inverse, np.asarray(distinct)


def violation_codes(table: Frame, clusters: Mapping[str, ClusterSpec],
                    ) -> tuple[np.ndarray, list[str]]:
    """Per row, an index into the reasons it breaks rules, each joined by '; ' ("" where a
    row breaks none); `violations` as codes and their texts (a few thousand texts for a
    million rows).

    Each row carries a code for its combination of reasons so far; every rule refines the
    codes, and the text of each distinct combination is built once.
    """
    combination = np.zeros(len(table), dtype=np.int64)
    combination_texts = [""]
    for rule in build_rules(clusters):
        mask = rule.violated(table)
        if not mask.any():
            continue
        codes, texts = _explain_once_each(rule, table.loc[mask, list(rule.columns)])
        reason_ids = np.zeros(len(table), dtype=np.int64)
        reason_ids[mask] = codes + 1  # 0: the row passes this rule
        width = len(texts) + 1
        combination, keys = _distinct(combination * width + reason_ids)
        combination_texts = [
            "; ".join(filter(None, (combination_texts[key // width],
                                    texts[key % width - 1] if key % width else "")))
            for key in keys.tolist()
        ]
    return combination, combination_texts


def violations(table: Frame, clusters: Mapping[str, ClusterSpec]) -> pd.Series:
    """Per row, the reasons it breaks rules joined by '; ' ("" where it breaks none)."""
    codes, texts = violation_codes(table, clusters)
    return pd.Series(np.array(texts, dtype=object)[codes], index=table.index, dtype=object)
