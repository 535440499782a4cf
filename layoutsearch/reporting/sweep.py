"""One table for a whole `--multirun`: every job's overrides, best layout and MFU.

Reads each job's `ranked.csv` (or the `error.txt` of a job whose input was wrong), its
`notes.yaml` and `.hydra/overrides.yaml` from a sweep directory (so it works with any
launcher, local or remote) and writes `multirun.csv`, `multirun.md` and `multirun_mfu.png`
there. The CLI's Hydra callback (`cli.MultirunSummary`) calls it when a
sweep ends; it can also be run on a finished sweep directory. A sweep run again into the
same directory (a fixed `hydra.sweep.dir`) is told from the jobs of the earlier one by a
file the callback touches as it starts: outputs older than it are left out.

    layoutsearch --multirun model=llama_13b,llama_30b num_gpus=64,128 seq_length=2048,8192
    table = collect_sweep(Path("multirun/2026-01-01/12-00-00"))
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from matplotlib.figure import Figure

from layoutsearch.layout import LAYOUT_COLUMNS
from layoutsearch.megatron.emit import SCRIPTS_DIR
from layoutsearch.reporting.explain import label
from layoutsearch.reporting.markdown import REPORT_FILE, markdown_table
from layoutsearch.reporting.plots import FIGURE_NAMES

JOB_COLUMNS = ("model", "vocab_size", "gpu", "num_gpus", "seq_length", "global_batch_size")
BEST_COLUMNS = (*LAYOUT_COLUMNS, "mfu", "step_time_s", "tokens_per_s", "peak_memory_gib",
                "fits", "reason")
RANKED_FILE = "ranked.csv"
"""A job's whole ranking (cli/)."""
PARTIAL_SUFFIX = ".partial"
"""`ranked.csv` is written under this suffix first and renamed when complete: a Ctrl-C while
a large ranking is written leaves no truncated `ranked.csv` for a sweep's summary to read."""
ERROR_FILE = "error.txt"
"""What a job of a sweep writes instead of `ranked.csv` when its input is wrong (cli/)."""
NOTES_FILE = "notes.yaml"
"""The search's notes on its answer, which `ranked.csv` cannot carry, beside it (cli/)."""
NOTE_TAGS = {"headroom_note": "tight memory", "close_call_note": "close call",
             "fabric_note": "slow fabric", "constants_note": "a-priori constants",
             "mfu_convention_note": "long-context MFU",
             "dry_run_note": "dry run", "failed_launches_note": "failed launches",
             "rejected_commands_note": "commands rejected", "batch_note": "batch caps dp",
             "coverage_note": "partly measured"}
"""`ranked.attrs` notes a job records, with the tag the sweep table shows for each."""
NO_FIT_NOTE = "message"
"""`ranked.attrs` entry that says why nothing fits and what to change (api.search)."""
SPACE_SIZE = "space_size"
"""`ranked.attrs` entry: the layouts in the job's space, of which a sampling driver (optuna)
returns only those it tried (api.search)."""
SWEEP_START_FILE = ".sweep_started"
"""Touched in the sweep directory as a sweep starts; its time stamp, set by the same file
system as the jobs' outputs (not by this machine's clock), dates the sweep's jobs."""
EARLIER_JOBS = "earlier_jobs"
"""`table.attrs` entry: how many outputs of an earlier sweep into this directory were left out."""


SWEEPS_UNDER_WAY: list[Path] = []
"""The sweep directory of the `--multirun` under way in this process (set by
`mark_sweep_start`, cleared by `mark_sweep_end`), so that a Ctrl-C, which ends the multirun
without its end callback, can still summarize the jobs that finished (`layoutsearch.cli`)."""


def mark_sweep_start(sweep_dir: Path) -> None:
    """Date the sweep now starting in `sweep_dir` (see SWEEP_START_FILE)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / SWEEP_START_FILE).touch()
    SWEEPS_UNDER_WAY[:] = [sweep_dir]


def mark_sweep_end() -> None:
    """The sweep under way has ended (its summary is the end callback's to write)."""
    SWEEPS_UNDER_WAY.clear()


def forget_job_outputs(job_dir: Path) -> None:
    """Remove what an earlier run of this job left (a rerun into the same directory): the
    summary must not read an old ranking beside a new error, nor a reader find an old
    report, its figures or launch scripts beside it."""
    files = (RANKED_FILE, RANKED_FILE + PARTIAL_SUFFIX, NOTES_FILE, ERROR_FILE, REPORT_FILE,
             *(f"{name}.png" for name in FIGURE_NAMES))
    for name in files:
        (job_dir / name).unlink(missing_ok=True)
    shutil.rmtree(job_dir / SCRIPTS_DIR, ignore_errors=True)


def write_ranking(ranked: pd.DataFrame, job_dir: Path) -> Path:
    """`ranked.csv`, whole or not at all (written aside, then renamed over)."""
    path = job_dir / RANKED_FILE
    partial = path.with_name(RANKED_FILE + PARTIAL_SUFFIX)
    ranked.to_csv(partial, index=False)
    partial.replace(path)
    return path


def write_notes(ranked: pd.DataFrame, job_dir: Path) -> Path:
    """`notes.yaml`: the ranking's non-empty notes and the size of its space
    (`ranked.attrs`), by name."""
    notes = {name: ranked.attrs[name] for name in (*NOTE_TAGS, NO_FIT_NOTE, SPACE_SIZE)
             if ranked.attrs.get(name)}
    path = job_dir / NOTES_FILE
    path.write_text(yaml.safe_dump(notes, sort_keys=False, width=1_000))
    return path


def _overrides(job_dir: Path) -> str:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return ""
    return " ".join(str(o) for o in yaml.safe_load(path.read_text()) or [])


def collect_sweep(sweep_dir: Path) -> pd.DataFrame:
    """One row per job of the latest sweep into `sweep_dir`: its best (first) row, or its
    `error` message."""
    rows: list[dict[str, Any]] = []
    outputs = [*sweep_dir.rglob(RANKED_FILE), *sweep_dir.rglob(ERROR_FILE)]
    start = sweep_dir / SWEEP_START_FILE
    started = start.stat().st_mtime if start.is_file() else -np.inf
    current = [o for o in outputs if o.stat().st_mtime >= started]
    earlier = len(outputs) - len(current)
    # One row per job: a job whose ranking was written before an error (in writing its
    # launch scripts, say) shows both, and counts once.
    job_dirs = {o.parent: _job_key(sweep_dir, o) for o in current}
    for job_dir in sorted(job_dirs, key=job_dirs.__getitem__):
        row: dict[str, Any] = {"job": str(job_dir.relative_to(sweep_dir)),
                               "overrides": _overrides(job_dir)}
        error = job_dir / ERROR_FILE
        if error in current:
            row["error"] = error.read_text().strip()
        output = job_dir / RANKED_FILE
        ranked = (pd.read_csv(output, low_memory=False)  # types from whole columns
                  if output in current else pd.DataFrame())
        if ranked.empty:
            rows.append(row)
            continue
        best = ranked.iloc[0]
        row.update({c: best[c] for c in JOB_COLUMNS if c in best.index})
        notes = job_dir / NOTES_FILE
        recorded = (yaml.safe_load(notes.read_text()) or {}) if notes.is_file() else {}
        row["candidates"] = int(recorded.get(SPACE_SIZE, len(ranked)))
        row["tried"] = len(ranked)
        row["feasible"] = int(ranked["fits"].astype(bool).sum())
        # The first row of a job where nothing fits is no answer: its figures stay out.
        fits = bool(best["fits"])
        row.update({c: best[c] for c in BEST_COLUMNS if c in best.index and (fits or c == "fits")})
        row["layout"] = label(best) if fits else ""
        row.update({name: recorded[name] for name in (*NOTE_TAGS, NO_FIT_NOTE)
                    if recorded.get(name)})
        rows.append(row)
    # A failed job has no sizes: nullable integers keep the others' 8 from becoming 8.0.
    table = pd.DataFrame(rows).convert_dtypes()
    table.attrs[EARLIER_JOBS] = earlier
    return table


def _nothing_fits(row: pd.Series) -> str:
    """The job's own message (the smallest footprint and what to change)."""
    message = row.get(NO_FIT_NOTE)
    return str(message) if pd.notna(message) else "nothing fits"


def _job_key(sweep_dir: Path, output: Path) -> tuple[Any, ...]:
    # Hydra numbers jobs 0, 1, ... 10: sort numerically, not as text.
    parts = output.parent.relative_to(sweep_dir).parts
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts)


BAR_LABEL_CHARACTERS = 60
"""Longer bar labels are cut: a 10-inch chart has room for about that many beside its bars."""


def bar_labels(table: pd.DataFrame) -> list[str]:
    """Each job's overrides without those every job shares (a measurement file's path, say),
    cut to BAR_LABEL_CHARACTERS; the job number where nothing is left."""
    overrides = [str(o).split() if pd.notna(o) else [] for o in table["overrides"]]
    shared = set.intersection(*map(set, overrides)) if len(overrides) > 1 else set()
    labels = []
    for job, own in zip(table["job"], overrides, strict=True):
        text = " ".join(o for o in own if o not in shared) or f"job {job}"
        cut = BAR_LABEL_CHARACTERS - 1
        labels.append(text if len(text) <= BAR_LABEL_CHARACTERS else text[:cut] + "…")
    return labels


def mfu_figure(table: pd.DataFrame) -> Figure:
    """The best MFU of every job of the sweep as horizontal bars."""
    names = bar_labels(table)
    empty = pd.Series(np.nan, index=table.index)
    mfu = 100 * pd.to_numeric(table.get("mfu", empty), errors="coerce").fillna(0.0).to_numpy()
    fits = (table["fits"].fillna(False).astype(bool).to_numpy() if "fits" in table
            else np.zeros(len(table), dtype=bool))  # every job failed
    failed = table.get("error", empty).notna().to_numpy()
    fig = Figure(figsize=(10, 1.5 + 0.35 * len(table)), dpi=110, layout="constrained")
    ax = fig.subplots()
    bars = ax.barh(names, np.where(fits, mfu, 0.0), color="tab:blue")
    for bar, value, fit, error in zip(bars, mfu, fits, failed, strict=True):
        text = f"{value:.1f} %" if fit else "error" if error else "nothing fits"
        ax.text(bar.get_width() + 0.5, bar.get_y() + bar.get_height() / 2, text,
                va="center", fontsize=8)
    ax.invert_yaxis()  # the first job on top
    ax.set_xlabel("best MFU (%)")
    ax.set_xlim(0, max(float(mfu.max(initial=0.0)) * 1.15, 10.0))
    ax.set_title("Best layout's MFU per job of the sweep")
    ax.grid(axis="x", alpha=0.3)
    return fig


def write_summary(table: pd.DataFrame, sweep_dir: Path) -> Path:
    """`multirun.csv`, `multirun_mfu.png` and `multirun.md` in the sweep directory."""
    table.to_csv(sweep_dir / "multirun.csv", index=False)
    lines = [f"# Sweep summary: {len(table)} job{'s' * (len(table) != 1)}", ""]
    if earlier := table.attrs.get(EARLIER_JOBS):
        lines += [f"Left out: the outputs of {earlier} job{'s' * (earlier != 1)} of an earlier "
                  "sweep into this directory.", ""]
    if not table.empty:
        mfu_figure(table).savefig(sweep_dir / "multirun_mfu.png")
        rows = []
        for _, r in table.iterrows():
            fits = bool(r.get("fits", False)) if pd.notna(r.get("fits")) else False
            error = r.get("error")
            failed = pd.notna(error)
            rows.append([
                f"[{r['job']}]({r['job']}/{ERROR_FILE if failed else REPORT_FILE})",
                r["overrides"] or "(defaults)",
                f"error: {error}" if failed else
                r["layout"] if fits else _nothing_fits(r),
                f"{100 * r['mfu']:.1f}" if fits else "—",
                f"{r['step_time_s']:.2f}" if fits else "—",
                f"{r['peak_memory_gib']:.1f}" if fits else "—",
                ", ".join(tag for name, tag in NOTE_TAGS.items() if pd.notna(r.get(name))),
            ])
        lines += ["![best MFU per job](multirun_mfu.png)", "",
                  markdown_table(rows, ["job", "overrides", "best layout", "MFU (%)",
                                        "step time (s)", "peak memory (GiB)", "notes"]),
                  ""]
    path = sweep_dir / "multirun.md"
    path.write_text("\n".join(lines))
    return path
