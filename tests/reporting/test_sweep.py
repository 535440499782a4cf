"""The multirun callback: one table and a summary for a whole sweep."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from layoutsearch import search
from layoutsearch.errors import LayoutSearchError
from layoutsearch.reporting.sweep import (
    ERROR_FILE,
    NOTES_FILE,
    bar_labels,
    collect_sweep,
    mark_sweep_start,
    write_summary,
)
from tests.commands import Command


def _job(sweep: Path, name: str, overrides: list[str], rows: list[dict[str, object]]) -> None:
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    pd.DataFrame(rows).to_csv(job / "ranked.csv", index=False)


def _wrong_size() -> str:
    """The error of a job of 12 GPUs on nodes of 8, as the command records it: its wording
    is the search's own, so a sweep's summary is checked against what a job writes."""
    with pytest.raises(LayoutSearchError) as error:
        search(model="llama_13b", num_gpus=12, seq_length=2048, global_batch_size=2048)
    return str(error.value)


ROW = {"model": "llama_13b", "num_gpus": 64, "seq_length": 2048, "global_batch_size": 2048,
       "tp": 1, "pp": 2, "dp": 32, "micro_batch_size": 1, "sequence_parallel": False,
       "attention": "flash2", "rmsnorm_kernel": True, "recompute": "none", "mfu": 0.61,
       "step_time_s": 20.0, "peak_memory_gib": 70.0, "fits": True, "reason": ""}


def test_collect_takes_each_jobs_best_row_in_job_order(tmp_path: Path) -> None:
    _job(tmp_path, "10", ["num_gpus=128"], [{**ROW, "num_gpus": 128, "mfu": 0.5},
                                            {**ROW, "mfu": 0.4}])
    _job(tmp_path, "2", ["num_gpus=64"], [ROW])
    _job(tmp_path, "3", ["num_gpus=8"], [{**ROW, "fits": False, "mfu": 0.7,
                                          "reason": "needs 843 GiB > 80 GiB"}])
    why = "no layout fits: the smallest per-GPU footprint is 120 GiB > 80 GiB; use more GPUs"
    (tmp_path / "3" / NOTES_FILE).write_text(yaml.safe_dump({"message": why}))
    table = collect_sweep(tmp_path)
    assert list(table["job"]) == ["2", "3", "10"]  # numeric, not text order
    assert list(table["overrides"]) == ["num_gpus=64", "num_gpus=8", "num_gpus=128"]
    assert table.loc[2, "mfu"] == 0.5 and table.loc[2, "candidates"] == 2
    assert table.loc[0, "layout"] == "tp1 pp2 dp32 mb1 flash2+rmsnorm recompute=none"
    # A job where nothing fits shows its own message, not its first row's figures.
    assert pd.isna(table.loc[1, "mfu"]) and pd.isna(table.loc[1, "peak_memory_gib"])
    summary = write_summary(table, tmp_path).read_text()
    assert f"| [3](3/report.md) | num_gpus=8 | {why} | — |" in summary
    assert "843" not in summary
    assert "| [2](2/report.md) | num_gpus=64 | tp1 pp2" in summary
    assert pd.read_csv(tmp_path / "multirun.csv").shape[0] == 3
    assert (tmp_path / "multirun_mfu.png").stat().st_size > 5_000


def test_a_job_that_failed_is_listed_with_its_error(tmp_path: Path) -> None:
    _job(tmp_path, "0", ["num_gpus=64"], [ROW])
    failed = tmp_path / "1"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["num_gpus=12"]))
    error = _wrong_size()
    assert error.startswith("num_gpus=12: must be a whole number of nodes")  # the key typed
    (failed / ERROR_FILE).write_text(f"{error}\n")
    table = collect_sweep(tmp_path)
    assert list(table["job"]) == ["0", "1"]
    assert pd.isna(table.loc[0, "error"])
    assert table.loc[1, "error"] == error
    summary = write_summary(table, tmp_path).read_text()
    assert f"| [1](1/error.txt) | num_gpus=12 | error: {error} |" in summary
    # The failed job's empty sizes leave the others' integers as integers in the CSV.
    written = (tmp_path / "multirun.csv").read_text().splitlines()
    assert ",llama_13b,64,2048,2048," in written[1] and "64.0" not in written[1]


def test_a_job_that_failed_after_its_ranking_is_one_row_with_both(tmp_path: Path) -> None:
    # emit=megatron refused a setting after ranked.csv was written: one job, one failure.
    _job(tmp_path, "0", ["emit=megatron"], [ROW])
    (tmp_path / "0" / ERROR_FILE).write_text("megatron.slurm.timeout_min=-5: must be ...\n")
    table = collect_sweep(tmp_path)
    assert len(table) == 1 and table.loc[0, "mfu"] == 0.61
    assert table.loc[0, "error"].startswith("megatron.slurm.timeout_min=-5")
    assert "| [0](0/error.txt) | emit=megatron | error: " in write_summary(
        table, tmp_path).read_text()


def test_the_command_writes_the_sweep_table(tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch("--multirun", "num_gpus=64,128", "search_spaces.tp=[1,2]",
                            "search_spaces.pp=[1,2]", f"hydra.sweep.dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "multirun.csv")
    assert [o.split()[0] for o in table["overrides"]] == ["num_gpus=64", "num_gpus=128"]
    assert list(table["num_gpus"]) == [64, 128]
    for job in ("0", "1"):
        ranked = pd.read_csv(tmp_path / job / "ranked.csv")
        assert table.loc[int(job), "mfu"] == ranked.loc[0, "mfu"]
        assert (tmp_path / job / "report.md").is_file()
    summary = (tmp_path / "multirun.md").read_text()
    assert "# Sweep summary: 2 jobs" in summary
    # Each job's notes reach the sweep table: 13B on 64 GPUs has close runners-up (and room
    # to spare), as the same search in Python says.
    ranked = search(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048,
                    tp=[1, 2], pp=[1, 2])
    assert ranked.attrs["close_call_note"] and not ranked.attrs["headroom_note"]
    notes = yaml.safe_load((tmp_path / "0" / NOTES_FILE).read_text())
    assert notes == {"close_call_note": ranked.attrs["close_call_note"],
                     "fabric_note": ranked.attrs["fabric_note"], "space_size": len(ranked)}
    assert table.loc[0, "candidates"] == table.loc[0, "tried"] == len(ranked)  # a grid
    assert table.loc[0, "close_call_note"] == ranked.attrs["close_call_note"]
    first = next(line for line in summary.splitlines() if line.startswith("| [0](0/report.md)"))
    assert first.endswith("| close call, slow fabric |")


def test_a_rerun_forgets_the_jobs_old_outputs_and_notes_keep_their_own_keys(
        tmp_path: Path) -> None:
    from layoutsearch.reporting.sweep import forget_job_outputs
    _job(tmp_path, "0", ["num_gpus=64"], [ROW])
    (tmp_path / "0" / NOTES_FILE).write_text(yaml.safe_dump(
        {"close_call_note": "2 other layouts are within 5 %", "mfu": 0.99, "headroom_note": ""}))
    table = collect_sweep(tmp_path)
    assert table.loc[0, "mfu"] == 0.61  # a stray key in notes.yaml overwrites nothing
    assert table.loc[0, "close_call_note"] == "2 other layouts are within 5 %"
    assert "headroom_note" not in table.columns
    # The same job rerun into this directory with a wrong input: only its error is left,
    # not the earlier run's report, figures and launch scripts either.
    job = tmp_path / "0"
    for name in ("report.md", "breakdown.png", "tp_pp_heatmap.png", "megatron/01_tp1.sh"):
        (job / name).parent.mkdir(exist_ok=True)
        (job / name).write_text("from the earlier run\n")
    (job / ".hydra").mkdir(exist_ok=True)
    (job / ".hydra" / "overrides.yaml").write_text("- num_gpus=12\n")
    forget_job_outputs(job)
    assert sorted(p.name for p in job.iterdir()) == [".hydra"]
    (tmp_path / "0" / ERROR_FILE).write_text(f"{_wrong_size()}\n")
    table = collect_sweep(tmp_path)
    assert len(table) == 1 and table.loc[0, "error"] == _wrong_size()


def test_outputs_older_than_the_sweep_start_are_an_earlier_sweeps(tmp_path: Path) -> None:
    _job(tmp_path, "0", ["num_gpus=64"], [ROW])
    _job(tmp_path, "1", ["num_gpus=128"], [{**ROW, "num_gpus": 128}])
    for job in ("0", "1"):  # written an hour before the sweep now starting
        os.utime(tmp_path / job / "ranked.csv", (0, (tmp_path / job).stat().st_mtime - 3600))
    mark_sweep_start(tmp_path)
    (tmp_path / "0" / "ranked.csv").unlink()  # job 0 ran again, with a wrong input
    (tmp_path / "0" / ERROR_FILE).write_text(f"{_wrong_size()}\n")
    table = collect_sweep(tmp_path)
    assert list(table["job"]) == ["0"] and table.attrs["earlier_jobs"] == 1
    summary = write_summary(table, tmp_path).read_text()
    assert "Left out: the outputs of 1 job of an earlier" in summary
    # A folder summarized without a start mark (a sweep of another tool) keeps every job.
    (tmp_path / ".sweep_started").unlink()
    assert list(collect_sweep(tmp_path)["job"]) == ["0", "1"]


def test_a_sampling_jobs_space_and_its_tried_layouts_are_told_apart(tmp_path: Path) -> None:
    # An optuna job returns the layouts it tried; its notes keep the size of its space.
    _job(tmp_path, "0", ["driver=optuna"], [ROW, {**ROW, "tp": 2, "mfu": 0.5}])
    (tmp_path / "0" / NOTES_FILE).write_text(yaml.safe_dump({"space_size": 2240}))
    table = collect_sweep(tmp_path)
    assert (table.loc[0, "candidates"], table.loc[0, "tried"]) == (2240, 2)


def test_chart_labels_drop_the_overrides_every_job_shares() -> None:
    path = "cost_models.path=/data/" + "x" * 80 + "/runs.csv"
    table = pd.DataFrame({"job": [0, 1, 2], "overrides": [
        f"num_gpus=64 {path}", f"num_gpus=128 {path}", f"num_gpus=256 {path} " + "y" * 70]})
    labels = bar_labels(table)
    assert labels[:2] == ["num_gpus=64", "num_gpus=128"]
    assert len(labels[2]) == 60 and labels[2].startswith("num_gpus=256 yyy")
    assert labels[2].endswith("…")
    # One job shares everything with itself: its label is its own overrides.
    assert bar_labels(table.iloc[:1]) == [f"num_gpus=64 {path}"[:59] + "…"]
    assert bar_labels(pd.DataFrame({"job": [0], "overrides": [""]})) == ["job 0"]
