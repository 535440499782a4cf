"""Measurement tables on disk: how a CSV or Parquet file is parsed, and the line each row
came from.

Every reader of measurement files parses CSV alike (`parse_csv`); `record_lines` finds the
line each record starts on and refuses what pandas would misread without a word (a header
separated by semicolons, a column named twice, a line with more cells than the header);
`keep_lines` stores those lines in a frame's `attrs`, so that `row_names` names the line an
editor shows, also after the frame is filtered or sorted.

    keep_lines(frame, record_lines(path, unique_columns=("tp", "pp")))
    row_names(frame)   # ["line 2", "line 3", ...]: the file's lines, blank ones skipped
"""

from __future__ import annotations

import base64
import csv
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.errors import LayoutSearchError

LINE_NUMBERS = "line_numbers"
"""The `attrs` key under which `measurements.read_table` keeps the line each data row of a
CSV file starts on, by index label (the n rows are labelled 0..n-1 as read), so that an error
names the line a text editor shows, also after the frame is filtered or sorted."""


def keep_lines(frame: pd.DataFrame, lines: Sequence[int] | np.ndarray) -> None:
    # pandas deep-copies `attrs` into every frame and column it derives (a column read, a
    # filter): as one string they are copied for nothing, pd.concat compares them safely,
    # and DataFrame.to_parquet, which writes `attrs` as JSON, can write them (as base64).
    frame.attrs[LINE_NUMBERS] = base64.b64encode(
        np.asarray(lines, dtype=np.int64).tobytes()).decode("ascii")


def row_lines(frame: pd.DataFrame) -> np.ndarray | None:
    """The line each row of `frame` came from, in row order; None unless every row has one."""
    lines = np.frombuffer(base64.b64decode(frame.attrs.get(LINE_NUMBERS, "")), dtype=np.int64)
    labels = frame.index
    if not pd.api.types.is_integer_dtype(labels) or not len(lines):
        return None
    if len(labels) and (labels.min() < 0 or labels.max() >= len(lines)):
        return None
    return lines[labels.to_numpy()]


def row_names(frame: pd.DataFrame) -> list[str]:
    """How an error names each row: its line in the CSV file it was read from ("line 7"),
    else its label in the frame's index ("index 5"), which `frame.loc` finds."""
    lines = row_lines(frame)
    if lines is not None:
        return [f"line {n}" for n in lines]
    return [f"index {label!r}" for label in frame.index]


def refuse_repeated_columns(source: str, names: Collection[object],
                            among: Collection[str] | None = None) -> None:
    """Refuse a column named twice (of those `among`, default all): which of the two would
    be the row's value? Neither can be taken on trust. Unnamed columns (a spreadsheet's
    trailing empty ones) are left be."""
    named = [str(name) for name in names if str(name).strip()]
    repeated = sorted({name for name in named if named.count(name) > 1
                       and (among is None or name in among)})
    if repeated:
        raise LayoutSearchError(
            f"{source}: column(s) {', '.join(map(repr, repeated))} appear more than once; "
            "keep one of each (a measurement row has one value per column)")


OTHER_DELIMITERS = {";": "semicolons", "\t": "tabs", "|": "vertical bars"}
"""Separators a spreadsheet may write instead of commas (Excel in locales with decimal
commas writes semicolons), each found in a header that parses as a single column."""


PARQUET_SUFFIXES = (".parquet", ".pq")
"""File name endings read and written as Parquet; any other measurement file is CSV."""


def parse_csv(path: Path, **options: Any) -> pd.DataFrame:
    """A CSV file parsed as every reader of measurement files parses it (pandas drops a UTF-8
    byte-order mark and skips blank lines): a header or cell written "a, b", a space after
    each comma, reads as "b", not " b", which would name no column of the schema.

    index_col=False: a file whose data lines end with a comma (one empty cell more than the
    header) would otherwise have its first column taken as the index and every other value
    shifted one column left; read_table refuses a line whose extra cells are not empty."""
    return pd.read_csv(path, skipinitialspace=True, index_col=False, **options)


def is_parquet(path: str | Path) -> bool:
    return Path(path).suffix.lower() in PARQUET_SUFFIXES


def undecodable(path: Path) -> str:
    """Where `path` is first not UTF-8, by its line as an editor numbers it ("line 7 has
    b'\\xe9', invalid continuation byte"); "" where every line decodes."""
    with path.open("rb") as file:
        for number, line in enumerate(file, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                return f"line {number} has {line[error.start:error.end]!r}, {error.reason}"
    return ""


def record_lines(path: Path, unique_columns: Collection[str]) -> list[int]:
    """The line each data record of a CSV file starts on, read as pandas reads it: blank
    lines are skipped and a quoted cell may span lines, so the line is not the position + 2.

    A record with more cells than the header is refused, naming its line, unless the extra
    cells are empty (a comma ending the line): pandas would drop them, or shift the columns.
    So is a header naming one of `unique_columns` twice, or separated by other marks."""
    starts: list[int] = []
    header: list[str] | None = None
    with path.open(newline="", encoding="utf-8", errors="replace") as file:
        reader = csv.reader(file, skipinitialspace=True)
        end = 0
        try:
            for record in reader:
                if len(record) > 1 or (record and record[0].strip()):
                    if header is None:
                        header = record
                        _refuse_other_delimiters(path, header)
                        # pandas would read a repeated name as 'tp.1', an unknown column
                        # kept, and take the first 'tp' as the row's value; a repeated
                        # column of the user's own ('comment', 'comment.1') is kept.
                        refuse_repeated_columns(str(path), header, unique_columns)
                    else:
                        starts.append(end + 1)
                        _refuse_extra_cells(path, end + 1, header, record)
                end = reader.line_num
        except csv.Error as error:  # e.g. a cell over the csv module's 128 KiB field limit
            raise LayoutSearchError(f"measurement file {str(path)!r} cannot be read as CSV "
                                    f"(line {end + 1}: {error})") from None
    return starts


def _refuse_other_delimiters(path: Path, header: list[str]) -> None:
    other = next((name for mark, name in OTHER_DELIMITERS.items() if mark in header[0]), None)
    if len(header) == 1 and other:
        raise LayoutSearchError(
            f"measurement file {str(path)!r} is separated by {other}, not commas (its "
            f"header reads {header[0][:60]!r}...): save it as comma-separated CSV with "
            "decimal points (pandas: to_csv(path, index=False))")


def _refuse_extra_cells(path: Path, line: int, header: list[str], record: list[str]) -> None:
    extra = [cell for cell in record[len(header):] if cell.strip()]
    if extra:
        raise LayoutSearchError(
            f"measurement file {str(path)!r}: line {line} has {len(record)} cells, the "
            f"header has {len(header)} (after its last column {header[-1]!r} the line "
            f"holds {', '.join(map(repr, extra[:3]))}): a cell has an unquoted comma or the "
            "header lacks a column; quote the cell or name the column")
