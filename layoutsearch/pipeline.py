"""How a layout splits the transformer layers over its pipeline stages.

One rule serves the cost model (which prices the heaviest stages) and the Megatron-LM
command (which states the first and last stage's layers when the split is uneven): an even
split when `pp` divides the layers; otherwise the middle stages get c = ceil(L/pp), and the
first and last share the rest, the last the smaller half (it also runs the output layer and
the loss; the first keeps pp micro-batches of activations under 1F1B). When that would leave
an end stage empty (L=5, pp=4) the middle stages get floor(L/pp) and the first the remainder.

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
    ends = layers - (stages - 2) * middle
    fallback = ~even & (ends < 2)
    first = np.where(even, base, np.where(fallback, layers - (stages - 1) * base,
                                          ends - ends // 2))
    last = np.where(even, base, np.where(fallback, base, ends // 2))
    middle = np.where(fallback, base, middle)
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
