"""`layoutsearch-calibrate MEASUREMENTS.csv`: fit, report fidelity, write the fitted config.

Prints fidelity (docs/fidelity.md) of the starting constants (by default the a-priori
`analytic_prior`) and of the constants fitted on all jobs, then the leave-one-job-out table:
per held-out job the prior's figures beside those of a fit on the other jobs, with a verdict,
and the pooled held-out figures. Writes a `cost_models/` file with the fit's provenance.

    layoutsearch-calibrate runs.csv --out cost_models/calibrated.yaml
    main(["runs.csv", "--no-cv"])
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import shlex
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from layoutsearch.calibration.fit import (
    FIDELITY_COLUMNS,
    checked_free,
    cross_validate,
    fit_constants,
    memory_is_pinned,
    scored,
    usable_rows,
)
from layoutsearch.calibration.memory import GRID
from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.costs.constants import (
    ANALYTIC_TARGET,
    CONSTANTS_SUFFIXES,
    AnalyticConstants,
    constants_path,
    load_constants,
)
from layoutsearch.errors import LayoutSearchError
from layoutsearch.fidelity import GROUP_COLUMNS
from layoutsearch.measurements import read_measurements
from layoutsearch.paths import unwritable_file

SUMMARY = ("fit_accuracy", "min_spearman", "max_regret_points", "top3_hits", "mape")


def write_config(path: str | Path, constants: Mapping[str, AnalyticConstants],
                 provenance: Mapping[str, Any]) -> Path:
    """A `cost_models/` file of the analytic model's shape plus a `provenance:` block."""
    config = {
        "_target_": "layoutsearch.costs.analytic.AnalyticCostModel",
        "provenance": dict(provenance),
        "gpus": {gpu: {k: float(v) for k, v in c.to_dict().items()}
                 for gpu, c in constants.items()},
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Analytic constants calibrated by layoutsearch-calibrate; see provenance.\n"
                    + yaml.safe_dump(config, sort_keys=False))
    return path


def _figures(summary: Mapping[str, float]) -> dict[str, float]:
    return {name: round(float(summary[name]), 4) for name in SUMMARY}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="layoutsearch-calibrate", description=main.__doc__)
    parser.add_argument("measurements", help="a measurement file (docs/measurements.md schema)")
    parser.add_argument("--out", default="cost_models/calibrated.yaml",
                        help="the YAML file to write: fitted constants and their provenance "
                        "(default %(default)s; in a --config-dir's cost_models/ folder, "
                        "cost_models=<its name> selects it)")
    parser.add_argument("--base", default="analytic_prior",
                        help="constants to start from and compare with (name or YAML path; default "
                        "%(default)s)")
    parser.add_argument("--free", default=None,
                        help="comma-separated time constants to fit (default: those that move "
                        "a predicted step time on these rows)")
    parser.add_argument("--keep-memory", action="store_true",
                        help="keep the base's memory constants instead of fitting them")
    parser.add_argument("--max-evals", type=int, default=600,
                        help="most loss evaluations of the time constants' simplex fit "
                        "(default %(default)s)")
    parser.add_argument("--memory-grid", type=int, default=GRID,
                        help="grid points per continuous memory constant (default "
                        "%(default)s)")
    parser.add_argument("--no-cv", action="store_true", help="skip the cross-validation")
    return parser


@contextlib.contextmanager
def _warnings_printed(prefix: str = "") -> Iterator[None]:
    """Print the fit's warnings (a GPU kind left out, time constants kept) as one line each,
    once per message, instead of Python's file-and-line form."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for message in dict.fromkeys(str(w.message) for w in caught):
                print(f"layoutsearch-calibrate: warning: {prefix}{message}", file=sys.stderr)


def _rows_of_base_kinds(rows: pd.DataFrame, base: Mapping[str, AnalyticConstants],
                        name: str) -> pd.DataFrame:
    """The rows of the GPU kinds `base` has constants for: the others can be neither fitted
    (nothing to start from) nor scored before and after. Says which it leaves out."""
    missing = sorted(set(rows["gpu"]) - set(base))
    if not missing:
        return rows
    kept = rows[rows["gpu"].isin(list(base))]  # labels kept: errors name the file's lines
    advice = (f"--base {name} has no constants for GPU kind(s) {', '.join(missing)} (a "
              "calibrated file holds only the kinds it fitted); start from analytic_prior, "
              "which has every kind, to fit them")
    if kept.empty:
        raise LayoutSearchError(advice)
    print(f"layoutsearch-calibrate: warning: {len(rows) - len(kept)} rows left out: {advice}",
          file=sys.stderr)
    return kept


def main(argv: Sequence[str] | None = None) -> int:
    """Fit the analytic constants to measured runs; print fidelity before, after and LOJO."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        base_file = constants_path(args.base, target=ANALYTIC_TARGET)
    except LayoutSearchError as error:
        parser.error(f"--base {args.base}: {error}")
    problem = _unwritable(args.out, args.measurements, base_file)
    if problem:
        parser.error(f"--out {args.out}: {problem}")  # before the fit, not after it
    free = None if args.free is None else [n.strip() for n in args.free.split(",") if n.strip()]
    if free == []:  # not the default set: that is --free left out
        parser.error(f"--free {args.free!r}: names no constant; leave --free out to fit those "
                     "that move a predicted step time, or name them separated by commas")
    settings: dict[str, Any] = {"max_evals": args.max_evals, "memory_grid": args.memory_grid,
                                "fit_memory_constants": not args.keep_memory}
    clusters = clusters_by_gpu()
    try:
        free = None if free is None else checked_free(free)  # as the provenance names them
        rows = read_measurements(args.measurements, gpus=clusters)
        base = load_constants(args.base)
        rows = _rows_of_base_kinds(rows, base, args.base)
        with _warnings_printed():
            fitted = fit_constants(rows, base, free, clusters=clusters, **settings)
    except LayoutSearchError as error:
        parser.error(str(error))
    # Scored and written are the kinds fitted: the file holds no constants for the others.
    unfitted = sorted(set(rows["gpu"]) - set(fitted))
    if unfitted:
        rows = rows[rows["gpu"].isin(list(fitted))]
        print(f"layoutsearch-calibrate: warning: the rows of {', '.join(unfitted)} are left "
              "out of the figures below: their constants were not fitted", file=sys.stderr)
    before_table, before = scored(rows, base, clusters)
    after_table, after = scored(rows, {**base, **fitted}, clusters)
    pd.set_option("display.width", 200)
    show = [*GROUP_COLUMNS, "rows", *FIDELITY_COLUMNS, "top3_hit"]
    print(f"fidelity on {args.measurements} ({len(rows)} rows), in-sample")
    print(f"before ({args.base}):\n" + before_table[show].round(3).to_string(index=False))
    print("after (fitted on all jobs):\n" + after_table[show].round(3).to_string(index=False))
    print(f"summary before: {_figures(before)}\nsummary after:  {_figures(after)}")
    used = usable_rows(rows, clusters, warn=False)  # the fit warned of the others
    pinned = {str(gpu): memory_is_pinned(group) for gpu, group in used.groupby("gpu")}
    unpinned = [gpu for gpu, fitted_memory in pinned.items() if not fitted_memory]
    memory_method = (
        "kept from the base (--keep-memory)" if args.keep_memory
        else "kept from the base (no row ran out of memory)" if len(unpinned) == len(pinned)
        else "fewest wrong ok/oom calls, widest margin (grid)" + (
            f"; kept from the base for {', '.join(unpinned)} (no row ran out of memory)"
            if unpinned else ""))
    provenance: dict[str, Any] = {
        "data": str(Path(args.measurements).resolve()),
        # The file may change after the fit: its digest says which version was fitted.
        "data_sha256": hashlib.sha256(Path(args.measurements).read_bytes()).hexdigest(),
        "date": datetime.date.today().isoformat(),
        "layoutsearch": _version(),
        "settings": {"max_evals": args.max_evals, "memory_grid": args.memory_grid,
                     "keep_memory": bool(args.keep_memory)},
        "rows": len(used),
        "rows_note": "ok/oom rows of the fitted GPU kinds that pass the rules (other rows say "
                     "nothing of speed or memory; a rule-breaking one is warned of)",
        # A config name as given; a file by its full path, as `data`.
        "base": args.base if Path(args.base).suffix not in CONSTANTS_SUFFIXES
        else str(base_file.resolve()), "free": free or "default",
        "method": f"memory constants: {memory_method}; time constants: absolute log "
                  "step-time error + per-job pair-order and regret penalties + log-normal pull "
                  "to the base (coordinate scan, Nelder-Mead), within physical and published "
                  "bounds",
        "in_sample_before": _figures(before), "in_sample_after": _figures(after),
    }
    try:
        with _warnings_printed(prefix="leave-one-job-out: "):
            validated = None if args.no_cv else cross_validate(
                rows, base, free, clusters=clusters, **settings)
    except LayoutSearchError as error:
        print(f"layoutsearch-calibrate: cross-validation skipped: {error}", file=sys.stderr)
        provenance["leave_one_job_out"] = f"skipped: {error}"
        validated = None
    if validated is not None:
        cv, pooled = validated
        print(f"leave-one-job-out: fit on the other jobs, score the held-out one "
              f"(prior = {args.base})")
        columns = [*GROUP_COLUMNS,
                   *(f"{c}_{w}" for c in FIDELITY_COLUMNS for w in ("prior", "cv")), "verdict"]
        unscored = cv["verdict"].astype(str).str.startswith("not scored")
        # The table says "not scored" alone: the list below says why, once per job.
        shown = cv[columns].round(3).assign(verdict=cv["verdict"].where(~unscored,
                                                                        "not scored (below)"))
        print(shown.to_string(index=False))
        good = int((cv["verdict"] == "at least as good").sum())
        held_out_scored = len(cv) - int(unscored.sum())
        print(f"held-out jobs at least as good as the prior: {good} of {held_out_scored}"
              + (f" scored ({int(unscored.sum())} not scored)" if unscored.any() else ""))
        # Each job by every field that makes it one (docs/fidelity.md's group).
        held_out = {" ".join(str(r[c]) for c in GROUP_COLUMNS): r
                    for r in cv.to_dict("records")}
        print("change in rho, held-out fit - prior, with its 95 % paired-bootstrap interval "
              "over the job's runs (an interval holding 0 is within their noise):")
        for job, r in held_out.items():
            change = r["spearman_cv"] - r["spearman_prior"]
            print(f"  {job}: " + (
                str(r["verdict"]) if str(r["verdict"]).startswith("not scored")
                else "no ok rows, no rho" if pd.isna(change)
                else f"{change:+.3f} [{r['spearman_change_low']:+.3f}, "
                     f"{r['spearman_change_high']:+.3f}]"))
        print(f"leave-one-job-out pooled: {_figures(pooled)}")
        provenance["leave_one_job_out"] = {
            job: {**{f"{c}_{w}": round(float(r[f"{c}_{w}"]), 4)
                     for c in FIDELITY_COLUMNS for w in ("prior", "cv")
                     if not pd.isna(r[f"{c}_{w}"])},
                  **({"spearman_change_95": [round(float(r["spearman_change_low"]), 4),
                                             round(float(r["spearman_change_high"]), 4)]}
                     if not pd.isna(r["spearman_change_low"]) else {}),
                  "verdict": str(r["verdict"])}
            for job, r in held_out.items()}
        provenance["leave_one_job_out_pooled"] = _figures(pooled)
    # Only the GPU kinds fitted: a search on another kind then says the file has no
    # constants for it, instead of quietly using the base's.
    provenance["gpus"] = sorted(fitted)
    for gpu, constants in fitted.items():
        changed = {k: round(v, 6) for k, v in constants.to_dict().items()
                   if v != getattr(base[gpu], k)}
        if changed:
            print(f"fitted {gpu}: {changed}")
    try:
        path = write_config(args.out, fitted, provenance)
    except OSError as error:
        # A fixed short name: the one asked for may be what could not be written.
        kept = write_config(Path(tempfile.mkdtemp(prefix="layoutsearch-calibrate-"))
                            / "calibrated.yaml", fitted, provenance)
        print(f"layoutsearch-calibrate: error: --out {args.out}: cannot be written "
              f"({error}); the fit is kept in {kept}", file=sys.stderr)
        return 1
    print(f"wrote {path}\n{_how_to_use(path)}")
    return 0


def _version() -> str:
    """This layoutsearch's version, as installed (a checkout on PYTHONPATH has none)."""
    try:
        return version("layoutsearch")
    except PackageNotFoundError:
        return "not installed (a source checkout)"


def _unwritable(out: str, measurements: str, base_file: Path) -> str | None:
    """Why the fitted constants cannot be written at `out` (None: they can), checked
    before the fit."""
    problem = unwritable_file(out)
    if problem:
        return problem
    path = Path(out)
    if path.is_file() and path.resolve() == Path(measurements).resolve():
        return "is the measurement file; name another file for the fitted constants"
    if path.is_file() and path.resolve() == base_file.resolve():
        return ("is the base constants' file (--base), which holds what the fit starts from "
                "and perhaps other GPU kinds; name another file for the fitted constants")
    if path.suffix in CONSTANTS_SUFFIXES:
        return None
    # cost_model= reads only YAML; a .csv name would overwrite a measurement file.
    return (f"must end in {' or '.join(CONSTANTS_SUFFIXES)}: the fitted constants are a "
            f"cost_models/ YAML file (e.g. {path.with_suffix('.yaml').name})")


def _how_to_use(path: Path) -> str:
    """How to search with a written file: the CLI finds a `cost_models/` option through
    --config-dir (the folder holding `cost_models/`), Python takes the path."""
    path = path.resolve()
    python = f'layoutsearch.search(..., cost_model="{path}")'
    if path.parent.name != "cost_models" or path.suffix != ".yaml":  # Hydra reads .yaml
        return (f"use it from Python: {python}; for the CLI, save it as {path.stem}.yaml in a "
                "folder named cost_models and pass that folder's parent with --config-dir")
    return (f"use it: layoutsearch --config-dir {shlex.quote(str(path.parent.parent))} "
            f"cost_models={path.stem} ..., or from Python: {python}")


if __name__ == "__main__":  # python -m layoutsearch.calibration.cli, as the console script
    sys.exit(main())
