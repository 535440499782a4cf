"""Calibrate the analytic model's constants to measured runs; score the fit honestly.

Starts from a-priori constants (`cost_models/analytic_prior.yaml`), fits the memory
constants to the ok/oom outcomes (memory.py), then the time constants to step times and
per-job rankings (timing.py), all within physical and published bounds (bounds.py). The
honest figure is the leave-one-job-out cross-validation (fit.py); `layoutsearch-calibrate`
(cli.py) prints it and writes the fitted config with its provenance.

    fitted = fit_constants(read_measurements("runs.csv"), load_constants("analytic_prior"))
    write_config("cost_models/calibrated.yaml", fitted, {"data": "runs.csv"})
"""

from __future__ import annotations

from layoutsearch.calibration.bounds import Bound, bounds_for, nelder_mead
from layoutsearch.calibration.cli import main, write_config
from layoutsearch.calibration.fit import cross_validate, fit_constants
from layoutsearch.calibration.memory import MemoryFit, fit_memory

__all__ = ["Bound", "MemoryFit", "bounds_for", "cross_validate", "fit_constants", "fit_memory",
           "main", "nelder_mead", "write_config"]
