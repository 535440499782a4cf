"""Layout: derived values, the row round trip, the human label."""

from __future__ import annotations

import numpy as np
import pandas as pd

from layoutsearch.layout import LAYOUT_COLUMNS, Layout


def test_micro_batches_fill_the_global_batch() -> None:
    layout = Layout(tp=2, pp=4, dp=16, micro_batch_size=1)
    assert layout.model_parallel_size == 8
    assert layout.num_micro_batches(global_batch_size=2048) == 2048 // (1 * 16) == 128
    assert Layout(dp=8, micro_batch_size=4).num_micro_batches(2048) == 64
    assert Layout(tp=2, pp=2, cp=2).model_parallel_size == 8


def test_dict_and_row_round_trip() -> None:
    layout = Layout(tp=4, pp=2, dp=8, micro_batch_size=2, sequence_parallel=True,
                    attention="fused", rmsnorm_kernel=True, recompute="full",
                    distributed_optimizer=False)
    as_dict = layout.to_dict()
    assert tuple(as_dict) == LAYOUT_COLUMNS
    assert Layout.from_row(as_dict) == layout
    # A pandas row carries numpy scalars and extra columns; both are handled.
    row = pd.DataFrame([{**as_dict, "mfu": 0.5}]).iloc[0]
    assert isinstance(row["tp"], np.integer)
    back = Layout.from_row(row)
    assert back == layout
    assert type(back.tp) is int and type(back.sequence_parallel) is bool


def test_missing_columns_keep_defaults() -> None:
    assert Layout.from_row({"tp": 2, "attention": None}) == Layout(tp=2)


def test_describe() -> None:
    layout = Layout(tp=2, pp=4, dp=16, micro_batch_size=1, attention="flash2",
                    rmsnorm_kernel=True, sequence_parallel=True)
    assert layout.describe() == "tp2 pp4 dp16 mb1 sp flash2+rmsnorm recompute=none"
    assert "cp2" in Layout(cp=2).describe() and "no-dist-opt" in Layout(
        distributed_optimizer=False).describe()
