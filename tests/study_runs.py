"""Where tests find the study's measured runs: beside the checkout (../shared), read only.

The file is not part of the repository; tests that need it skip, naming the path they looked
at, where it is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

STUDY_RUNS = Path(__file__).resolve().parents[2] / "shared/data/hagemann2023/runs.csv"
needs_study_runs = pytest.mark.skipif(not STUDY_RUNS.is_file(),
                                      reason=f"the study's measured runs are not at {STUDY_RUNS}")
