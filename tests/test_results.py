"""Ranking a scored table, and what a ranking says about itself: its counts."""

from __future__ import annotations

import pandas as pd
import pytest

from layoutsearch.errors import LayoutSearchError
from layoutsearch.results import (
    NOTED_FOR,
    RESULT_COLUMNS,
    counts_line,
    job_of,
    notes_key,
    rank,
)
from tests.rankings import scored


def test_rank_puts_feasible_rows_first_by_mfu() -> None:
    table = scored([
        {"tp": 1, "mfu": 0.70, "peak_memory_gib": 90.0, "reason": "out of memory"},
        {"tp": 2, "mfu": 0.50, "peak_memory_gib": 40.0, "fits": True},
        {"tp": 4, "reason": "num_attention_heads (40) must divide by tp (3)"},  # unpriced
        {"tp": 8, "mfu": 0.60, "peak_memory_gib": 30.0, "fits": True},
        {"pp": 2, "mfu": 0.65, "peak_memory_gib": 85.0, "reason": "out of memory"},
    ]).iloc[::-1]
    ranked = rank(table)
    assert ranked["tp"].tolist() == [8, 2, 1, 1, 4]
    assert ranked["pp"].tolist() == [1, 1, 1, 2, 1]
    present = [c for c in RESULT_COLUMNS if c in table.columns]  # this table has no headroom
    assert list(ranked.columns[: len(present)]) == present
    assert ranked.columns[-1] == "extra"
    assert list(ranked.index) == [0, 1, 2, 3, 4]
    assert not any(c.startswith("_") for c in ranked.columns)


def test_rows_that_do_not_fit_come_nearest_first() -> None:
    table = scored([
        {"tp": 1, "mfu": 0.70, "peak_memory_gib": 843.0, "headroom_gib": -763.0},
        {"tp": 2, "mfu": 0.50, "peak_memory_gib": 124.0, "headroom_gib": -44.0},
        {"tp": 4, "reason": "num_attention_heads (40) must divide by tp (3)"},  # unpriced
        {"tp": 8, "mfu": 0.60, "peak_memory_gib": 300.0, "headroom_gib": -220.0},
    ])
    assert rank(table)["tp"].tolist() == [2, 8, 1, 4]


def test_rows_out_for_another_reason_than_memory_come_by_mfu() -> None:
    # Commands Megatron-LM would reject: memory to spare, so no nearer to fitting than
    # each other; the one that would run fastest is the one a user weighs first.
    table = scored([
        {"tp": 8, "mfu": 0.19, "headroom_gib": 60.0, "reason": "Megatron-LM would reject"},
        {"tp": 1, "mfu": 0.58, "headroom_gib": 3.0, "reason": "Megatron-LM would reject"},
        {"tp": 2, "mfu": 0.70, "headroom_gib": -5.0, "reason": "out of memory"},
        {"tp": 4, "mfu": 0.50, "headroom_gib": 20.0, "fits": True},
    ])
    assert rank(table)["tp"].tolist() == [4, 1, 8, 2]


def test_equal_mfu_puts_the_layout_with_less_own_work_first() -> None:
    # Context-parallel exchanges hide attention: flash1 and flash2 tie on step time, the
    # slower kernel's time hidden behind communication that flash2 leaves exposed.
    table = scored([
        {"attention": "flash1", "mfu": 0.433, "fits": True, "time_attention_s": 0.45,
         "time_cp_comm_s": 0.10},
        {"attention": "flash2", "mfu": 0.433, "fits": True, "time_attention_s": 0.21,
         "time_cp_comm_s": 0.34},
        {"attention": "torch", "mfu": 0.44, "fits": True, "time_attention_s": 0.90,
         "time_cp_comm_s": 0.0},
    ])
    assert rank(table)["attention"].tolist() == ["torch", "flash2", "flash1"]


def test_counts_say_when_a_driver_tried_part_of_the_space() -> None:
    ranked = rank(scored([{"tp": 1, "mfu": 0.5, "fits": True}, {"tp": 2, "mfu": 0.4},
                          {"tp": 4}]))
    assert counts_line(ranked) == "3 layouts, 2 priced, 1 fit"  # a grid: the whole space
    ranked.attrs["space_size"] = 2240
    assert counts_line(ranked) == "2240 layouts, 3 tried, 2 priced, 1 fit"
    ranked.attrs["space_size"] = 35840  # counts of five digits and more are grouped
    assert counts_line(ranked) == "35,840 layouts, 3 tried, 2 priced, 1 fit"


def test_counts_say_how_many_measured_layouts_failed_when_run() -> None:
    # A replay's or a measured search's failed runs have no MFU, yet were not left unpriced;
    # a layout that fits by most of its runs is priced, whatever its reason says.
    ranked = rank(scored([
        {"tp": 1, "mfu": 0.5, "fits": True, "reason": "measured: 1 of 2 runs ran out of memory"},
        {"tp": 2, "reason": "measured: out of memory"},
        {"tp": 4, "reason": "measured oom: CUDA out of memory"},
        {"tp": 8, "reason": "unmeasured: tp=8 was never run"},
    ]))
    assert counts_line(ranked) == "4 layouts, 1 priced, 1 fit, 2 failed when run"


def test_counts_of_a_selection_say_it_is_one() -> None:
    # A filtered frame keeps the search's attrs (pandas copies them): its rows are not
    # the layouts the search tried.
    ranked = rank(scored([{"tp": 1, "mfu": 0.5, "fits": True}, {"tp": 2, "mfu": 0.4},
                          {"tp": 4}]))
    ranked.attrs.update({"space_size": 3, NOTED_FOR: notes_key(ranked)})
    assert counts_line(ranked) == "3 layouts, 2 priced, 1 fit"
    assert counts_line(ranked.iloc[::-1]) == "3 layouts, 2 priced, 1 fit"  # re-sorted
    assert counts_line(ranked[ranked["tp"] > 1]) == \
        "2 shown of a search of 3 layouts, 1 priced, 0 fit"


@pytest.mark.parametrize(("ranked", "shown"), [(None, "None is a NoneType"),
                                               ("ranked.csv", "'ranked.csv' is a str")])
def test_the_job_of_something_else_than_a_ranking_is_a_user_error(ranked: object,
                                                                  shown: str) -> None:
    # "'NoneType' object has no attribute 'attrs'" before.
    with pytest.raises(LayoutSearchError, match=rf"^job_of\(ranked\): {shown}, not the "
                                                r"DataFrame layoutsearch.search returned$"):
        job_of(ranked)  # type: ignore[arg-type]


def test_rank_moves_every_column_with_its_row_and_keeps_the_attrs() -> None:
    # The job's columns hold one value and are copied, not reordered; the others move.
    table = scored([
        {"tp": 1, "mfu": 0.40, "fits": True},
        {"tp": 2, "mfu": 0.60, "fits": True},
        {"tp": 4, "mfu": 0.50, "fits": True},
    ])
    table["num_gpus"] = 64
    table["runs"] = pd.array([1, None, 1], dtype="Int64")
    table.attrs["space_size"] = 3
    ranked = rank(table)
    assert ranked["tp"].tolist() == [2, 4, 1]
    assert ranked["num_gpus"].tolist() == [64, 64, 64]
    assert ranked["runs"].tolist() == [pd.NA, 1, 1]
    assert ranked.attrs["space_size"] == 3
