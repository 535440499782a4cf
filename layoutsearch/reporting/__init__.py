"""Reports people can read: `report.md` with figures, explanations and the study's rules.

    ranked = layoutsearch.search(model="llama_13b", num_gpus=64, seq_length=2048,
                                 global_batch_size=2048)
    layoutsearch.report(ranked, "my_report")   # my_report/report.md + PNGs
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from layoutsearch.errors import LayoutSearchError, type_of
from layoutsearch.paths import unwritable_folder
from layoutsearch.reporting.explain import require_ranking
from layoutsearch.reporting.markdown import write_report
from layoutsearch.reporting.study_rules import StudyCheck, check_study_rules
from layoutsearch.results import TOP_K, job_of

DEFAULT_DIR = Path("layoutsearch-report")


def report(result: pd.DataFrame, out_dir: str | Path | None = None, *,
           top_k: int = TOP_K) -> Path:
    """Write the report of a `search` result into `out_dir`; returns the path of report.md.

    `out_dir` defaults to `./layoutsearch-report`; the frame must carry its job in
    `attrs["job"]`, as `search` leaves it (and its `to_parquet` file keeps it).
    """
    if not isinstance(result, pd.DataFrame):
        raise LayoutSearchError(
            f"report(result={result!r:.60}): must be the DataFrame layoutsearch.search "
            f"returned, not {type_of(result)}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise LayoutSearchError(f"report(top_k={top_k!r}): must be an integer >= 1")
    if out_dir is not None and not isinstance(out_dir, str | Path):
        raise LayoutSearchError(f"report(out_dir={out_dir!r}): must be the path of a folder, "
                                f"or None for ./{DEFAULT_DIR}")
    require_ranking(result, "report(result)")
    job_of(result, "report(result)")
    folder = Path(out_dir) if out_dir is not None else DEFAULT_DIR
    problem = unwritable_folder(folder)
    if problem:  # the report is a folder: report.md and its figures
        raise LayoutSearchError(f"report(result, out_dir={str(folder)!r}): {problem}")
    return write_report(result, folder, top_k=top_k)


__all__ = ["StudyCheck", "check_study_rules", "report", "write_report"]
