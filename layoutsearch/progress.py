"""A one-line progress display for long searches: layouts priced and the best MFU so far.

Drivers call `update` after each batch they price. The line goes to stderr, rewritten in
place (`\\r`) and throttled, only when stderr is a terminal or `LAYOUTSEARCH_PROGRESS=1`
(set it in notebooks and CI logs; `0` silences it everywhere). A line of its own printed
while the progress line shows (a measured search's line per launch) goes through `say`,
which clears the progress line first and paints it again below.

    with Progress(total=len(candidates), label="grid") as progress:
        progress.update(priced_rows)   # the frame of rows priced in this batch
    say("local: launch 3 of 8: llama_13b_..._tp2_pp4_...: ok, 4.10 s per step")
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
_shown: Progress | None = None
"""The progress line painted last and not yet ended with its newline: the cursor is at its
end, so whatever is printed next would run on from it."""


def say(line: str) -> None:
    """Print `line` on stderr as a line of its own; a progress line there is cleared first
    and painted again after it, instead of the line running on from it and the next repaint
    (a carriage return) overwriting its start."""
    shown = _shown if _shown is not None and _shown.stream is sys.stderr else None
    if shown is not None:
        shown.stream.write("\r" + " " * len(shown.painted) + "\r")
    print(line, file=sys.stderr, flush=True)
    if shown is not None:
        shown.paint(force=True)


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
        self.painted = ""
        """The line on screen now ("" before the first paint)."""
        self._last_paint = 0.0

    def update(self, priced: pd.DataFrame) -> None:
        """Count the rows of `priced` (with `mfu` and `fits`) and keep the best that fits."""
        self.done += len(priced)
        feasible = priced[priced["fits"].astype(bool) & priced["mfu"].notna()]
        if not feasible.empty:
            top = feasible.iloc[int(feasible["mfu"].to_numpy().argmax())]
            if self.best_mfu is None or float(top["mfu"]) > self.best_mfu:
                self.best_mfu = float(top["mfu"])
                self.best_layout = Layout.from_row(top).describe()
        self.paint(force=False)

    def line(self) -> str:
        """'grid: 120/2240 layouts priced · best MFU 63.1 % (tp4 pp1 ...)'."""
        count = f"{self.done}/{self.total}" if self.total else str(self.done)
        best = (f"best MFU {100 * self.best_mfu:.1f} % ({self.best_layout})"
                if self.best_mfu is not None else "nothing fits yet")
        noun = "layout" if count == "1" else "layouts"
        return f"{self.label}: {count} {noun} priced · {best}"

    def paint(self, *, force: bool) -> None:
        global _shown
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_paint < self.min_interval_s:
            return
        self._last_paint = now
        # Padded over a longer line painted before, whose tail would otherwise stay.
        line = self.line().ljust(len(self.painted))
        self.stream.write("\r" + line)
        self.stream.flush()
        self.painted, _shown = line, self

    def close(self) -> None:
        global _shown
        if self.enabled:
            self.paint(force=True)
            self.stream.write("\n")
            self.stream.flush()
        if _shown is self:
            _shown = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
