"""A measurement file that a measured search appends its runs to, one row at a time.

Each row is flushed to disk before the next trial starts, under a lock beside the file, so
a killed search, concurrent optuna workers and sweeps sharing one file lose no run; a CSV
file of the user's own keeps its rows as written. `measurement_key` is the identity a row is
found again by (its job and layout).

    MeasurementFile("runs.csv").append(row)          # flushed before it returns
    measured = MeasurementFile("runs.csv").load()    # {measurement_key(row): row, ...}
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.layout import plain_cell
from layoutsearch.measurements import (
    MEASUREMENT_KEY,
    OPTIONAL_DEFAULTS,
    OPTIONAL_FIGURES,
    REQUIRED_COLUMNS,
    as_searched,
    read_table,
    validate_measurements,
    with_default,
)
from layoutsearch.paths import unwritable_file
from layoutsearch.progress import say
from layoutsearch.table_files import is_parquet, parse_csv

if sys.platform != "win32":  # where there is no flock, `import layoutsearch` still works
    import fcntl

FILE_COLUMNS = (
    *REQUIRED_COLUMNS, *OPTIONAL_DEFAULTS, *OPTIONAL_FIGURES, "source", "message", "log_path",
)
"""Columns of the rows the measured cost model appends (schema-required first, then optional
ones): every column of MEASUREMENT_KEY, so a row read back matches the layout it measured.
Not the optional recompute_method and recompute_num_layers: its full recompute is always
uniform with one layer a checkpoint (megatron/args.py), which their empty cells read as."""


def plain_value(value: Any) -> Any:
    """A cell as the plain Python value a CSV row reads back as: a numpy scalar as its
    Python one, a whole float as an int (2.0 is 2), anything else but int and str as text."""
    value = plain_cell(value)
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int | str) else str(value)


def measurement_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """The identity of a run: job shape and layout, types normalized (CSV or table), the
    knobs that change nothing for the layout as a search keeps them (`as_searched`: a
    user's file may record sequence parallelism at tp = 1)."""
    values = {**row, **as_searched(row)}
    return tuple(plain_value(values[c]) for c in MEASUREMENT_KEY)


def by_key(runs: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Rows by measurement key, the last of repeated rows winning (a relaunch's row)."""
    return {measurement_key(run): run for run in runs}


class MeasurementFile:
    """A measurement file (CSV, or Parquet by its suffix) that rows are appended to, one at
    a time, durably. A user's own file is kept as it is: a row is never glued onto a last
    line without a newline, and a file lacking some of the model's columns gets them (old
    rows take the schema's defaults), so that no figure of a new row is dropped."""

    def __init__(self, path: str | Path) -> None:
        # `~` expanded, as pandas expands it on reading: open() would take it literally.
        self.path = Path(path).expanduser()
        self.real_path = Path(os.path.realpath(self.path))
        """The file itself where `path` is a symbolic link (a team's shared file, linked
        into each user's folder): its lock, its claims and a rewrite's temporary go beside
        it, so that searches naming it by other links share them, and a rewrite (Parquet,
        added columns) replaces the file rather than the link."""

    def unwritable(self) -> str | None:
        """Why a row cannot be recorded (None: it can), asked before the run that makes it:
        the file as named, the file a link names (a file not made yet goes beside it), and
        for Parquet, which each row rewrites through a temporary file beside it, that
        folder too (an existing file alone would pass, and the run be lost after it)."""
        why = unwritable_file(self.path) or unwritable_file(self.real_path)
        folder = self.real_path.parent
        if (why is None and is_parquet(self.path) and self.real_path.exists()
                and not os.access(folder, os.W_OK | os.X_OK)):
            why = (f"is Parquet, which each row rewrites through a file beside it, and its "
                   f"folder {folder} is not writable (a CSV file there could be appended to)")
        return why

    def is_empty(self) -> bool:
        """Whether nothing was written yet: no file, or one of 0 bytes."""
        return not self.path.is_file() or self.path.stat().st_size == 0

    def load(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        """Rows already measured, by measurement key (the last of repeated rows wins)."""
        return by_key(self.runs())

    def runs(self) -> list[dict[str, Any]]:
        """Every row, in the order they were appended."""
        if self.is_empty():
            return []
        rows = validate_measurements(read_table(self.path), source=str(self.path))
        return [{str(k): v for k, v in r.items()} for r in rows.to_dict("records")]

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock beside the file: local optuna workers and concurrent
        sweeps append to one file, a Parquet append rewrites it, and a search claims a
        layout (costs/claims.py) only after reading the file again."""
        self.real_path.parent.mkdir(parents=True, exist_ok=True)
        if sys.platform == "win32":  # unlocked: no flock, and no local workers fork there
            yield
            return
        descriptor = self._lock_descriptor()
        if descriptor is not None:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            except OSError:  # a folder on NFS takes no exclusive flock: append unlocked
                os.close(descriptor)
                descriptor = None
        try:
            yield
        finally:
            if descriptor is not None:
                os.close(descriptor)  # releases the lock

    def _lock_descriptor(self) -> int | None:
        """What to flock: `.NAME.lock` beside the file; where the folder takes no new file
        (a writable measurement file in a read-only folder, which appends alone still
        work in), the folder itself; None where neither can be opened."""
        try:
            return os.open(self.real_path.with_name(f".{self.real_path.name}.lock"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        except OSError:
            pass
        try:
            return os.open(self.real_path.parent, os.O_RDONLY)
        except OSError:
            return None

    def append(self, row: Mapping[str, Any]) -> None:
        with self.locked():
            self._append(row)

    def _append(self, row: Mapping[str, Any]) -> None:
        empty = self.is_empty()
        if is_parquet(self.path):
            self._append_parquet(row, empty)
            return
        values = {k: ("" if isinstance(v, float) and math.isnan(v) else v)
                  for k, v in row.items()}
        if empty:
            fields = list(FILE_COLUMNS)
        else:
            # The header as the readers see it (spaces after commas and a byte-order mark
            # dropped), so that each value goes under the column that is read back.
            fields = list(map(str, parse_csv(self.path, nrows=0).columns))
            missing = [c for c in FILE_COLUMNS if c not in fields and c in values]
            if missing:
                fields = self._add_csv_columns(missing)
        with self.path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore",
                                    lineterminator="\n")
            if empty:
                writer.writeheader()
            elif not self._ends_with_newline():
                handle.write("\n")
            writer.writerow(values)
            _sync(handle)

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) in (b"\n", b"\r")

    def _add_csv_columns(self, missing: list[str]) -> list[str]:
        """Rewrite the CSV with `missing` columns added (old rows: the schema's default of
        an optional column, else empty), its cells kept as written and a row that leaves
        out trailing empty cells filled by name; atomically, so a kill leaves either file
        whole. The new header."""
        table = parse_csv(self.path, dtype=str, keep_default_na=False)
        for column in missing:
            table[column] = str(OPTIONAL_DEFAULTS.get(column, ""))
        self._replace(lambda handle: table.to_csv(handle, index=False, lineterminator="\n"))
        # The user's file changed shape: say so (a dataset of their own, named by mistake).
        say(f"measurements: added column(s) {', '.join(missing)} to {self.path} for the "
              f"runs measured now; its {len(table)} earlier rows are kept as written")
        return list(map(str, table.columns))

    def _append_parquet(self, row: Mapping[str, Any], empty: bool) -> None:
        """Parquet cannot be appended to: the table is written again with the new row."""
        new = pd.DataFrame([dict(row)], columns=list(dict.fromkeys([*FILE_COLUMNS, *row])))
        table = new if empty else pd.concat([read_table(self.path), new], ignore_index=True)
        for column, default in OPTIONAL_DEFAULTS.items():
            table[column] = with_default(table[column], default)
        self._replace(lambda handle: table.to_parquet(handle, index=False), binary=True)

    def _replace(self, write: Callable[[Any], None], binary: bool = False) -> None:
        """The file written anew by `write(handle)` into a temporary beside it, then moved
        over it: a kill midway leaves the old file whole."""
        temporary = self.real_path.with_name(f".{self.real_path.name}.{os.getpid()}.tmp")
        with temporary.open("wb" if binary else "w", newline=None if binary else "") as handle:
            write(handle)
            _sync(handle)
        os.replace(temporary, self.real_path)


def _sync(handle: Any) -> None:
    handle.flush()  # a SIGKILL right after must not lose the row
    os.fsync(handle.fileno())  # nor a crash or power loss of the machine
