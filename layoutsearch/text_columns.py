"""Text columns of a big table, built from the few distinct texts they hold.

A search of a million layouts has a million reasons but a few thousand distinct ones, each
~250 characters. Handed over as a million Python strings, pandas 3 converts them one by one
into its Arrow-backed str dtype (4 s for 1.25 M reasons); gathered from the distinct texts
by an integer code per row, Arrow copies them at memory speed (0.14 s). The columns come
out as pandas makes them of Python strings: pandas 3's str dtype, object under pandas 2.

    column = text_column(codes, ["", "needs 91.2 GiB > 80.0 GiB per GPU"], index)
    plain = plain_text(table["attention"])        # a categorical column as plain text
    reason = first_text(rule_reasons, cost_reasons)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd


def text_column(codes: np.ndarray, texts: Iterable[object], index: pd.Index) -> pd.Series:
    """`texts[codes]` per row (each text as `str` writes it), the column pandas makes of
    such strings: its text dtype, or object where there are no rows to tell it text."""
    if len(codes) == 0:
        return pd.Series(np.array([], dtype=object), index=index)
    distinct = pd.Series(list(texts), dtype=object).astype(str)
    return pd.Series(distinct.take(codes).array, index=index, copy=False)


def plain_text(column: pd.Series) -> pd.Series:
    """A categorical column as plain text, as `column.astype(str)` makes it, gathered from
    its categories (astype formats every row: 0.3 s per million)."""
    codes = column.cat.codes.to_numpy()
    if len(codes) == 0 or (codes < 0).any():  # no rows, or missing values: astype's rules
        return column.astype(str)
    return text_column(codes, column.cat.categories, column.index)


def coded_text(codes: np.ndarray, texts: Sequence[str]) -> pd.Categorical:
    """`texts[codes]` per row as a categorical (texts that repeat are merged into one
    category): a million rows of a few thousand texts held as integer codes."""
    merged, categories = pd.factorize(np.array(list(texts), dtype=object))
    return pd.Categorical.from_codes(merged[codes], categories=pd.Index(categories))


def _text_codes(column: pd.Series) -> tuple[np.ndarray, list[str]]:
    """An index per row into the column's distinct texts; a missing value reads as ""."""
    codes, uniques = pd.factorize(column)  # -1 where missing
    texts = [*pd.Series(np.asarray(uniques, dtype=object), dtype=object).astype(str), ""]
    return np.where(codes < 0, len(texts) - 1, codes), texts


def first_text(*columns: pd.Series) -> pd.Series:
    """Per row, the text of the first of `columns` (aligned, of any text dtype) that is not
    "" there (a missing value reads as ""), as plain text; "" where none has one."""
    index = columns[0].index
    codes = np.zeros(len(index), dtype=np.intp)
    texts = [""]
    chosen = np.zeros(len(index), dtype=bool)
    for column in columns:
        column_codes, column_texts = _text_codes(column)
        said = np.array([text != "" for text in column_texts])[column_codes] & ~chosen
        codes[said] = column_codes[said] + len(texts)
        texts.extend(column_texts)
        chosen |= said
    return text_column(codes, texts, index)
