"""Where the benchmarks find measured runs: `--runs PATH`, else $LAYOUTSEARCH_RUNS, else the
study's runs beside the checkout (../shared/data/hagemann2023/runs.csv) when present.

    parser.add_argument("--runs", type=Path, default=default_runs(), help=RUNS_HELP)
"""

from __future__ import annotations

import os
from pathlib import Path

BESIDE_CHECKOUT = Path(__file__).resolve().parents[2] / "shared/data/hagemann2023/runs.csv"
RUNS_HELP = ("measurement file in the layoutsearch measurement schema (default: "
             "$LAYOUTSEARCH_RUNS, else ../shared/data/hagemann2023/runs.csv)")


def default_runs() -> Path:
    return Path(os.environ.get("LAYOUTSEARCH_RUNS", BESIDE_CHECKOUT))
