"""Work a formula out once per distinct combination of its inputs, not once per row.

A million-row candidate table holds a few thousand distinct (tp, pp, vp, micro-batch)
combinations; a formula of those alone (how a pipeline splits its layers, the bandwidth of
the gradient group) is worked out on one row of each and gathered back. The result is the
same, bit for bit, as on every row: the formulas are element-wise.

    first, middle, last = per_distinct(stage_split, num_layers, pp, vp)  # pipeline.py
    first_rows, inverse = groups([tp, cp, micro_batch])  # a row of each; each row's own
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

Array = np.ndarray

MIN_ROWS = 8192
"""Tables of fewer rows skip the search for combinations: on 2,240 rows it took ~0.25 ms
more than the pipeline's formulas saved, on 20,000 it saved ~2 ms (a sampling driver's one
layout: 0.1 ms more)."""
WHOLE_LIMIT = 2**20
"""Columns of whole numbers in [0, this) (rank counts, sizes, flags) key by their values."""
DENSE_LIMIT = 2**22
"""Keys below this (or below the row count) are found by marking a flag per possible key
(~4 ms per million rows); larger ones are hashed (pd.factorize, ~12 ms)."""
KEY_LIMIT = 2**62
"""Mixed-radix keys stay below this (int64): whole-number columns that allow more keys are
hashed, and a hashed key that would pass it is re-coded first."""


def _whole_values(column: Array) -> Array | None:
    """The column as int64 where it holds only whole numbers in [0, WHOLE_LIMIT), else None
    (a fraction, a negative, NaN, -0.0: its value 0 would read back as 0.0)."""
    if column.dtype.kind == "f" and np.signbit(column).any():
        return None
    with np.errstate(invalid="ignore"):  # NaN and inf cast to garbage, told apart below
        values = column.astype(np.int64)
    if column.dtype != bool and not np.array_equal(values, column):
        return None
    if values.min() < 0 or values.max() >= WHOLE_LIMIT:
        return None
    return values


def _by_values(values: list[Array], bases: list[int]) -> Array:
    """`combination_index` of whole-number columns: one mixed-radix key of their values
    (each below its base; the bases' product below KEY_LIMIT, so the key does not wrap)."""
    key = values[0]
    for base, column_values in zip(bases[1:], values[1:], strict=True):
        key = key * base + column_values
    possible = math.prod(bases)
    if possible <= max(DENSE_LIMIT, len(key)):
        present = np.zeros(possible, dtype=bool)
        present[key] = True
        return (np.cumsum(present) - 1).take(key)
    return pd.factorize(key)[0]


def _bits(column: Array) -> Array:
    """A float column as integers of the same bits (hashing takes -0.0 for 0.0); others as
    they are."""
    return column.view(f"i{column.itemsize}") if column.dtype.kind == "f" else column


def _by_hashing(columns: list[Array]) -> Array:
    """`combination_index` of any columns: each one's codes by hashing, combined."""
    key = np.zeros(len(columns[0]), dtype=np.int64)
    radix = 1
    for column in columns:
        # Floats by their bits: NaN is a value like any other, and -0.0 is not 0.0.
        codes, uniques = pd.factorize(_bits(column), use_na_sentinel=False)
        if radix * len(uniques) >= KEY_LIMIT:
            key, kept = pd.factorize(key)
            radix = len(kept)
        key = key * len(uniques) + codes
        radix *= len(uniques)
    return pd.factorize(key)[0]


def combination_index(columns: list[Array]) -> Array:
    """Per row of the per-row `columns` (1-d, one length, at least one row), the index of
    its combination of their values among the distinct ones (0, 1, ... in no set order)."""
    values = [_whole_values(column) for column in columns]
    whole = [v for v in values if v is not None]
    if len(whole) == len(values):
        bases = [int(v.max()) + 1 for v in whole]
        if math.prod(bases) < KEY_LIMIT:
            return _by_values(whole, bases)
    return _by_hashing(columns)


def groups(columns: list[Array]) -> tuple[Array, Array] | None:
    """A row of each distinct combination of the per-row `columns` (1-d, one length) and,
    per row, the index of its combination among them; None where there are no columns,
    fewer than MIN_ROWS rows, or nothing repeats (gathering would only copy)."""
    if not columns or len(columns[0]) < max(MIN_ROWS, 1):
        return None
    inverse = combination_index(columns)
    count = int(inverse.max()) + 1
    if count == len(inverse):
        return None
    first = np.empty(count, dtype=np.intp)
    # Any row of a combination will do: they all hold the same values.
    first[inverse] = np.arange(len(inverse))
    return first, inverse


def pick(values: Array, rows: Array) -> Array:
    """The entries of a per-row array (rows along its last axis) at the indices `rows`; one
    number for every row (0-d) as it is."""
    # np.take, not values[..., rows]: a (3, rows) gather that way is ~7x slower.
    return np.take(values, rows, axis=-1) if np.ndim(values) else values


def per_distinct(formula: Callable[..., tuple[Array, ...]], *inputs: Array,
                 ) -> tuple[Array, ...]:
    """`formula(*inputs)`, worked out on one row of each distinct combination of the inputs
    that vary by row and gathered back to every row along the last axis. A 0-d input (one
    number for every row) is passed as it is. A table under MIN_ROWS rows is worked out
    row by row: finding its combinations would cost more than it saves."""
    found = groups([values for values in inputs if np.ndim(values)])
    if found is None:
        return formula(*inputs)
    first, inverse = found
    return tuple(pick(out, inverse) for out in formula(*(pick(v, first) for v in inputs)))
