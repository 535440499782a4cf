"""The layer split over pipeline stages that the cost model and the command share."""

from __future__ import annotations

import numpy as np
import pytest

from layoutsearch.errors import LayoutSearchError
from layoutsearch.pipeline import (
    chunk_forwards,
    counts_embedding_and_loss,
    split_layers,
    stage_layers,
    stage_split,
)


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


@pytest.mark.parametrize(("layers", "pp", "vp", "expected"), [
    # Llama 3 405B: 126 + 2 = 128 slots, 8 per stage; the ends lose the embedding's and the
    # loss's slot. Interleaved in chunks of 4 (vp 2: [3, 4] and [4, 3]) or 2 (vp 4).
    (126, 16, 2, [7, *[8] * 14, 7]),
    (126, 16, 4, [7, *[8] * 14, 7]),
    (30, 4, 2, [7, 8, 8, 7]),  # 32 slots in chunks of 4
    (30, 2, 2, [15, 15]),  # 32 slots, 16 per stage: the two ends
    (28, 2, 2, [14, 14]),  # 28 divides by pp·vp: even, nothing counted
    (40, 4, 2, [10] * 4),
    (126, 16, 1, [7, *[8] * 14, 7]),  # without interleaving, the same split by first/last
])
def test_interleaved_stages_count_the_embedding_and_loss_where_layers_do_not_divide(
        layers: int, pp: int, vp: int, expected: list[int]) -> None:
    assert stage_layers(layers, pp, vp) == expected
    counted = bool(counts_embedding_and_loss(np.array(layers), np.array(pp), np.array(vp)))
    assert counted == (vp > 1 and layers % (pp * vp) != 0)
    assert split_layers(layers, pp, vp) == layers + 2 * counted


def test_every_counted_split_is_megatrons():
    # get_num_layers_to_build: (L+2)/pp slots per stage in vp chunks, one fewer on the first
    # stage's first chunk and the last stage's last chunk; the chunks add up to the layers.
    layers, pp, vp = np.meshgrid(np.arange(1, 200), np.arange(2, 33), np.arange(2, 9),
                                 indexing="ij")
    layers, pp, vp = layers.ravel(), pp.ravel(), vp.ravel()
    counted = counts_embedding_and_loss(layers, pp, vp)
    layers, pp, vp = layers[counted], pp[counted], vp[counted]
    assert ((layers + 2) % (pp * vp) == 0).all() and (layers % (pp * vp) != 0).all()
    first, middle, last = stage_split(layers, pp, vp)
    chunk = (layers + 2) // (pp * vp)
    assert (first == vp * chunk - 1).all() and (last == vp * chunk - 1).all()
    assert (middle == vp * chunk).all()
    assert (first + (pp - 2) * middle + last == layers).all()


def test_interleaved_chunks_run_in_groups_of_pp_micro_batches():
    # Megatron's schedule table with pp 16, vp 2: virtual micro-batches 0-15 run chunk 0,
    # 16-31 chunk 1, 32-47 chunk 0 again. Of the first 47, 16 + 15 = 31 run chunk 0 and 16
    # chunk 1; of the first 17, one runs chunk 1.
    pp, vp = np.array([16.0]), np.array([2.0])
    assert chunk_forwards(np.array([47.0]), pp, vp, np.array([0.0])).tolist() == [31.0]
    assert chunk_forwards(np.array([47.0]), pp, vp, np.array([1.0])).tolist() == [16.0]
    assert chunk_forwards(np.array([17.0]), pp, vp, np.array([1.0])).tolist() == [1.0]
