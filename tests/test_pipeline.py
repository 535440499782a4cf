"""The layer split over pipeline stages that the cost model and the command share."""

from __future__ import annotations

import numpy as np
import pytest

from layoutsearch.errors import LayoutSearchError
from layoutsearch.pipeline import stage_layers, stage_split


@pytest.mark.parametrize(("layers", "pp", "expected"), [
    (40, 1, [40]),
    (40, 8, [5] * 8),
    (41, 2, [21, 20]),
    (31, 4, [8, 8, 8, 7]),
    (60, 8, [6, 8, 8, 8, 8, 8, 8, 6]),
    (60, 16, [2, *[4] * 14, 2]),
    (5, 4, [2, 1, 1, 1]),
    (40, 16, [6, *[2] * 14, 6]),  # not [10, 2, ..., 2]: the ends share what is left
])
def test_stage_layers(layers: int, pp: int, expected: list[int]) -> None:
    assert stage_layers(layers, pp) == expected


def test_every_split_keeps_all_layers_and_gives_the_last_stage_no_more_than_the_first() -> None:
    layers, pp = np.meshgrid(np.arange(1, 130), np.arange(1, 65), indexing="ij")
    layers, pp = layers.ravel(), pp.ravel()
    keep = layers >= pp
    first, middle, last = stage_split(layers[keep], pp[keep])
    stages = pp[keep]
    total = np.where(stages == 1, first, first + last + (stages - 2) * middle)
    assert (total == layers[keep]).all()
    assert (first >= 1).all() and (last >= 1).all() and (middle >= 1).all()
    assert (last <= first).all()


def test_fewer_layers_than_stages_is_refused() -> None:
    with pytest.raises(LayoutSearchError, match="every pipeline stage needs a layer"):
        stage_layers(3, 4)


@pytest.mark.parametrize("pp", range(2, 33))
def test_every_uneven_split_is_one_megatron_accepts(pp: int) -> None:
    for layers in range(pp, 100):
        stages = stage_layers(layers, pp)
        assert sum(stages) == layers and len(stages) == pp and min(stages) >= 1
        assert len(set(stages[1:-1])) <= 1  # Megatron-LM splits the middle evenly
        assert stages[-1] <= stages[0]  # the last stage also runs the logits
        # The heaviest stage is as light as any split with even middle stages allows.
        lightest = min(max(m, -(-(layers - (pp - 2) * m) // 2))
                       for m in range(1, layers) if layers - (pp - 2) * m >= 2)
        assert max(stages) == lightest
