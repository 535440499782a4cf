"""The benchmarks' `--runs` file: a bad one ends the benchmark as a command-line mistake."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


@pytest.fixture
def read_runs(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as `python benchmarks/x.py` finds it
    from measured_runs import read_runs

    return read_runs


def refusal(read_runs: Any, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    parser = argparse.ArgumentParser(prog="bench")
    with pytest.raises(SystemExit) as stop:
        read_runs(parser, path)
    assert stop.value.code == 2  # argparse's status for a wrong command line
    return capsys.readouterr().err.splitlines()[-1]


def test_a_file_that_breaks_the_schema_is_named(
        tmp_path: Path, measurement_row: dict[str, Any], read_runs: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runs.csv"
    pd.DataFrame([measurement_row]).to_csv(path, index=False, sep=";")
    assert refusal(read_runs, path, capsys).startswith(
        f"bench: error: --runs {path}: measurement file '{path}' is separated by semicolons")
    missing = tmp_path / "none.csv"
    assert refusal(read_runs, missing, capsys) == (
        f"bench: error: --runs {missing}: measurement file '{missing}' does not exist")


def test_a_file_without_a_finished_run_is_refused(
        tmp_path: Path, measurement_row: dict[str, Any], read_runs: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Every benchmark compares with measured MFUs: without one, published_runs failed in
    # max() and study_findings printed "best measured nan %".
    path = tmp_path / "runs.csv"
    oom = {**measurement_row, "status": "oom", "step_time_s": None, "mfu": None}
    pd.DataFrame([oom, {**oom, "micro_batch_size": 2}]).to_csv(path, index=False)
    assert refusal(read_runs, path, capsys) == (
        f"bench: error: --runs {path}: no run has status ok (2 rows, 2 oom); the benchmarks "
        "compare measured runs that finished")
    ran = tmp_path / "ran.csv"
    pd.DataFrame([measurement_row, oom]).to_csv(ran, index=False)
    assert read_runs(argparse.ArgumentParser(), ran)["status"].tolist() == ["ok", "oom"]


def test_a_benchmark_given_a_bad_file_prints_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text("model;tp\nllama_13b;2\n")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "published_runs.py"), "--runs",
                           str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"published_runs.py: error: --runs {path}: measurement file" in done.stderr


@pytest.mark.parametrize(("argument", "error"), [
    ("foo", "argument --driver: 'foo': must be KEY=VALUE, e.g. n_startup_trials=5"),
    ("n_startup_trials=-1", "--driver: driver.n_startup_trials=-1: must be an integer >= 0"),
    ("seed=3", "--driver seed=...: set by the benchmark for each run (n_trials, target, seed, "
               "progress, warm_start); try other settings"),
])
def test_a_bad_driver_setting_of_search_efficiency_is_named(
        tmp_path: Path, argument: str, error: str) -> None:
    # They failed with ValueError or TypeError tracebacks, after the runs were read.
    done = subprocess.run([sys.executable, str(BENCHMARKS / "search_efficiency.py"),
                           "--runs", str(tmp_path / "unread.csv"), "--driver", argument],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"search_efficiency.py: error: {error}"
