"""Where the benchmarks find measured runs: `--runs PATH`, else $LAYOUTSEARCH_RUNS, else the
study's runs beside the checkout (../shared/data/hagemann2023/runs.csv) when present.

    parser.add_argument("--runs", type=Path, default=default_runs(), help=RUNS_HELP)
    runs = read_runs(parser, parser.parse_args().runs)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pandas as pd

from layoutsearch.errors import LayoutSearchError
from layoutsearch.measurements import read_measurements

BESIDE_CHECKOUT = Path(__file__).resolve().parents[2] / "shared/data/hagemann2023/runs.csv"
RUNS_HELP = ("measurement file in the layoutsearch measurement schema (default: "
             "$LAYOUTSEARCH_RUNS, else ../shared/data/hagemann2023/runs.csv)")


def default_runs() -> Path:
    return Path(os.environ.get("LAYOUTSEARCH_RUNS", BESIDE_CHECKOUT))


def read_runs(parser: argparse.ArgumentParser, path: Path) -> pd.DataFrame:
    """The measurement file `--runs` names, validated; a file that cannot be read, breaks
    the schema or holds no finished run (status ok) ends the benchmark as a command-line
    mistake, with the file's problem and exit status 2, not with a traceback or a table of
    NaN: every benchmark compares against measured runs that finished."""
    try:
        runs = read_measurements(path)
    except LayoutSearchError as error:
        parser.error(f"--runs {path}: {error}")
    if not (runs["status"] == "ok").any():
        statuses = "".join(f", {n} {s}" for s, n in runs["status"].value_counts().items())
        parser.error(f"--runs {path}: no run has status ok ({len(runs)} rows{statuses}); the "
                     "benchmarks compare measured runs that finished")
    return runs
