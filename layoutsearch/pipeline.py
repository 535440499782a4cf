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

    first, middle, last = stage_split(np.array([60]), np.array([8]))   # 6, 8, 6
    stage_layers(31, 4)                                                 # [8, 8, 8, 7]
"""

from __future__ import annotations

import numpy as np

from layoutsearch.errors import LayoutSearchError


def stage_split(num_layers: np.ndarray, pp: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
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
    return first, middle, last


def stage_layers(num_layers: int, pp: int) -> list[int]:
    """The layers of every stage, first to last (the split of `stage_split`)."""
    if pp < 1 or num_layers < pp:
        raise LayoutSearchError(
            f"num_layers={num_layers}, pp={pp}: every pipeline stage needs a layer "
            "(num_layers >= pp >= 1)"
        )
    first, middle, last = (int(a[0]) for a in stage_split(np.array([num_layers]),
                                                           np.array([pp])))
    if pp == 1:
        return [first]
    return [first, *[middle] * (pp - 2), last]
