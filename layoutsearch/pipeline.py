"""How a layout splits the transformer layers over its pipeline stages.

One rule serves the cost model (which prices the heaviest stages) and the Megatron-LM
command (which states the first and last stage's layers when the split is uneven): an even
split when `pp` divides the layers; otherwise the middle stages get c = ceil(L/pp), and the
first and last share the rest, the last the smaller half (it also runs the output layer and
the loss; the first keeps pp micro-batches of activations under 1F1B). When that would leave
an end stage empty (L=5, pp=4; L=40, pp=16) the middle stages get floor(L/pp) and the first
and last share the rest the same way ([2, 1, 1, 1]; [6, 2 × 14, 6]): Megatron-LM splits the
middle stages evenly, so the ends take what is left, and halving it keeps the heaviest
stage as light as such a split allows.

Interleaved (vp > 1), Megatron-LM splits every stage into vp equal chunks. Where pp·vp does
not divide the layers but does divide them with the input embedding and the loss counted as
a layer each (--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-
split), each stage takes (L+2)/pp of those slots and the first and last stage's end chunks
one transformer layer fewer: Llama 3 405B, 126 layers on pp 16 × vp 2, builds
[7, 8 × 14, 7], in chunks of [3, 4] on the first stage and [4, 3] on the last. The choice
is automatic: the flags only where interleaving needs them. Without interleaving the
first/last split above already gives such a model the same stages (126 on 16: [7, 8 × 14, 7]).

    first, middle, last = stage_split(np.array([60]), np.array([8]))   # 6, 8, 6
    stage_layers(31, 4)                                                 # [8, 8, 8, 7]
    stage_layers(126, 16, vp=2)                                         # [7, 8, ..., 8, 7]
"""

from __future__ import annotations

import numpy as np

from layoutsearch.errors import LayoutSearchError

EMBEDDING_AND_LOSS = 2
"""Layers the input embedding and the loss count as with Megatron-LM's
--account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split."""


def counts_embedding_and_loss(num_layers: np.ndarray, pp: np.ndarray,
                              vp: np.ndarray) -> np.ndarray:
    """Per row, whether the interleaved split counts the embedding and the loss as layers:
    where pp·vp divides the layers only with them (megatron/training/arguments.py,
    validate_args, adds one layer for each flag before asking num_layers % pp == 0 and
    layers per stage % layers per virtual stage == 0)."""
    layers, stages, chunks = (np.asarray(a, dtype=np.int64) for a in (num_layers, pp, vp))
    slots = stages * chunks
    return ((chunks > 1) & (stages > 1) & (layers % slots != 0)
            & ((layers + EMBEDDING_AND_LOSS) % slots == 0))


def split_layers(num_layers: int, pp: int, vp: int) -> int:
    """The layers Megatron-LM splits into pp·vp chunks: the model's, and the embedding and
    the loss where they count as layers (`counts_embedding_and_loss`)."""
    accounted = bool(counts_embedding_and_loss(np.array(num_layers), np.array(pp), np.array(vp)))
    return num_layers + EMBEDDING_AND_LOSS * accounted


def stage_split(num_layers: np.ndarray, pp: np.ndarray, vp: np.ndarray | int = 1,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Layers of the first, each middle and the last stage, per row (integer arrays).

    With pp = 1 all three are the whole model; with pp = 2 there is no middle stage (its
    entry is still defined, and callers ignore it).
    """
    layers = np.asarray(num_layers, dtype=np.int64)
    stages = np.asarray(pp, dtype=np.int64)
    base, extra = np.divmod(layers, stages)
    even = extra == 0
    middle = np.where(even, base, base + 1)
    middle = np.where(layers - (stages - 2) * middle < 2, base, middle)  # no empty end stage
    ends = layers - (stages - 2) * middle
    first = np.where(stages == 1, layers, ends - ends // 2)
    last = np.where(stages == 1, layers, ends // 2)
    # get_num_layers_to_build (megatron/core/transformer/transformer_block.py): each stage
    # builds (L+2)/pp slots in vp chunks, one layer fewer in the first stage's first chunk
    # (the embedding's slot) and the last stage's last chunk (the loss's);
    # get_transformer_layer_offset (transformer_layer.py) numbers the layers to match.
    accounted = counts_embedding_and_loss(layers, stages, np.broadcast_to(vp, stages.shape))
    share = (layers + EMBEDDING_AND_LOSS) // stages
    first = np.where(accounted, share - 1, first)
    middle = np.where(accounted, share, middle)
    last = np.where(accounted, share - 1, last)
    return first, middle, last


def stage_layers(num_layers: int, pp: int, vp: int = 1) -> list[int]:
    """The layers of every stage, first to last (the split of `stage_split`)."""
    if pp < 1 or num_layers < pp:
        raise LayoutSearchError(
            f"num_layers={num_layers}, pp={pp}: every pipeline stage needs a layer "
            "(num_layers >= pp >= 1)"
        )
    first, middle, last = (int(a[0]) for a in stage_split(
        np.array([num_layers]), np.array([pp]), np.array([vp])))
    if pp == 1:
        return [first]
    return [first, *[middle] * (pp - 2), last]


def chunk_forwards(forwards: np.ndarray, pp: np.ndarray, vp: np.ndarray,
                   chunk: np.ndarray) -> np.ndarray:
    """Of a pipeline rank's first `forwards` model-chunk forwards under Megatron-LM's
    interleaved schedule, how many run model chunk `chunk` (0-based): the schedule takes pp
    micro-batches through chunk 0, the same pp through chunk 1, ..., then the next pp
    (get_schedule_table in megatron/core/pipeline_parallel/schedules.py, micro-batch groups
    of --microbatch-group-size-per-virtual-pipeline-stage, pp by default)."""
    group = pp * vp
    return np.floor(forwards / group) * pp + np.clip(np.mod(forwards, group) - chunk * pp, 0, pp)
