"""Price a big candidate table in row blocks, one per CPU core, side by side in threads.

The analytic formulas are numpy operations on whole columns, and numpy lets go of Python's
global lock inside each of them: blocks priced in threads run on every core at once. On a
2-core machine a 1.25M-row table is priced 1.2-2x faster in two blocks than in one
(benchmarks/speed.py prints both). Every row comes out the same, bit for bit, as the
formulas are element-wise (a table of one job gives a block the same numbers as the
whole). No block is under `MIN_BLOCK_ROWS` rows: a table under twice that, as a sampling
driver's one layout, is priced whole in the calling thread.

    columns = in_blocks(price, candidates)   # price(block) -> {column: array per row}
"""

from __future__ import annotations

import contextvars
import itertools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

Array = np.ndarray

MIN_BLOCK_ROWS = 50_000
"""Fewer rows than this per block and a thread's start and the joining copy outweigh what
a second core saves (a block of that size prices in ~40 ms)."""


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, as taskset or a container
    sets it), at least one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS and Windows have no affinity call
        return max(1, os.cpu_count() or 1)


def block_bounds(rows: int, cores: int) -> list[tuple[int, int]]:
    """(start, stop) of each block: as many as there are cores, none under MIN_BLOCK_ROWS
    (one block for a small table), of near-equal sizes."""
    count = max(1, min(cores, rows // MIN_BLOCK_ROWS))
    edges = np.linspace(0, rows, count + 1).round().astype(int).tolist()
    return list(itertools.pairwise(edges))


def in_blocks(price: Callable[[pd.DataFrame], dict[str, Array]], table: pd.DataFrame,
              cores: int | None = None) -> dict[str, Array]:
    """`price(table)`, worked out block by block in threads and joined row-wise: the same
    column names, each one array over all the rows. `price` must give every block the same
    columns and rely on no state it changes."""
    bounds = block_bounds(len(table), usable_cores() if cores is None else cores)
    if len(bounds) == 1:
        return price(table)
    # Each block runs in a copy of the caller's context: numpy keeps np.errstate there, and
    # a thread otherwise starts with numpy's defaults (a block would warn where the caller
    # raises or ignores). One copy per block: a context runs in one thread at a time.
    contexts = [contextvars.copy_context() for _ in bounds]
    with ThreadPoolExecutor(max_workers=len(bounds), thread_name_prefix="price") as pool:
        parts = list(pool.map(lambda b, context: context.run(price, table.iloc[b[0]:b[1]]),
                              bounds, contexts))
        # Joining copies every column once; the copies run side by side too (numpy lets go
        # of the lock while it copies, and a column's new pages fault in its own thread).
        names = list(parts[0])
        joined = pool.map(lambda name: np.concatenate([part[name] for part in parts]), names)
        return dict(zip(names, joined, strict=True))
