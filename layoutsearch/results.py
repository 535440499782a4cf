"""Ranking a scored candidate table, and what a ranking carries about itself: the job it is
of, its counts, and the rules that reject its rows.

    ranked = rank(scored)                 # feasible first, best MFU first
    job = job_of(ranked)                  # the Job the search was of, from ranked.attrs
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import pandas as pd

from layoutsearch.costs.base import MEASURED
from layoutsearch.errors import LayoutSearchError, type_of
from layoutsearch.layout import LAYOUT_COLUMNS, Layout
from layoutsearch.specs import Job
from layoutsearch.text_columns import plain_text

RESULT_COLUMNS = (
    *LAYOUT_COLUMNS, "mfu", "step_time_s", "tokens_per_s", "peak_memory_gib", "headroom_gib",
    "fits", "reason",
)

TOP_K = 10
"""Rows of a ranking a report shows unless told otherwise: `layoutsearch.report()`, the
report.md table and the command line's printed summary (whose config sets `top_k: 10`)."""


COMMAND_REJECTED = "Megatron-LM would reject its command with the settings' extra flags: "
"""How `reason` starts for a layout the cost model found to fit whose command Megatron-LM
rejects once megatron.extra_args are added (emit.command_rejections): it cannot be
launched as the settings stand, so it ranks after every layout that can."""


JOB = "job"
"""`ranked.attrs` entry: the job ranked, as `Job.to_record` writes it (plain JSON values,
so that DataFrame.to_parquet can write them, and a ranking read back carries its job)."""


def job_of(ranked: pd.DataFrame, caller: str = "job_of(ranked)") -> Job:
    """The job a ranking is of, from its `attrs` (a `Job`); an error naming `caller` without
    one."""
    if not isinstance(ranked, pd.DataFrame):
        raise LayoutSearchError(f"{caller}: {ranked!r:.60} is {type_of(ranked)}, not the "
                                "DataFrame layoutsearch.search returned")
    record = ranked.attrs.get(JOB)
    if isinstance(record, Job):  # set by hand
        return record
    if not isinstance(record, Mapping):
        raise LayoutSearchError(
            f"{caller}: the frame's attrs['job'] is missing; pass the frame layoutsearch.search "
            "returned, or one read back from its to_parquet file (pandas drops attrs in some "
            "operations, e.g. concat, and CSV files do not keep them)")
    return Job.from_record(record)


NOTED_FOR = "noted_for"
"""`ranked.attrs` entry: `notes_key` of the ranking the search wrote its notes about."""


def notes_key(ranked: pd.DataFrame) -> tuple[int, str]:
    """What a ranking's notes are about: its row count and its best layout. A selection or
    re-sorting of the frame keeps the notes in `attrs` (pandas copies them), but no longer
    this key, so a report can tell notes about another table from its own."""
    if ranked.empty:
        return (0, "")
    return (len(ranked), Layout.from_row(ranked.iloc[0]).describe())


GROUPED_FROM = 10_000
"""Counts from this many on are written with thousands separators (4,194,304 tokens); shorter
ones are not (2240 layouts, 2048 sequences)."""


def grouped(number: float) -> str:
    """`number`, rounded to a whole one, with thousands separators from GROUPED_FROM on."""
    whole = round(number)
    return f"{whole:,}" if abs(whole) >= GROUPED_FROM else str(whole)


def counts_line(ranked: pd.DataFrame) -> str:
    """'2240 layouts, 1712 priced, 1350 fit' (', 18 failed when run' where measured runs of
    some layouts failed); with the rows a sampling driver returned
    ('2240 layouts, 50 tried, 50 priced, 42 fit') when it did not try the whole space; and
    of a selection of the search's rows, those shown ('400 shown of a search of 2240
    layouts, 380 priced, 300 fit')."""
    size = int(ranked.attrs.get("space_size", len(ranked)))
    priced = f"{grouped(ranked['mfu'].notna().sum())} priced, {grouped(ranked['fits'].sum())} fit"
    # A measured layout whose runs failed has no MFU, but it was no more left unpriced than
    # one that ran: a replay's "12 priced" beside a file of 30 runs must say where 18 went.
    failed = int((ranked["reason"].str.startswith(MEASURED) & ranked["mfu"].isna()).sum())
    if failed:
        priced += f", {grouped(failed)} failed when run"
    returned = int(ranked.attrs.get(NOTED_FOR, (len(ranked), ""))[0])
    if len(ranked) < returned:
        # pandas copies attrs into a selection: the space size is the search's, not its own.
        return f"{grouped(len(ranked))} shown of a search of {grouped(size)} layouts, {priced}"
    tried = "" if len(ranked) == size else f", {grouped(len(ranked))} tried"
    return f"{grouped(size)} layouts{tried}, {priced}"


WAITING_TIME = ("time_tp_comm_s", "time_cp_comm_s", "time_pp_comm_s", "time_dp_comm_s",
                "time_bubble_s")
"""Step-time components spent waiting on other GPUs (exposed communication, the pipeline
bubble); the others are this GPU's own work (compute, recompute, overheads)."""


def _own_work_s(scored: pd.DataFrame) -> np.ndarray:
    """Seconds of a step a GPU spends on its own work; 0 without a breakdown."""
    columns = [c for c in scored.columns
               if c.startswith("time_") and c.endswith("_s") and c not in WAITING_TIME]
    if not columns:
        return np.zeros(len(scored))
    return np.nan_to_num(scored[columns].to_numpy(dtype=float)).sum(axis=1)


def rank(scored: pd.DataFrame) -> pd.DataFrame:
    """Feasible rows first by MFU; then the rest, the nearest to fitting in memory first
    (the smallest overshoot; rows with memory to spare, out for another reason such as a
    command Megatron-LM would reject, count as no overshoot), then by MFU (unpriced rows
    last); a fresh 0..n-1 index.

    Rows of equal MFU go in order of their own work, least first: where communication
    hides a kernel's time (flash1 and flash2 under context-parallel exchanges) the faster
    kernel comes first, and it is the one that gains if the overlap falls short.
    """
    feasible = scored["fits"].to_numpy(dtype=bool)
    headroom = pd.to_numeric(scored.get("headroom_gib", pd.Series(np.nan, index=scored.index)),
                             errors="coerce").to_numpy(dtype=float)
    nearest = np.where(feasible, 0.0, np.minimum(np.nan_to_num(headroom, nan=-np.inf), 0.0))
    mfu = np.nan_to_num(scored["mfu"].to_numpy(dtype=float), nan=-1.0)
    # np.lexsort is stable and sorts by its last key first.
    order = np.lexsort((_own_work_s(scored), -mfu, -nearest, ~feasible))
    first = [c for c in RESULT_COLUMNS if c in scored.columns]
    rest = [c for c in scored.columns if c not in first]
    ranked = pd.DataFrame({column: _in_order(scored[column], order) for column in first + rest},
                          copy=False)
    ranked.attrs = copy.deepcopy(scored.attrs)  # as a selection of `scored` would keep them
    return ranked


def _in_order(column: pd.Series, order: np.ndarray) -> pd.Series:
    """The column's values in `order`, with a fresh 0..n-1 index; categorical while scoring,
    plain text for the user."""
    values = column.array
    # A column of one value (the job's: model, hidden_size, num_gpus, ...) reads the same in
    # any order, and copying it is ~5x faster than gathering a million rows out of order.
    ordered = pd.Series(values.copy() if _one_value(column) else values.take(order))
    return plain_text(ordered) if isinstance(ordered.dtype, pd.CategoricalDtype) else ordered


def _one_value(column: pd.Series) -> bool:
    """Whether every row of an integer, bool or categorical column holds the same value
    (floats are not asked: 0.0 and -0.0 compare equal)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        values = column.cat.codes.to_numpy()
    elif isinstance(column.dtype, np.dtype) and column.dtype.kind in "iub":
        values = column.to_numpy()
    else:
        return False
    return len(values) > 0 and bool((values == values[0]).all())


def rule_summary(reasons: pd.Series, top: int = 3, of: int | None = None) -> str:
    """The rules that reject most layouts, each with one example and its row count.

    A row may break several rules ("a; b"); rules are told apart by their text without
    the parenthesized values, so 'global_batch_size (3) must divide by ... (1·8)' and
    '... (2·8)' count as one rule. Counts are out of `of` layouts (default: the reasons
    given), so that a summary of some of a ranking's rows counts them out of all of it.
    """
    clauses = reasons[reasons != ""].str.split("; ").explode()
    broken = pd.DataFrame({
        "row": clauses.index,
        "rule": clauses.str.replace(r" \([^()]*\)", "", regex=True).to_numpy(),
        "example": clauses.to_numpy(),
    }).drop_duplicates(["row", "rule"])
    counts = broken.groupby("rule", sort=False).agg(
        layouts=("row", "size"), example=("example", "first")
    ).sort_values("layouts", ascending=False, kind="stable").head(top)
    return "; ".join(
        f"{example} (rejects {layouts} of {len(reasons) if of is None else of} layouts)"
        for example, layouts in zip(counts["example"], counts["layouts"], strict=True)
    )
