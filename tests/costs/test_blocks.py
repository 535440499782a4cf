"""A big table priced in row blocks, side by side in threads, as it is priced whole."""

from __future__ import annotations

import itertools
import threading
import warnings

import numpy as np
import pandas as pd
import pytest

from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.costs import blocks, build_cost_model
from layoutsearch.costs.blocks import MIN_BLOCK_ROWS, block_bounds, in_blocks, usable_cores
from layoutsearch.errors import LayoutSearchError
from tests.costs.builders import table


def test_a_small_table_is_one_block_and_a_big_one_a_block_per_core() -> None:
    assert block_bounds(MIN_BLOCK_ROWS - 1, cores=8) == [(0, MIN_BLOCK_ROWS - 1)]
    assert block_bounds(0, cores=2) == [(0, 0)]
    assert block_bounds(3 * MIN_BLOCK_ROWS, cores=1) == [(0, 3 * MIN_BLOCK_ROWS)]
    # No block under MIN_BLOCK_ROWS rows: 2.5 blocks' worth on 8 cores is two blocks.
    assert len(block_bounds(5 * MIN_BLOCK_ROWS // 2, cores=8)) == 2
    bounds = block_bounds(1_248_001, cores=2)
    assert bounds[0][0] == 0 and bounds[-1][1] == 1_248_001
    assert all(stop == start for (_, stop), (start, _) in itertools.pairwise(bounds))
    sizes = [stop - start for start, stop in bounds]
    assert len(sizes) == 2 and max(sizes) - min(sizes) <= 1
    assert usable_cores() >= 1


def test_blocks_are_priced_side_by_side_and_joined_in_row_order() -> None:
    rows = pd.DataFrame({"x": np.arange(3 * MIN_BLOCK_ROWS, dtype=float)})
    all_three_started = threading.Barrier(3, timeout=10)  # broken unless they run at once

    def price(block: pd.DataFrame) -> dict[str, np.ndarray]:
        assert threading.current_thread() is not threading.main_thread()
        all_three_started.wait()
        x = block["x"].to_numpy()
        return {"double": 2 * x, "odd": x % 2 == 1}

    joined = in_blocks(price, rows, cores=3)
    np.testing.assert_array_equal(joined["double"], 2 * rows["x"].to_numpy())
    assert joined["odd"].dtype == bool and joined["odd"].sum() == 3 * MIN_BLOCK_ROWS // 2


def test_an_error_in_a_block_reaches_the_caller() -> None:
    rows = pd.DataFrame({"x": np.arange(2 * MIN_BLOCK_ROWS, dtype=float)})

    def price(block: pd.DataFrame) -> dict[str, np.ndarray]:
        if block.index[0] > 0:
            raise LayoutSearchError("gpu='a200': no such GPU kind")
        return {"x": block["x"].to_numpy()}

    with pytest.raises(LayoutSearchError, match="a200"):
        in_blocks(price, rows, cores=2)


def test_the_analytic_model_prices_a_table_in_blocks_as_it_prices_it_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = table(tp=[1, 2, 4, 8], pp=[1, 2, 4], micro_batch_size=[1, 2, 4],
                 attention=["torch", "flash2"], recompute=["none", "selective", "full"],
                 sequence_parallel=[False, True])
    model, clusters = build_cost_model("analytic"), clusters_by_gpu()
    monkeypatch.setattr(blocks, "usable_cores", lambda: 1)
    whole = model.score(rows, clusters)
    monkeypatch.setattr(blocks, "usable_cores", lambda: 3)
    monkeypatch.setattr(blocks, "MIN_BLOCK_ROWS", len(rows) // 4)
    assert len(block_bounds(len(rows), 3)) == 3
    in_three = model.score(rows, clusters)
    pd.testing.assert_frame_equal(in_three, whole, check_exact=True)
    assert not whole["fits"].all() and whole["cost_reason"].str.startswith("needs").any()


@pytest.mark.parametrize("mode", ["raise", "ignore"])
def test_each_block_is_priced_under_the_callers_numpy_error_handling(mode: str) -> None:
    # np.errstate is held per context: a thread starts with numpy's default (warn) unless it
    # runs in a copy of the caller's, and a big table would then warn where a small one
    # raises or is silent.
    rows = pd.DataFrame({"x": np.zeros(2 * MIN_BLOCK_ROWS)})

    def price(block: pd.DataFrame) -> dict[str, np.ndarray]:
        return {"inverse": 1.0 / block["x"].to_numpy()}

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning fails the "ignore" case
        with np.errstate(divide=mode):
            if mode == "raise":
                with pytest.raises(FloatingPointError):
                    in_blocks(price, rows, cores=2)
            else:
                assert np.isinf(in_blocks(price, rows, cores=2)["inverse"]).all()
