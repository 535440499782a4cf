"""The optuna driver (`driver=optuna`): Bayesian layout search under a budget of evaluations.

    from layoutsearch.drivers.optuna import OptunaDriver
"""

from __future__ import annotations

from layoutsearch.drivers.optuna.driver import DIRECTIONS, OptunaDriver
from layoutsearch.drivers.optuna.storage import open_storage

__all__ = ["DIRECTIONS", "OptunaDriver", "open_storage"]
