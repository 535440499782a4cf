"""The grid driver: price every candidate that passes the rules, in one call.

    ranked = GridDriver().run(problem)
"""

from __future__ import annotations

import pandas as pd

from layoutsearch.problem import SearchProblem


class GridDriver:
    """Exhaustive search; with the analytic model a million layouts take about a second."""

    name = "grid"

    def run(self, problem: SearchProblem) -> pd.DataFrame:
        return problem.evaluate(problem.candidates)
