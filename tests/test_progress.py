"""The progress line: layouts priced and the best feasible MFU so far."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from layoutsearch.progress import Progress, progress_enabled


def _rows(*rows: tuple[int, float | None, bool]) -> pd.DataFrame:
    return pd.DataFrame([{"tp": tp, "mfu": mfu, "fits": fits} for tp, mfu, fits in rows])


def test_keeps_the_best_feasible_layout_and_counts_rows() -> None:
    stream = io.StringIO()
    with Progress(total=10, label="grid", stream=stream, enabled=True,
                  min_interval_s=0.0) as progress:
        progress.update(_rows((1, 0.5, True), (2, 0.9, False)))  # 0.9 does not fit
        progress.update(_rows((4, 0.6, True), (8, None, False)))
    assert progress.done == 4
    assert progress.best_mfu == pytest.approx(0.6)
    assert progress.line().startswith("grid: 4/10 layouts priced · best MFU 60.0 % (tp4 pp1")
    assert stream.getvalue().endswith(progress.line() + "\n")
    assert stream.getvalue().startswith("\r")


def test_silent_unless_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.delenv("LAYOUTSEARCH_PROGRESS", raising=False)
    assert not progress_enabled(stream)  # not a terminal
    with Progress(stream=stream) as progress:
        progress.update(_rows((1, 0.5, True)))
    assert stream.getvalue() == ""
    assert progress.line().startswith("search: 1 layout priced · best MFU 50.0 %")
    assert "nothing fits yet" in Progress().line()
    monkeypatch.setenv("LAYOUTSEARCH_PROGRESS", "1")
    assert progress_enabled(stream)
    monkeypatch.setenv("LAYOUTSEARCH_PROGRESS", "0")
    assert not progress_enabled(stream)
