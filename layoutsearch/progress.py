"""A one-line progress display for long searches: layouts priced and the best MFU so far.

Drivers call `update` after each batch they price. The line goes to stderr, rewritten in
place (`\\r`) and throttled, only when stderr is a terminal or `LAYOUTSEARCH_PROGRESS=1`
(set it in notebooks and CI logs; `0` silences it everywhere).

    with Progress(total=len(candidates), label="grid") as progress:
        progress.update(priced_rows)   # the frame of rows priced in this batch
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import TextIO

import pandas as pd

from layoutsearch.layout import Layout

ENV_SWITCH = "LAYOUTSEARCH_PROGRESS"


def progress_enabled(stream: TextIO) -> bool:
    """`LAYOUTSEARCH_PROGRESS` decides when set; otherwise only a terminal gets a line."""
    setting = os.environ.get(ENV_SWITCH, "").strip().lower()
    if setting:
        return setting not in ("0", "false", "no", "off")
    return bool(getattr(stream, "isatty", lambda: False)())


class Progress:
    """Counts priced layouts and remembers the best feasible one."""

    def __init__(self, *, total: int | None = None, label: str = "search",
                 stream: TextIO | None = None, enabled: bool | None = None,
                 min_interval_s: float = 0.2) -> None:
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = progress_enabled(self.stream) if enabled is None else enabled
        self.min_interval_s = min_interval_s  # repaints per second stay below 1/this
        self.done = 0
        self.best_mfu: float | None = None
        self.best_layout = ""
        self._last_paint = 0.0

    def update(self, priced: pd.DataFrame) -> None:
        """Count the rows of `priced` (with `mfu` and `fits`) and keep the best that fits."""
        self.done += len(priced)
        feasible = priced[priced["fits"].astype(bool) & priced["mfu"].notna()]
        if not feasible.empty:
            top = feasible.iloc[int(feasible["mfu"].to_numpy().argmax())]
            if self.best_mfu is None or float(top["mfu"]) > self.best_mfu:
                self.best_mfu = float(top["mfu"])
                self.best_layout = Layout.from_row({str(k): v for k, v in top.items()}).describe()
        self._paint(force=False)

    def line(self) -> str:
        """'grid: 120/2240 layouts priced · best MFU 63.1 % (tp4 pp1 ...)'."""
        count = f"{self.done}/{self.total}" if self.total else str(self.done)
        best = (f"best MFU {100 * self.best_mfu:.1f} % ({self.best_layout})"
                if self.best_mfu is not None else "nothing fits yet")
        noun = "layout" if count == "1" else "layouts"
        return f"{self.label}: {count} {noun} priced · {best}"

    def _paint(self, *, force: bool) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_paint < self.min_interval_s:
            return
        self._last_paint = now
        self.stream.write("\r" + self.line())
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._paint(force=True)
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
