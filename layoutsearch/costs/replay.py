"""The replay cost model: prices layouts from a measurement file instead of formulas.

A candidate is matched to the measured runs of the same job and layout (one vectorized
merge); its price is what was measured. Repeats of one layout are averaged; a layout that
was never measured is reported as unmeasured, never guessed. It stands in for an expensive
backend in tests and benchmarks, and replays a user's own past runs.

    model = build_cost_model("replay", path="runs.csv")
    scored = model.score(candidates, clusters)   # NaN where not measured, with the reason

Matching is on the model's dimensions, not on the free-text `model` column: a user's
`ModelSpec` may be called `my-13b` while the file says `llama_13b`; what decides whether a
run is the same job is its shape (layers, widths, heads, vocabulary, MLP and embedding
kind), sequence length, GPU kind and count, node size and global batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.costs.base import MEASURED, UNMEASURED
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import LAYOUT_COLUMNS
from layoutsearch.measurements import JOB_KEY, MEASUREMENT_KEY, as_searched, read_measurements
from layoutsearch.specs import ClusterSpec

FAILED_REASONS = {
    "oom": f"{MEASURED}: out of memory",
    "unavailable": f"{MEASURED}: unavailable (a kernel refused the shape)",
    "error": f"{MEASURED}: the run failed",
    "timeout": f"{MEASURED}: the run timed out",
}
"""`cost_reason` of a layout none of whose runs finished, by status (docs/measurements.md)."""
FAILURE_ORDER = ("oom", "unavailable", "error", "timeout")
"""Which failure speaks for a layout whose runs failed in different ways: running out of
memory is the most telling."""
FAILED_RUNS = {
    "oom": "ran out of memory",
    "unavailable": "hit a kernel that refused the shape",
    "error": "failed",
    "timeout": "timed out",
}
"""How the `cost_reason` of a layout that fits says some of its repeated runs did not finish
("measured: 1 of 2 runs ran out of memory"): it fits by most runs, but only just."""
REASON_ONLY = ("failure", "failed_runs")
"""Columns of `summarize_runs` that word a reason and change no price: the fingerprint leaves
them out, so that a study resumes under the same file as before they were added."""


def _canonical(frame: pd.DataFrame) -> pd.DataFrame:
    """The key columns, with the knobs that change nothing for a layout as a search keeps
    them (measurements.as_searched), so a run measured either way prices that layout."""
    keys = frame.loc[:, list(MEASUREMENT_KEY)].copy()
    for knob, values in as_searched(keys).items():
        keys[knob] = values
    for column in ("gpu", "attention", "recompute", "normalization"):
        keys[column] = keys[column].astype(str)
    return keys


def summarize_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per measured layout: its status, mean step time, MFU and memory, its runs,
    and how many of them failed in the way `failure` names (the most telling, FAILURE_ORDER).

    As the fidelity benchmark does (docs/fidelity.md), a layout measured several times counts as
    `ok` when at least half of its runs finished; its figures are the mean over those runs.
    """
    keys = _canonical(runs)
    keys["_ok"] = runs["status"] == "ok"
    keys["_failure"] = runs["status"].map({s: i for i, s in enumerate(FAILURE_ORDER)})
    # Averages are over the runs that finished; a failed run has no step time or MFU.
    for column in ("step_time_s", "mfu", "peak_memory_gib"):
        values = runs[column] if column in runs.columns else pd.Series(np.nan, index=runs.index)
        keys[column] = pd.to_numeric(values, errors="coerce").where(keys["_ok"])
    grouped = keys.groupby(list(MEASUREMENT_KEY), sort=False, dropna=False)
    summary = grouped[["step_time_s", "mfu", "peak_memory_gib"]].mean()
    summary["runs"] = grouped.size()
    failure = grouped["_failure"].min().map(dict(enumerate(FAILURE_ORDER)))
    ran = grouped["_ok"].mean() >= 0.5
    summary["status"] = failure.where(~ran, "ok")
    summary["failure"] = failure
    # Runs that failed in that way, for a layout that fits by most runs to say how many.
    summary["failed_runs"] = keys.assign(
        _worst=keys["_failure"].eq(grouped["_failure"].transform("min"))
    ).groupby(list(MEASUREMENT_KEY), sort=False, dropna=False)["_worst"].sum()
    summary.loc[~ran, ["step_time_s", "mfu", "peak_memory_gib"]] = np.nan
    return summary.reset_index()


def _unknown_job(job: pd.Series, measured_jobs: pd.DataFrame, source: str) -> str:
    """Why a job has no runs in the file: its fields that differ from the file's nearest job.

    A search over a job the file never measured (vocabulary 32000 against the study's
    128000, say) would otherwise report every layout as merely unmeasured.
    """
    if measured_jobs.empty:
        return f"{UNMEASURED}{source} holds no runs"
    differs = measured_jobs.ne(job[measured_jobs.columns].to_numpy(), axis=1).to_numpy()
    closest = int(differs.sum(axis=1).argmin())
    nearest = measured_jobs.iloc[closest]
    fields = [f"{c}={job[c]} where the nearest measured job has {nearest[c]}"
              for c, differ in zip(measured_jobs.columns, differs[closest], strict=True)
              if differ]
    jobs = len(measured_jobs)
    return (f"{UNMEASURED}{source} has no runs of this job (it holds {jobs} other "
            f"job{'s' * (jobs != 1)}): this job has " + ", ".join(fields))


def _unrun(keys: pd.DataFrame, measured: pd.DataFrame) -> dict[str, np.ndarray]:
    """For each layout column, whether each row's value of it is one no run of its job has."""
    unrun = {}
    for column in LAYOUT_COLUMNS:
        on = [*JOB_KEY, column]
        unrun[column] = keys[on].merge(measured[on].drop_duplicates().assign(_ran=True),
                                       on=on, how="left")["_ran"].isna().to_numpy()
    return unrun


def _unseen_values(keys: pd.DataFrame, measured: pd.DataFrame) -> np.ndarray:
    """For each row, a layout value no run of its job has ("knob=value"; "" where each
    value was run): a space that asks for what the file never ran (overlap_grad_reduce=True
    against runs without it) says so, not merely "unmeasured". Of several, the knob whose
    unrun values leave the most rows unpriced is named: the one to pin first."""
    unrun = _unrun(keys, measured)
    out = np.full(len(keys), "", dtype=object)
    for column in sorted(unrun, key=lambda c: -int(unrun[c].sum())):
        first = unrun[column] & (out == "")
        out[first] = column + "=" + keys[column].astype(str).to_numpy()[first]
    return out


def _values(values: pd.Series) -> list[Any]:
    """A column's distinct values, sorted."""
    return sorted(pd.unique(values).tolist())


class ReplayCostModel:
    """What was measured for each layout; unmeasured layouts stay unpriced."""

    name = "replay"

    def __init__(self, runs: pd.DataFrame, source: str = "measurements") -> None:
        self.source = source
        self.measured = summarize_runs(runs)

    def fingerprint(self) -> str:
        """A digest of the summarized measurements that price (not of the file's name)."""
        digest = pd.util.hash_pandas_object(self.measured.drop(columns=list(REASON_ONLY)),
                                            index=False).sum()
        return f"{int(digest) & (2**64 - 1):016x}"

    def fingerprint_covers(self) -> str:
        return (f"the runs of {self.source} as layoutsearch reads them: the file changed, or a "
                "newer layoutsearch reads it differently")

    @classmethod
    def load(cls, path: str | Path) -> ReplayCostModel:
        """From a measurement file (CSV, or Parquet by its suffix), validated on reading."""
        return cls(read_measurements(path), source=str(path))

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str = "") -> ReplayCostModel:
        """From a `cost_models/replay.yaml` config: `path` to the measurement file."""
        unknown = set(config) - {"path"}
        if unknown:
            raise LayoutSearchError(
                f"{source}: unknown setting(s) {', '.join(sorted(unknown))} for the replay "
                "cost model; it takes 'path' (a measurement file, CSV or Parquet)"
            )
        path = config.get("path")
        if path in (None, "", "???"):
            # The command line sets the chosen group's keys; a model named elsewhere (a
            # prescreen, a warm start) takes its settings from a file of its own.
            example = ("cost_models.path=runs.csv" if source.startswith("cost_models=") else
                       "a YAML file of its own, named by its path (_target_: "
                       f"{__name__}.ReplayCostModel, path: runs.csv)")
            raise LayoutSearchError(
                f"{source}: the replay cost model needs 'path', a measurement file "
                f"(CSV or Parquet, docs/measurements.md); e.g. {example}"
            )
        return cls.load(str(path))

    def unpriced(self, candidates: pd.DataFrame,
                 clusters: Mapping[str, ClusterSpec]) -> pd.Series:
        """The reason of each layout the file never measured ("" for the others): matching
        is one merge, so this is `score` with the figures left out."""
        reasons = self.score(candidates, clusters)["cost_reason"].astype(str)
        return reasons.where(reasons.str.startswith(UNMEASURED), "")

    def coverage_note(self, candidates: pd.DataFrame,
                      clusters: Mapping[str, ClusterSpec]) -> str:
        """How many of `candidates` (a search's layouts that pass the rules) the file
        measured, when it did not measure them all; when it measured fewer than half, the
        knob values its runs of their job never have and the pin that keeps a search to
        the values it ran. "" when it measured every one, or holds no runs of their job
        (the no-fit message says so)."""
        if candidates.empty:
            return ""
        keys = _canonical(candidates)
        jobs = keys[list(JOB_KEY)].drop_duplicates()
        runs = self.measured.merge(jobs, on=list(JOB_KEY))  # this search's job, not others
        if runs.empty:
            return ""
        measured = int(self.score(candidates, clusters)["measured_runs"].gt(0).sum())
        unmeasured = len(keys) - measured
        if not unmeasured:
            return ""
        note = (f"{self.source} measured {measured} of the {len(keys)} layouts of the space "
                f"that pass the rules for this job; the other {unmeasured} "
                f"{'has' if unmeasured == 1 else 'have'} no figures "
                "(unmeasured, never guessed): the ranking is of the measured ones alone.")
        if 2 * unmeasured <= len(keys):
            return note
        never, pins = [], []
        unruns = _unrun(keys, runs)
        # dp follows from tp, pp and cp (it cannot be pinned); the knob leaving the most
        # layouts unmeasured first, as the rows' reasons name it.
        for column in sorted(set(unruns) - {"dp"}, key=lambda c: (-int(unruns[c].sum()),
                                                                 LAYOUT_COLUMNS.index(c))):
            unrun = unruns[column]
            if not unrun.any():
                continue
            never.append(f"{column}={' or '.join(map(str, _values(keys[column][unrun])))}")
            # Of the space's values, those the file ran; or, where it ran none, its own.
            ran = keys[column][~unrun]
            pinned = ",".join(map(str, _values(ran if len(ran) else runs[column])))
            pins.append(f"{column}=[{pinned}]")
        return (f"{note} Its runs of this job never have {', '.join(never)}; pin "
                f"{' '.join(pins)} (search_spaces.<knob>=[...] on the command line) to keep "
                "the search to the knob values it ran.")

    def score(
        self, candidates: pd.DataFrame, clusters: Mapping[str, ClusterSpec]
    ) -> pd.DataFrame:
        missing = [c for c in MEASUREMENT_KEY if c not in candidates.columns]
        if missing:
            raise LayoutSearchError(
                f"replay cost model: candidates lack column(s) {', '.join(missing)} "
                "needed to match them to measured runs"
            )
        keys = _canonical(candidates)
        keys["_row"] = np.arange(len(keys))
        matched = keys.merge(self.measured, on=list(MEASUREMENT_KEY), how="left", sort=False)
        matched = matched.sort_values("_row", kind="stable")
        status = matched["status"].fillna("unmeasured").to_numpy(dtype=object)
        step = matched["step_time_s"].to_numpy(dtype=float)
        tokens_per_step = (
            candidates["global_batch_size"].to_numpy(dtype=float)
            * candidates["seq_length"].to_numpy(dtype=float)
        )
        reason = pd.Series(status).map(FAILED_REASONS).fillna("").to_numpy(dtype=object)
        # Fits by most of its runs, not by all: a marginal layout, which the reason says.
        marginal = (status == "ok") & matched["failure"].notna().to_numpy()
        if marginal.any():
            some = matched[marginal]
            reason[marginal] = (f"{MEASURED}: " + some["failed_runs"].astype(int).astype(str)
                                + " of " + some["runs"].astype(int).astype(str) + " runs "
                                + some["failure"].map(FAILED_RUNS)).to_numpy()
        unmeasured = status == "unmeasured"
        reason[unmeasured] = f"{UNMEASURED}no measurement of this layout in {self.source}"
        if unmeasured.any():  # an optuna trial's one measured row needs no merges
            unseen = np.full(len(keys), "", dtype=object)
            unseen[unmeasured] = _unseen_values(keys[unmeasured], self.measured)
            never = unseen != ""
            reason[never] = (f"{UNMEASURED}no measurement of this layout in {self.source}, "
                             "whose runs of this job never have ") + unseen[never]
        # One message per job the file never measured (a search has one job, many rows).
        measured_jobs = self.measured[list(JOB_KEY)].drop_duplicates().reset_index(drop=True)
        job_keys = keys[list(JOB_KEY)].reset_index(drop=True)
        known = job_keys.merge(measured_jobs.assign(_known=True), on=list(JOB_KEY),
                               how="left")["_known"].fillna(False).to_numpy(dtype=bool)
        unknown = job_keys[~known]
        for job, rows in unknown.groupby(list(JOB_KEY), sort=False).groups.items():
            message = _unknown_job(pd.Series(job, index=list(JOB_KEY)), measured_jobs,
                                   self.source)
            reason[np.asarray(rows)] = message
        return pd.DataFrame(
            {
                "step_time_s": step,
                "mfu": matched["mfu"].to_numpy(dtype=float),
                "tokens_per_s": tokens_per_step / step,
                "peak_memory_gib": matched["peak_memory_gib"].to_numpy(dtype=float),
                "fits": status == "ok",
                "cost_reason": reason,
                "measured_runs": matched["runs"].fillna(0).to_numpy(dtype=np.int64),
            },
            index=candidates.index,
        )
