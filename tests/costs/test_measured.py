"""The measured cost model end to end on the fake Megatron-LM: prescreen, failures, resume."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest

import layoutsearch
from layoutsearch import lifetime
from layoutsearch.costs import build_cost_model
from layoutsearch.costs.measured import MeasuredCostModel
from layoutsearch.costs.measurement_file import MeasurementFile
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import LAYOUT_COLUMNS, Layout
from layoutsearch.measurements import OPTIONAL_DEFAULTS, read_measurements
from layoutsearch.megatron import parse_log
from layoutsearch.megatron.launchers import SlurmLauncher, build_launcher
from layoutsearch.testing import (
    check_cost_model,
    conformance_candidates,
    fake_measured_model,
    fake_megatron_settings,
    launches,
    running_trials,
)
from tests.checkouts import KNOWS_NO_FLAG, MICRO_BATCH_1_ONLY, write_checkout
from tests.fake_submitit import FakeJob, JobStillRunning, executor_of
from tests.presses import PressesCtrlCWhileFinalized
from tests.rankings import assert_pareto_marks

JOB = dict(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048,
           vocab_size=128000)


def layout_of(row: pd.Series) -> dict:
    return {c: row[c] for c in LAYOUT_COLUMNS}


def without_starts(lines: list[str]) -> list[str]:
    """The lines a measured search told, less those that say a launch started."""
    return [line for line in lines if ": started, time limit " not in line]


def result_lines(told: str) -> list[str]:
    """The lines of `told` (stderr) that give a launch's result, with its log."""
    return [line for line in without_starts(told.splitlines()) if "(log " in line]


def test_measured_search_matches_analytic_and_survives_failures(tmp_path, capsys):
    analytic = layoutsearch.search(**JOB)
    model = fake_measured_model(tmp_path, top_k=4, inject="2=crash,3=hang,4=oom", timeout_s=3)
    ranked = layoutsearch.search(cost_model=model, **JOB)
    # One line per trial on stderr, as it finishes: its status, step time and log.
    told = result_lines(capsys.readouterr().err)
    assert [line.split(": ")[3].split(" ")[0].rstrip(",") for line in told] == [
        "ok", "error", "timeout", "oom"]
    assert " s per step (log " in told[0]
    assert layout_of(ranked.iloc[0]) == layout_of(analytic.iloc[0])
    assert len(launches(tmp_path)) == 4 == model.launched
    rows = read_measurements(tmp_path / "measurements.csv")
    assert list(rows["status"]) == ["ok", "error", "timeout", "oom"]
    ok = rows.iloc[0]
    assert ok["mfu"] == pytest.approx(analytic.iloc[0]["mfu"], rel=0.01)
    assert ok["peak_memory_gib"] == pytest.approx(analytic.iloc[0]["peak_memory_gib"], rel=0.01)
    assert "Segmentation fault" in rows.iloc[1]["message"]
    reasons = ranked["reason"]
    assert reasons.str.startswith("measured timeout").sum() == 1
    assert reasons.str.contains("outside the analytic top-4").any()
    assert reasons.str.startswith("not measured: flash1 cannot be selected").any()
    assert ranked["fits"].sum() == 1
    # The ranking's command is the one launched, with the measured model's settings.
    assert ranked.iloc[0]["megatron_args"] in launches(tmp_path)[0]
    assert "--train-iters 6 " in ranked.iloc[0]["megatron_args"]
    # A second search over the same file launches nothing and answers the same.
    again = layoutsearch.search(cost_model=fake_measured_model(tmp_path, top_k=4), **JOB)
    assert len(launches(tmp_path)) == 4
    assert layout_of(again.iloc[0]) == layout_of(ranked.iloc[0])


SEARCH = """
import sys
import layoutsearch
from layoutsearch.testing import fake_measured_model
model = fake_measured_model(sys.argv[1], top_k=2, sleep_s=float(sys.argv[2]))
layoutsearch.search(cost_model=model, model="llama_13b", num_gpus=64, seq_length=2048,
                    global_batch_size=2048, vocab_size=128000)
"""


def wait_until_no_trial_runs(workdir, seconds: float = 10.0) -> list[int]:
    deadline = time.time() + seconds
    while (running := running_trials(workdir)) and time.time() < deadline:
        time.sleep(0.05)
    return running


def wait_for_lines(path, lines: int, process) -> None:
    deadline = time.time() + 60
    while time.time() < deadline and process.poll() is None:
        if path.is_file() and len(path.read_text().splitlines()) >= lines:
            return
        time.sleep(0.05)


def test_a_killed_search_resumes_without_remeasuring(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", SEARCH, str(tmp_path), "0.5"],
                               start_new_session=True)
    measurements = tmp_path / "measurements.csv"
    wait_for_lines(measurements, 2, process)
    wait_for_lines(tmp_path / "launches.txt", 2, process)  # the second trial is in flight
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    # The trial in flight dies with the search instead of training on, unwatched.
    assert wait_until_no_trial_runs(tmp_path) == []
    recorded = read_measurements(measurements)
    assert len(recorded) == 1
    first = launches(tmp_path)[0]  # the launch whose row was recorded before the kill
    layoutsearch.search(cost_model=fake_measured_model(tmp_path, top_k=2), **JOB)  # resumed
    after = read_measurements(measurements)
    assert len(after) == 2  # every layout exactly once
    assert not after.duplicated(subset=list(LAYOUT_COLUMNS)).any()
    # The recorded layout was never launched again; only the missing one was, again (the
    # trial in flight at the kill was stopped and left no row).
    assert launches(tmp_path).count(first) == 1
    assert len(set(launches(tmp_path))) == 2


INTERRUPTED_LINE = ("measured: interrupted; {file} keeps every finished run, and the same "
                    "command resumes without launching them again")
"""What a measured search stopped by Ctrl-C says last."""

INTERRUPTED = """
import signal
import sys
import layoutsearch
from layoutsearch.testing import fake_measured_model
# A shell starts background jobs with SIGINT ignored, and Python then raises no
# KeyboardInterrupt: restore the handler a terminal's Ctrl-C meets.
signal.signal(signal.SIGINT, signal.default_int_handler)
model = fake_measured_model(sys.argv[1], top_k=2, inject="1=hang")
try:
    layoutsearch.search(cost_model=model, model="llama_13b", num_gpus=64, seq_length=2048,
                        global_batch_size=2048, vocab_size=128000)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.skipif(not Path("/proc/self/environ").is_file(), reason="finds trials in /proc")
def test_ctrl_c_stops_the_trial_in_flight(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(tmp_path)],
                               stderr=subprocess.PIPE, text=True)
    wait_for_lines(tmp_path / "launches.txt", 1, process)
    assert running_trials(tmp_path), "the hanging trial should be running"
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 130
    assert wait_until_no_trial_runs(tmp_path) == []
    # As an optuna study's storage does, the search says what is kept and how to resume.
    told = [line for line in process.stderr.read().splitlines() if "Ctrl-C" in line
            or "interrupted" in line]
    assert re.fullmatch(r"local: launch 1 of 2: llama_13b_\S+: stopped by Ctrl-C before it "
                        r"finished; nothing "
                        r"was recorded, so the same command launches it again", told[0])
    assert told[1:] == [INTERRUPTED_LINE.format(file=tmp_path / "measurements.csv")]


class PressedAsTheFirstTrialTrains:
    """A launcher whose first trial trains as Ctrl-C is pressed inside a finalizer, which
    CPython loses (layoutsearch/interrupts.py). Once a trial has ended, a press waits for
    its row (`deferring_interrupts_once_started`) and is not lost."""

    def __init__(self, inner):
        self.inner, self.name, self.pressed = inner, inner.name, False

    def __getattr__(self, name):
        if name == "inner":  # not set yet (a copy being made): no endless recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def run(self, trial):
        if not self.pressed:
            self.pressed = True
            finalized = PressesCtrlCWhileFinalized()
            del finalized
        return self.inner.run(trial)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_a_finalizer_swallowed_stops_a_measured_search_before_its_next_launch(
        tmp_path):
    # Lost, it let the search launch the next two layouts, each a training run.
    model = fake_measured_model(tmp_path, top_k=3)
    model.launcher = PressedAsTheFirstTrialTrains(model.launcher)
    with pytest.raises(KeyboardInterrupt):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert len(launches(tmp_path)) == 1
    assert list(read_measurements(tmp_path / "measurements.csv")["status"]) == ["ok"]


class PressedWhileRecording(MeasurementFile):
    """A measurement file that Ctrl-C is pressed at as each row is appended to it."""

    def append(self, row):
        signal.raise_signal(signal.SIGINT)
        super().append(row)


def test_a_ctrl_c_pressed_as_a_finished_run_is_recorded_stops_the_search_after_its_row(
        tmp_path, capsys):
    # Raised before the row was written, it lost a run that may have trained for an hour,
    # and the same command launched that layout again.
    model = fake_measured_model(tmp_path, top_k=2)
    model.file = PressedWhileRecording(model.file.path)
    with pytest.raises(KeyboardInterrupt):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert len(launches(tmp_path)) == 1
    assert list(read_measurements(tmp_path / "measurements.csv")["status"]) == ["ok"]
    told = without_starts(capsys.readouterr().err.splitlines())
    assert re.fullmatch(r"local: launch 1 of 2: llama_7b_\S+: ok, \d+\.\d\d s per step "
                        r"\(log \S+\)", told[0])
    assert told[1:] == [INTERRUPTED_LINE.format(file=tmp_path / "measurements.csv")]
    layoutsearch.search(cost_model=fake_measured_model(tmp_path, top_k=2), **SMALL_JOB)
    assert len(launches(tmp_path)) == 2  # the recorded run is not launched again


def press_once(monkeypatch, owner, method: str, *, where=lambda *args: True,
               after: bool = False) -> list[str]:
    """Ctrl-C pressed once, as `owner.method` runs (before it, or `after` it returned) on
    arguments `where` accepts; the list it returns holds the method's name once pressed."""
    pressed: list[str] = []
    original = getattr(owner, method)

    def pressing(*args, **kwargs):
        press = not pressed and where(*args)
        if press and not after:
            pressed.append(method)
            signal.raise_signal(signal.SIGINT)
        result = original(*args, **kwargs)
        if press and after:
            pressed.append(method)
            signal.raise_signal(signal.SIGINT)
        return result

    monkeypatch.setattr(owner, method, pressing)
    return pressed


OPTUNA = {"name": "optuna", "n_trials": 2, "seed": 0, "progress": False}


@pytest.mark.parametrize("driver", ["grid", OPTUNA], ids=["grid", "optuna"])
def test_a_ctrl_c_pressed_as_a_finished_trials_log_is_read_stops_the_search_after_its_row(
        tmp_path, monkeypatch, capsys, driver):
    # Raised as the local launcher read the log of a trial that had ended, it lost the run:
    # "stopped by Ctrl-C before it finished", no row, and the same command launched it
    # again.
    pressed = press_once(monkeypatch, Path, "read_text", where=lambda path: path.suffix == ".log")
    model = fake_measured_model(tmp_path, top_k=2, inject="1=oom")
    with pytest.raises(KeyboardInterrupt):
        layoutsearch.search(cost_model=model, driver=driver, **SMALL_JOB)
    assert pressed == ["read_text"]
    assert len(launches(tmp_path)) == 1
    assert list(read_measurements(tmp_path / "measurements.csv")["status"]) == ["oom"]
    told = without_starts(capsys.readouterr().err.splitlines())
    assert re.fullmatch(r"local: (launch 1 of 2: )?llama_7b_\S+: oom \(log \S+\.log\)",
                        told[0]), told
    assert told[1:] == [INTERRUPTED_LINE.format(file=tmp_path / "measurements.csv")]
    layoutsearch.search(cost_model=fake_measured_model(tmp_path, top_k=2), driver=driver,
                        **SMALL_JOB)
    assert launches(tmp_path).count(launches(tmp_path)[0]) == 1  # not launched again


def test_a_ctrl_c_pressed_as_the_local_trial_ends_stops_the_search_after_its_row(
        tmp_path, monkeypatch, capsys):
    # Pressed once the trial's torchrun had exited, but before the launcher's wait() saw
    # it (it looks every 50 ms): raised there, the finished run was lost.
    pressed = press_once(monkeypatch, subprocess.Popen, "wait", after=True)
    model = fake_measured_model(tmp_path, top_k=2)
    with pytest.raises(KeyboardInterrupt):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert pressed == ["wait"]
    assert len(launches(tmp_path)) == 1
    assert list(read_measurements(tmp_path / "measurements.csv")["status"]) == ["ok"]
    told = without_starts(capsys.readouterr().err.splitlines())
    assert re.fullmatch(r"local: launch 1 of 2: llama_7b_\S+: ok, \d+\.\d\d s per step "
                        r"\(log \S+\)", told[0]), told
    assert told[1:] == [INTERRUPTED_LINE.format(file=tmp_path / "measurements.csv")]


@pytest.mark.skipif(not Path("/proc/self/environ").is_file(), reason="finds trials in /proc")
def test_a_ctrl_c_as_a_timed_out_trial_stops_kills_it_and_records_its_timeout(
        tmp_path, monkeypatch, capsys):
    # Pressed while a trial past its time limit was given 30 s to stop, it lost the
    # timeout, and the same command waited out the whole time limit again.
    pressed = press_once(monkeypatch, lifetime, "_signal_group")
    model = fake_measured_model(tmp_path, top_k=2, inject="1=hang", timeout_s=2)
    with pytest.raises(KeyboardInterrupt):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert pressed == ["_signal_group"]  # as its torchrun was sent SIGTERM
    assert wait_until_no_trial_runs(tmp_path) == []
    assert len(launches(tmp_path)) == 1
    assert list(read_measurements(tmp_path / "measurements.csv")["status"]) == ["timeout"]
    told = without_starts(capsys.readouterr().err.splitlines())
    assert re.fullmatch(r"local: launch 1 of 2: llama_7b_\S+: timeout \(log \S+\)",
                        told[0]), told
    assert told[1:] == [INTERRUPTED_LINE.format(file=tmp_path / "measurements.csv")]


def slurm_measured_model(tmp_path, job_type: type[FakeJob]) -> tuple[MeasuredCostModel, type]:
    """A measured model on the Slurm launcher, its jobs `job_type`s; and its executor."""
    settings = fake_megatron_settings(tmp_path).replace(launcher="slurm")
    executor = executor_of(job_type)
    return MeasuredCostModel(settings=settings, measurements=tmp_path / "measurements.csv",
                             launcher=SlurmLauncher(settings, executor_factory=executor),
                             prescreen=build_cost_model("analytic"), top_k=2), executor


class EndsAsCtrlCIsPressed(FakeJob):
    """A job that ended as Ctrl-C was pressed, before submitit's wait(), which looks once a
    second, saw it: the press is raised by the first call that waits for the job (results()
    waits too)."""

    pressed = False

    def wait(self):
        if not self.pressed:
            self.pressed = True
            raise KeyboardInterrupt

    def results(self):
        self.wait()
        return super().results()


@pytest.mark.parametrize("job_type, pressed_in", [
    (FakeJob, "stdout"), (EndsAsCtrlCIsPressed, "wait")])
def test_a_ctrl_c_pressed_as_a_slurm_job_ends_stops_the_search_after_its_row(
        tmp_path, monkeypatch, capsys, job_type, pressed_in):
    # Raised as the job's output was read, or as it ended, it lost the finished run.
    if pressed_in == "stdout":
        press_once(monkeypatch, job_type, "stdout")
    model, executor = slurm_measured_model(tmp_path, job_type)
    with pytest.raises(KeyboardInterrupt):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert [job.cancelled for job in executor.jobs] == [False]
    rows = read_measurements(tmp_path / "measurements.csv")
    assert list(rows["status"]) == ["ok"] and list(rows["step_time_s"]) == [3.0]
    told = without_starts(capsys.readouterr().err.splitlines())
    assert re.fullmatch(r"slurm: launch 1 of 2: llama_7b_\S+: ok, 3\.00 s per step "
                        r"\(log \S+\)", told[0]), told
    assert told[1:] == [INTERRUPTED_LINE.format(file=tmp_path / "measurements.csv")]


def test_a_ctrl_c_while_a_slurm_job_runs_cancels_it_and_records_nothing(tmp_path, capsys):
    model, executor = slurm_measured_model(tmp_path, JobStillRunning)
    with pytest.raises(KeyboardInterrupt):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert [job.cancelled for job in executor.jobs] == [True]
    assert not (tmp_path / "measurements.csv").exists()
    told = without_starts(capsys.readouterr().err.splitlines())
    assert re.fullmatch(r"slurm: launch 1 of 2: llama_7b_\S+: stopped by Ctrl-C before it "
                        r"finished; nothing was recorded, so the same command launches it "
                        r"again", told[0]), told
    assert told[1:] == [INTERRUPTED_LINE.format(file=tmp_path / "measurements.csv")]


def test_a_second_ctrl_c_as_a_finished_trials_log_is_read_stops_the_search_at_once(
        tmp_path, monkeypatch, capsys):
    # The first press waits for the row; a second one is for a user who will not wait.
    read_text = Path.read_text

    def pressed_twice(path, *args, **kwargs):
        if path.suffix == ".log":
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", pressed_twice)
    model = fake_measured_model(tmp_path, top_k=2)
    with pytest.raises(KeyboardInterrupt):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert not (tmp_path / "measurements.csv").exists()
    told = without_starts(capsys.readouterr().err.splitlines())
    assert re.fullmatch(r"local: launch 1 of 2: llama_7b_\S+: finished, but a second Ctrl-C "
                        r"stopped the search before it was recorded, so the same command "
                        r"launches it again", told[0]), told


def test_measured_model_conforms_and_never_launches_what_megatron_cannot_run(tmp_path):
    model = MeasuredCostModel(settings=fake_megatron_settings(tmp_path),
                              measurements=tmp_path / "measurements.csv")
    scored = check_cost_model(model, candidates=conformance_candidates(limit=2))
    assert model.launched == 2 and scored["fits"].sum() == 2
    capped = fake_measured_model(tmp_path, prescreen=None, top_k=1)
    table = conformance_candidates(limit=3)
    reasons = capped.score(table, layoutsearch.catalog.clusters_by_gpu())["cost_reason"]
    # Rows 0 and 1 were measured above: priced from the file wherever they rank; row 2,
    # beyond the top_k window, is not launched.
    assert list(reasons.iloc[1:]) == ["", "not measured: beyond top_k=1"]
    assert capped.launched == 0
    flash1 = table.iloc[:1].assign(attention="flash1")
    scored = capped.score(flash1, layoutsearch.catalog.clusters_by_gpu())
    assert scored["cost_reason"].iloc[0].startswith("not measured: flash1 cannot be selected")


def test_unpriced_names_the_layouts_it_would_not_launch_and_launches_nothing(
        tmp_path, candidate, step_time_for):
    model = fake_measured_model(tmp_path)  # prescreened by the analytic model
    clusters = layoutsearch.catalog.clusters_by_gpu()
    runs = conformance_candidates(limit=1)
    flash1 = runs.assign(attention="flash1").set_axis([1])
    too_big = candidate("llama_65b", tp=1, pp=1, num_gpus=8, global_batch_size=64)
    table = pd.concat([runs, flash1, too_big.set_axis([2])])
    unpriced = model.unpriced(table, clusters)
    assert unpriced.iloc[0] == ""
    assert unpriced.iloc[1].startswith("not measured: flash1 cannot be selected")
    assert unpriced.iloc[2].startswith(
        "not measured: the analytic model predicts it does not fit: ")
    assert model.launched == 0 and launches(tmp_path) == []
    # The same flash1 layout measured elsewhere and recorded in the file is priced from it.
    recorded = {**flash1.iloc[0].to_dict(), "gpus_per_node": 8, "status": "ok", "mfu": 0.31}
    model.file.append({**recorded, "step_time_s": step_time_for(recorded, 0.31)})
    assert model.unpriced(flash1, clusters).iloc[0] == ""
    scored = model.score(flash1, clusters)
    assert bool(scored["fits"].iloc[0]) and scored["mfu"].iloc[0] == pytest.approx(0.31)
    assert model.launched == 0


def test_a_recorded_layout_the_prescreen_predicts_does_not_fit_is_priced_from_the_file(
        tmp_path, candidate, step_time_for):
    # The run the file records says what happened; the prescreen only picks what to launch.
    too_big = candidate("llama_65b", tp=1, pp=1, num_gpus=8, global_batch_size=64).iloc[0]
    layout = {k: too_big[k] for k in LAYOUT_COLUMNS if k != "dp"}
    job = dict(model="llama_65b", num_gpus=8, seq_length=2048, global_batch_size=64,
               search_space="default", **layout)
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        predicted = layoutsearch.search(**job)
    assert len(predicted) == 1 and predicted["peak_memory_gib"].iloc[0] > 80
    recorded = {**too_big.to_dict(), "gpus_per_node": 8, "status": "ok", "mfu": 0.31}
    model = fake_measured_model(tmp_path, top_k=1)
    model.file.append({**recorded, "step_time_s": step_time_for(recorded, 0.31)})
    ranked = layoutsearch.search(cost_model=model, **job)
    assert bool(ranked["fits"].iloc[0]) and ranked["reason"].iloc[0] == ""
    assert ranked["mfu"].iloc[0] == pytest.approx(0.31)
    assert model.launched == 0 and launches(tmp_path) == []


def test_recorded_layouts_beyond_top_k_are_priced_from_the_file(tmp_path, step_time_for):
    # top_k caps what is launched and measured now; the file's runs all count, so the best
    # of them is not hidden because the prescreen ranked it lower.
    clusters = layoutsearch.catalog.clusters_by_gpu()
    table = conformance_candidates(limit=3)
    model = fake_measured_model(tmp_path, top_k=1)
    for (_, row), mfu in zip(table.iterrows(), (0.2, 0.3, 0.4), strict=True):
        recorded = {**row.to_dict(), "gpus_per_node": 8, "status": "ok", "mfu": mfu}
        model.file.append({**recorded, "step_time_s": step_time_for(recorded, mfu)})
    scored = model.score(table, clusters)
    assert sorted(scored["mfu"].round(3)) == [0.2, 0.3, 0.4]
    assert scored["cost_reason"].eq("").all() and model.launched == 0


def test_a_run_recorded_with_a_knob_that_changed_nothing_is_not_launched_again(
        tmp_path, candidate, step_time_for):
    # Megatron-LM turns sequence parallelism off at tp = 1, and one data-parallel rank has
    # nothing to shard or overlap: a file of the user's may record either value there.
    # The replay priced such runs as the layouts searched; the measured model, finding no
    # run of exactly the candidate's values, launched them again.
    clusters = layoutsearch.catalog.clusters_by_gpu()
    job = dict(num_gpus=8, global_batch_size=64, rmsnorm_kernel=True)
    table = pd.concat([candidate("llama_7b", tp=1, pp=1, **job),
                       candidate("llama_7b", tp=4, pp=2, **job)], ignore_index=True)
    model = fake_measured_model(tmp_path, prescreen=None)
    as_run = [{"sequence_parallel": True},
              {"distributed_optimizer": False, "overlap_grad_reduce": True}]
    for (_, row), ran, mfu in zip(table.iterrows(), as_run, (0.5, 0.4), strict=True):
        recorded = {**row.to_dict(), **ran, "gpus_per_node": 8, "status": "ok", "mfu": mfu}
        model.file.append({**recorded, "step_time_s": step_time_for(recorded, mfu)})
    scored = model.score(table, clusters)
    assert model.launched == 0 and launches(tmp_path) == []
    assert list(scored["mfu"]) == [0.5, 0.4]


def test_an_attention_switch_inherited_from_the_shell_cannot_stop_the_run(
        tmp_path, monkeypatch):
    # Ranks inherit the search's environment (on Slurm, the submitting shell's): with
    # NVTE_FLASH_ATTN=0 there, Megatron-LM would refuse --attention-backend flash, so the
    # command pins its backend's switches, and the (fake) run accepts them.
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")
    model = fake_measured_model(tmp_path, prescreen=None)
    flash2 = conformance_candidates(limit=1).assign(attention="flash2")
    scored = model.score(flash2, layoutsearch.catalog.clusters_by_gpu())
    assert scored["measured_status"].iloc[0] == "ok" and model.launched == 1


def test_other_megatron_settings_beside_a_measured_model_are_refused_before_launching(
        tmp_path):
    # The megatron_args column would show --seed 3 while the runs went without it.
    model = fake_measured_model(tmp_path, top_k=1)
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=r"^megatron=\{'extra_args': \['--seed', '3'\]\}: differs from the "
                             r"Megatron-LM settings the measured cost model launches with"):
        layoutsearch.search(cost_model=model, megatron={"extra_args": ["--seed", "3"]}, **JOB)
    assert model.launched == 0
    # The same settings, named twice, are the same commands.
    same = layoutsearch.search(cost_model=model, megatron=model.settings, **JOB)
    assert same["fits"].any()


def test_config_file_builds_the_model(tmp_path):
    model = build_cost_model("measured", prescreen="analytic", top_k=8,
                             measurements=str(tmp_path / "m.csv"), launcher="dry_run")
    assert isinstance(model, MeasuredCostModel) and model.top_k == 8
    assert model.settings.launcher == "dry_run"
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=r"^measured: unknown setting\(s\) topk for the measured cost model; "
                             r"it takes .*, top_k$"):
        build_cost_model("measured", topk=3)
    # top_k means the best k: without a prescreen named, the analytic model ranks them
    # (unranked, the first k the space lists would be launched).
    best = build_cost_model("measured", top_k=3, measurements=str(tmp_path / "m.csv"))
    assert best.prescreen is not None and best.prescreen.name == "analytic"
    assert build_cost_model("measured", measurements=str(tmp_path / "m.csv")).prescreen is None
    unranked = build_cost_model("measured", top_k=3, prescreen=False,
                                measurements=str(tmp_path / "m.csv"))
    assert unranked.prescreen is None and unranked.top_k == 3
    # false retries nothing, as null and [] do.
    assert build_cost_model("measured", retry=False,
                            measurements=str(tmp_path / "m.csv")).retry == ()


def test_a_prescreen_taken_by_default_that_cannot_price_the_gpu_says_what_to_do(tmp_path):
    a100 = layoutsearch.load_cluster("a100_80gb")
    mi300x = a100.replace(name="mi300x", gpu=dataclasses.replace(a100.gpu, name="mi300x"))
    model = build_cost_model("measured", top_k=2, launcher="dry_run",
                             measurements=str(tmp_path / "m.csv"))
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=r"^measured.top_k=2 launches the best 2 layouts by a prescreen, "
                             r"the analytic model as none was named, which cannot price them: "
                             r".*mi300x.*cost_models.prescreen=false to launch the first 2 in "
                             r"the space's order; nothing was launched$"):
        layoutsearch.search(model="llama_7b", cluster=mi300x, num_gpus=8, seq_length=2048,
                            global_batch_size=128, cost_model=model)
    assert not (tmp_path / "m.csv").exists()


SMALL_JOB = dict(model="llama_7b", num_gpus=8, seq_length=2048, global_batch_size=64)


@pytest.mark.parametrize("problem, change, message", [
    ("no checkout", {"megatron_path": "no-such-checkout"},
     r"megatron_path='no-such-checkout': .*pretrain_gpt.py does not exist"),
    ("no launcher", {"torchrun": ("no-such-torchrun",)},
     r"the launcher program 'no-such-torchrun' is not found"),
])
def test_a_setup_problem_stops_the_search_and_records_nothing(tmp_path, problem, change,
                                                              message):
    settings = fake_megatron_settings(tmp_path).replace(**change)
    file = tmp_path / "measurements.csv"
    model = MeasuredCostModel(settings=settings, measurements=file,
                              prescreen=build_cost_model("analytic"), top_k=2)
    with pytest.raises(layoutsearch.LayoutSearchError, match=message):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert not file.exists() and launches(tmp_path) == []
    # Fixed, the same command measures: nothing wrong was remembered.
    fixed = fake_measured_model(tmp_path, top_k=2)
    ranked = layoutsearch.search(cost_model=fixed, **SMALL_JOB)
    assert fixed.launched == 2 and ranked["fits"].sum() == 2


def test_a_setup_problem_says_whether_the_file_holds_runs_to_resume_from(tmp_path):
    file = tmp_path / "measurements.csv"
    broken = fake_megatron_settings(tmp_path).replace(megatron_path="no-such-checkout")

    def stop_message() -> str:
        model = MeasuredCostModel(settings=broken, measurements=file,
                                  prescreen=build_cost_model("analytic"), top_k=2)
        with pytest.raises(layoutsearch.LayoutSearchError) as stop:
            layoutsearch.search(cost_model=model, **SMALL_JOB)
        return str(stop.value)

    # A first search has no runs to keep: the message does not send the user to a file that
    # does not exist.
    assert stop_message().endswith(f"; no run is recorded in {file} yet")
    layoutsearch.search(cost_model=fake_measured_model(tmp_path, top_k=1), **SMALL_JOB)
    assert stop_message().endswith(f"; the measurements already in {file} are kept, and the "
                                   "same command resumes from them")


def test_a_run_faster_than_the_jobs_gpu_can_stop_the_search_and_records_nothing(tmp_path):
    # Launched on H100s but searched as A100s, the run read MFU ~1.8 and was filed, and
    # ranked, as an A100 measurement.
    model = fake_measured_model(tmp_path, top_k=2, gpu="h100_sxm")
    with pytest.raises(LayoutSearchError) as stop:
        layoutsearch.search(cost_model=model, cluster="a100_80gb", **SMALL_JOB)
    message = str(stop.value)
    assert re.fullmatch(
        r"cost_models=measured stopped: llama_7b_\S+ cannot have run on a100_80gb GPUs, as "
        r"the job says: its [\d,]+ tokens/s on 8 GPUs execute at least \d+ TFLOP/s per GPU "
        r"\(MFU (\d\.\d\d) by the study's count\), above the a100_80gb's dense bf16 peak of "
        r"312 \(log \S+\.log\)\. Search with the cluster of the GPUs the launcher runs on "
        r"\(cluster=NAME on the command line, cluster= in Python\); nothing was recorded for "
        r"it, as it would be filed under a100_80gb; no run is recorded in "
        rf"{re.escape(str(model.file.path))} yet", message), message
    mfu = float(re.search(r"MFU (\d\.\d\d)", message)[1])
    assert 1 < mfu < 989 / 312  # an H100's MFU, read against an A100's peak
    assert model.launched == 1 and not model.file.path.exists()
    # The cluster it ran on measures the same layouts.
    ranked = layoutsearch.search(cost_model=fake_measured_model(tmp_path, top_k=2,
                                                                gpu="h100_sxm"),
                                 cluster="h100_sxm", **SMALL_JOB)
    assert ranked["fits"].sum() == 2 and (ranked["mfu"].dropna() < 1).all()


def test_a_run_on_other_gpus_names_the_runs_its_search_recorded_before_it(tmp_path):
    # Its first launch ran out of memory (no figures to judge, recorded); its second ran
    # beyond the A100's peak: the first, on the same H100s, is an A100 row in the file.
    model = fake_measured_model(tmp_path, top_k=2, gpu="h100_sxm", inject="1=oom")
    with pytest.raises(LayoutSearchError) as stop:
        layoutsearch.search(cost_model=model, cluster="a100_80gb", **SMALL_JOB)
    assert str(stop.value).endswith(
        f"nothing was recorded for it, as it would be filed under a100_80gb; the 1 run this "
        f"search recorded before it in {model.file.path} may have run on those GPUs too: "
        "check them, and remove them from the file if so")
    assert list(read_measurements(model.file.path)["status"]) == ["oom"]


def test_the_local_launcher_refuses_a_job_beyond_one_node_before_launching(tmp_path):
    model = MeasuredCostModel(settings=fake_megatron_settings(tmp_path),
                              measurements=tmp_path / "measurements.csv",
                              prescreen=build_cost_model("analytic"), top_k=2)
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=r"runs one node; this job needs 64 GPUs, 8 nodes of 8 "
                             r"\(use cost_models.launcher=slurm on the command line"):
        layoutsearch.search(cost_model=model, **JOB)
    assert launches(tmp_path) == []


def test_a_trials_time_limit_covers_its_predicted_run(tmp_path, capsys):
    # 100 iterations of a ~20 s step outlast the default 1800 s; the limit follows the
    # prescreen's prediction (the dry run writes it into the sbatch script of the trial).
    settings = fake_megatron_settings(tmp_path).replace(launcher="dry_run", timeout_s=None,
                                                        train_iters=100)
    model = MeasuredCostModel(settings=settings, measurements=tmp_path / "measurements.csv",
                              prescreen=build_cost_model("analytic"), top_k=1)
    layoutsearch.search(cost_model=model, **JOB)
    predicted = layoutsearch.search(**JOB).iloc[0]["step_time_s"]
    minutes = -(-(100 * predicted * 1.5 + 600) // 60)
    assert minutes > 30
    script, = (tmp_path / "logs").glob("*.sh")
    assert f"dry run: wrote {script}" in capsys.readouterr().err  # said, not only in reasons
    assert f"#SBATCH --time={int(minutes) // 60:02d}:{int(minutes) % 60:02d}:00" in \
        script.read_text().splitlines()


def test_a_dry_run_answers_with_its_scripts_not_with_no_fit(tmp_path):
    settings = fake_megatron_settings(tmp_path).replace(launcher="dry_run")
    model = MeasuredCostModel(settings=settings, measurements=tmp_path / "measurements.csv",
                              prescreen=build_cost_model("analytic"), top_k=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", layoutsearch.NoLayoutFitsWarning)
        ranked = layoutsearch.search(cost_model=model, **JOB)
    scripts = sorted((tmp_path / "logs").glob("*.sh"))
    assert len(scripts) == 2 and not ranked["fits"].any() and ranked.attrs["message"] == ""
    # The rows the scripts run come first, and the note names every script.
    assert set(ranked.loc[:1, "reason"]) == {f"not measured: dry run: wrote {p}" for p in scripts}
    note = ranked.attrs["dry_run_note"]
    assert note.startswith("dry run: wrote 2 launch scripts and measured nothing (rows 0-1): ")
    assert all(str(p) in note for p in scripts)
    # 64 GPUs are 8 nodes: the local launcher, which runs one, is not offered.
    assert note.endswith(". Measure them with cost_models.launcher=slurm (local runs one "
                         "node; this job needs 64 GPUs, 8 a node); the runs land in the "
                         "measurement file and a search reads them back.")
    assert not (tmp_path / "measurements.csv").exists() or read_measurements(
        tmp_path / "measurements.csv").empty


def test_a_dry_run_of_many_scripts_names_a_few_and_their_folder(tmp_path):
    settings = fake_megatron_settings(tmp_path).replace(launcher="dry_run")
    model = MeasuredCostModel(settings=settings, measurements=tmp_path / "measurements.csv",
                              prescreen=build_cost_model("analytic"), top_k=7)
    ranked = layoutsearch.search(cost_model=model, **JOB)
    scripts = [p.removeprefix("not measured: dry run: wrote ") for p in ranked.loc[:6, "reason"]]
    note = ranked.attrs["dry_run_note"]
    # Five named, in the ranking's order; the other two counted, with their folder.
    assert note.startswith("dry run: wrote 7 launch scripts and measured nothing (rows 0-6): "
                           + ", ".join(scripts[:5]) + f" and 2 more in {tmp_path / 'logs'} "
                           "(each row's reason names its own). Measure them with ")
    assert scripts[5] not in note and scripts[6] not in note


def test_a_dry_run_writing_into_the_folder_it_ran_in_names_that_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = fake_megatron_settings(tmp_path).replace(launcher="dry_run", log_dir=".")
    model = MeasuredCostModel(settings=settings, measurements=tmp_path / "measurements.csv",
                              prescreen=build_cost_model("analytic"), top_k=6)
    note = layoutsearch.search(cost_model=model, **JOB).attrs["dry_run_note"]
    assert " and 1 more in . (each row's reason names its own). " in note


def test_a_log_folder_under_home_is_written_there_not_into_a_folder_named_tilde(
        tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    settings = fake_megatron_settings(tmp_path).replace(launcher="dry_run",
                                                        log_dir="~/trial_logs")
    model = MeasuredCostModel(settings=settings, measurements=tmp_path / "measurements.csv",
                              prescreen=build_cost_model("analytic"), top_k=2)
    layoutsearch.search(cost_model=model, **JOB)
    assert len(list((tmp_path / "home" / "trial_logs").iterdir())) == 2
    assert not (tmp_path / "~").exists()


def test_a_measurement_file_under_home_is_written_there_not_into_a_folder_named_tilde(
        tmp_path, monkeypatch):
    # cost_models.measurements=~/runs/measurements.csv reaches Python as written (the shell
    # expands no ~ after "name="): the runs went to ./~/runs/, a folder of the current one,
    # and a search started elsewhere did not find them.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    model = fake_measured_model(tmp_path, top_k=1, measurements="~/runs/measurements.csv")
    layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert len(read_measurements(tmp_path / "home" / "runs" / "measurements.csv")) == 1
    assert not (tmp_path / "~").exists()
    again = fake_measured_model(tmp_path, top_k=1, measurements="~/runs/measurements.csv")
    layoutsearch.search(cost_model=again, **SMALL_JOB)
    assert again.launched == 0  # read back from the home folder's file


def test_a_one_node_dry_run_offers_the_local_launcher_too(tmp_path):
    settings = fake_megatron_settings(tmp_path).replace(launcher="dry_run")
    model = MeasuredCostModel(settings=settings, measurements=tmp_path / "measurements.csv",
                              prescreen=build_cost_model("analytic"), top_k=1)
    ranked = layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert ranked.attrs["dry_run_note"].endswith(
        ". Measure them with cost_models.launcher=local or slurm; the runs land in the "
        "measurement file and a search reads them back.")


@pytest.mark.parametrize(("model", "flags"), [
    ("llama3_8b", ["--rotary-base", "500000"]),
    ("llama3_405b", ["--use-rope-scaling", "--rope-scaling-factor", "8.0"]),
    ("gpt3_175b", ["--position-embedding-type", "learned_absolute"]),
])
def test_a_measured_trial_trains_the_searched_model(tmp_path, model, flags):
    # Fields outside the measurement schema (RoPE base, position embedding, biases) reach
    # the trial's command through the candidate rows.
    settings = fake_megatron_settings(tmp_path).replace(launcher="dry_run")
    measured = MeasuredCostModel(settings=settings, measurements=tmp_path / "m.csv",
                                 prescreen=build_cost_model("analytic"), top_k=1)
    layoutsearch.search(cost_model=measured, model=model, cluster="h100_sxm",
                        num_gpus=1024, seq_length=2048, global_batch_size=2048)
    script, = (tmp_path / "logs").glob("*.sh")
    text = script.read_text()
    assert " ".join(flags) in text
    assert ("--disable-bias-linear" in text) == (model != "gpt3_175b")


def test_every_key_column_is_recorded_so_a_rerun_finds_the_measurement(tmp_path):
    # normalization (a job column) and overlap_grad_reduce (a knob) are optional columns of
    # the schema whose defaults differ from this job's: unrecorded, the rerun would measure
    # the layout again.
    job = {**JOB, "normalization": "LayerNorm"}
    first = fake_measured_model(tmp_path, top_k=1)
    layoutsearch.search(cost_model=first, search_space="default", tp=1, pp=1, cp=1, vp=1,
                        **job)
    rows = read_measurements(tmp_path / "measurements.csv")
    assert first.launched == 1
    assert list(rows["normalization"]) == ["LayerNorm"] and rows["overlap_grad_reduce"].all()
    again = fake_measured_model(tmp_path, top_k=1)
    layoutsearch.search(cost_model=again, search_space="default", tp=1, pp=1, cp=1, vp=1,
                        **job)
    assert again.launched == 0


def test_appending_to_a_users_csv_keeps_its_rows_and_every_figure_of_the_new_one(
        tmp_path, measurement_row, capsys):
    # A file in the study's columns (no cp, vp, overlap_grad_reduce, normalization), its
    # last line without a newline, as a spreadsheet or a hand edit leaves it.
    path = tmp_path / "runs.csv"
    pd.DataFrame([measurement_row]).to_csv(path, index=False)
    path.write_text(path.read_text().rstrip("\n"))
    first = fake_measured_model(tmp_path, top_k=1, measurements=path)
    layoutsearch.search(cost_model=first, search_space="default", tp=1, pp=1, cp=1, vp=1,
                        **JOB)
    rows = read_measurements(path)
    assert first.launched == 1 and len(rows) == 2
    user, new = rows.iloc[0], rows.iloc[1]
    assert user["mfu"] == 0.6 and not user["overlap_grad_reduce"] and user["cp"] == 1
    # The new row keeps the knob the old header lacked, and what only this model records.
    assert new["overlap_grad_reduce"] and new["status"] == "ok"
    assert new["peak_memory_gib"] > 0 and new["log_path"].endswith(".log")
    assert "\r" not in path.read_text()
    # The file changed shape, and the user is told.
    told = capsys.readouterr().err
    assert "measurements: added column(s) cp, vp, " in told
    assert f"to {path} for the runs measured now; its 1 earlier rows are kept as written" in told
    again = fake_measured_model(tmp_path, top_k=1, measurements=path)
    layoutsearch.search(cost_model=again, search_space="default", tp=1, pp=1, cp=1, vp=1,
                        **JOB)
    assert again.launched == 0 and len(read_measurements(path)) == 2


def test_a_full_recompute_measured_into_a_file_that_records_its_method_reads_back_as_run(
        tmp_path, measurement_row):
    # The file's own runs say --recompute-method uniform; the model's rows leave the cell
    # empty, which reads as the uniform method with one layer a checkpoint that it ran.
    path = tmp_path / "runs.csv"
    pd.DataFrame([{**measurement_row, "recompute": "full", "recompute_method": "uniform",
                   "step_time_s": 40.0, "mfu": 0.45}]).to_csv(path, index=False)
    first = fake_measured_model(tmp_path, top_k=1, measurements=path)
    layoutsearch.search(cost_model=first, search_space="default", tp=1, pp=1, cp=1, vp=1,
                        recompute="full", **JOB)
    rows = read_measurements(path)
    assert first.launched == 1 and rows["recompute"].tolist() == ["full", "full"]
    assert rows["recompute_method"].iloc[0] == "uniform"
    assert pd.isna(rows["recompute_method"].iloc[1])
    again = fake_measured_model(tmp_path, top_k=1, measurements=path)
    layoutsearch.search(cost_model=again, search_space="default", tp=1, pp=1, cp=1, vp=1,
                        recompute="full", **JOB)
    assert again.launched == 0


def _spaced(header: str, row: str) -> tuple[str, str]:
    return header.replace(",", ", "), row.replace(",", ", ")


def _ragged(header: str, row: str) -> tuple[str, str]:
    # An extra column whose empty cell the row leaves out, which pandas reads as empty.
    return header + ",note", row


@pytest.mark.parametrize(("shape", "encoding"), [
    (_spaced, "utf-8"), (lambda header, row: (header, row), "utf-8-sig"), (_ragged, "utf-8")],
    ids=["a space after each comma", "a byte-order mark", "a short row"])
def test_a_users_csv_in_any_shape_the_readers_accept_stays_readable(
        tmp_path, measurement_row, shape, encoding):
    path = tmp_path / "runs.csv"
    header, row = pd.DataFrame([measurement_row]).to_csv(index=False).splitlines()
    header, row = shape(header, row)
    path.write_text(f"{header}\n{row}\n", encoding=encoding)
    assert read_measurements(path)["mfu"].tolist() == [0.6]
    first = fake_measured_model(tmp_path, top_k=1, measurements=path)
    layoutsearch.search(cost_model=first, search_space="default", tp=1, pp=1, cp=1, vp=1,
                        **JOB)
    rows = read_measurements(path)  # each value under the column it is read back from
    assert first.launched == 1 and rows["mfu"].iloc[0] == 0.6 and rows["cp"].tolist() == [1, 1]
    assert rows["overlap_grad_reduce"].iloc[1] and rows["status"].iloc[1] == "ok"
    again = fake_measured_model(tmp_path, top_k=1, measurements=path)
    layoutsearch.search(cost_model=again, search_space="default", tp=1, pp=1, cp=1, vp=1,
                        **JOB)
    assert again.launched == 0 and len(read_measurements(path)) == 2


def test_a_parquet_measurement_file_is_appended_to_as_parquet(tmp_path, measurement_row):
    path = tmp_path / "runs.parquet"
    pd.DataFrame([measurement_row]).to_parquet(path, index=False)
    first = fake_measured_model(tmp_path, top_k=2, measurements=path)
    layoutsearch.search(cost_model=first, **SMALL_JOB)
    rows = read_measurements(path)
    assert first.launched == 2 and len(rows) == 3 and rows["mfu"].iloc[0] == 0.6
    again = fake_measured_model(tmp_path, top_k=2, measurements=path)
    layoutsearch.search(cost_model=again, **SMALL_JOB)
    assert again.launched == 0
    # A new Parquet path starts a Parquet file, not CSV text under a Parquet name.
    fresh = tmp_path / "new.parquet"
    layoutsearch.search(cost_model=fake_measured_model(tmp_path, top_k=1, measurements=fresh),
                        **SMALL_JOB)
    assert len(pd.read_parquet(fresh)) == 1


@pytest.mark.parametrize("name", ["runs.csv", "runs.parquet"])
def test_a_measurement_file_named_by_a_link_is_written_and_locked_as_the_file_itself(
        tmp_path, measurement_row, name):
    # A Parquet append (a rewrite) replaced the link with a file of its own, so the shared
    # file it named stopped getting rows; and searches naming the file by two links locked
    # and claimed beside each link, apart.
    team = tmp_path / "team"
    team.mkdir()
    shared = team / name
    MeasurementFile(shared).append(measurement_row)
    mine = tmp_path / "mine"
    mine.mkdir()
    link = mine / name
    link.symlink_to(shared)
    model = fake_measured_model(mine, top_k=1, measurements=link)
    layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert model.launched == 1 and link.is_symlink()
    assert len(read_measurements(shared)) == 2
    assert sorted(p.name for p in team.iterdir()) == sorted(
        [name, f".{name}.lock", f".{name}.claims"])
    assert sorted(p.name for p in mine.iterdir()) == ["launches.txt", "logs", name]
    # The same layout, asked through the file's own name, is read from the row written
    # through the link: nothing is launched again.
    again = fake_measured_model(mine, top_k=1, measurements=shared)
    layoutsearch.search(cost_model=again, **SMALL_JOB)
    assert again.launched == 0


@pytest.mark.parametrize("name", ["runs.csv", "runs.parquet"])
def test_each_recorded_row_is_forced_to_the_disk(tmp_path, monkeypatch, measurement_row, name):
    # The test process skips fsync (conftest: a killed process loses nothing the kernel
    # holds), so this checks the sync itself: a machine that loses power mid-search must
    # not lose the runs it recorded. The row is written before the sync, not after it.
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.fstat(fd).st_size))
    path = tmp_path / name
    MeasurementFile(path).append({**OPTIONAL_DEFAULTS, **measurement_row})
    assert synced == [path.stat().st_size]
    MeasurementFile(path).append({**OPTIONAL_DEFAULTS, **measurement_row, "message": "again"})
    assert synced[1:] == [path.stat().st_size] and synced[1] > synced[0]


WRITERS, ROWS_EACH = 4, 10


def _append_rows(path: Path, writer: int, row: dict, start) -> None:
    start.wait()  # every writer at once, so that their appends overlap
    file = MeasurementFile(path)
    for i in range(ROWS_EACH):
        file.append({**row, "message": f"writer {writer} row {i}"})


@pytest.mark.skipif(sys.platform == "win32", reason="flock and fork are Unix's")
@pytest.mark.parametrize("name", ["runs.parquet", "runs.csv"])
def test_processes_appending_to_one_file_at_once_lose_no_row(tmp_path, measurement_row, name):
    # Local optuna workers and concurrent sweeps append to one file: a Parquet append
    # rewrites the file, and a new CSV is given its header by whichever append is first.
    _append_at_once(tmp_path / name, {**OPTIONAL_DEFAULTS, **measurement_row})


@pytest.mark.skipif(sys.platform == "win32", reason="flock and fork are Unix's")
def test_a_folder_that_takes_no_lock_file_is_locked_itself(tmp_path, measurement_row):
    # A writable measurement file in a read-only folder takes appends, but no lock file
    # beside it; a directory in the lock file's place stands in for that folder (root, who
    # runs some test machines, writes into a read-only folder anyway).
    (tmp_path / ".runs.csv.lock").mkdir()
    _append_at_once(tmp_path / "runs.csv", {**OPTIONAL_DEFAULTS, **measurement_row})


def _append_at_once(path: Path, row: dict) -> None:
    """WRITERS processes append ROWS_EACH rows each at once; every row must be read back."""
    context = multiprocessing.get_context("fork")
    start = context.Barrier(WRITERS)
    writers = [context.Process(target=_append_rows, args=(path, w, row, start))
               for w in range(WRITERS)]
    for process in writers:
        process.start()
    for process in writers:
        process.join()
    assert [p.exitcode for p in writers] == [0] * WRITERS
    rows = read_measurements(path)
    assert sorted(rows["message"]) == sorted(
        f"writer {w} row {i}" for w in range(WRITERS) for i in range(ROWS_EACH))


def test_the_fingerprint_is_the_same_for_the_same_settings_so_a_study_resumes(tmp_path):
    # An optuna study keys its resume on it: an object's address in it made every rerun
    # of the same command a new study.
    first, again = (fake_measured_model(tmp_path, top_k=3) for _ in range(2))
    assert first.fingerprint() == again.fingerprint()
    assert "prescreen=analytic:" in first.fingerprint()
    assert fake_measured_model(tmp_path, top_k=4).fingerprint() != first.fingerprint()


def test_a_launch_that_fails_for_every_layout_stops_the_search_and_records_nothing(tmp_path):
    # A torchrun whose Python has no torch: the failure is the setup's, not the layout's.
    torchrun = tmp_path / "torchrun"
    torchrun.write_text("#!/bin/sh\necho \"/usr/bin/python3: Error while finding module "
                        "specification for 'torch.distributed.run' (ModuleNotFoundError: No "
                        "module named 'torch')\" >&2\nexit 1\n")
    torchrun.chmod(0o755)
    settings = fake_megatron_settings(tmp_path).replace(torchrun=(str(torchrun),))
    file = tmp_path / "measurements.csv"
    model = MeasuredCostModel(settings=settings, measurements=file,
                              prescreen=build_cost_model("analytic"), top_k=2)
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=r"failed before training, as every layout would: .*No module "
                             r"named 'torch'"):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert not file.exists()
    fixed = fake_measured_model(tmp_path, top_k=2)
    assert layoutsearch.search(cost_model=fixed, **SMALL_JOB)["fits"].sum() == 2


def test_retry_launches_the_recorded_failures_again(tmp_path):
    crashed = fake_measured_model(tmp_path, top_k=1, inject="1=crash")
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        ranked = layoutsearch.search(cost_model=crashed, **SMALL_JOB)
    assert crashed.launched == 1 and not ranked["fits"].any()
    failed = ranked[ranked["reason"].str.startswith("measured error")]["reason"].iloc[0]
    assert failed.endswith("(cost_models.retry=[error] launches it again)")
    # The message leads with what the launches said, however many layouts were not tried.
    assert ranked.attrs["message"].startswith(
        "no layout fits: the 1 layout launched failed: measured error: ")
    # By default a recorded layout is never launched again, failures included ...
    again = fake_measured_model(tmp_path, top_k=1, inject="1=crash")
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        layoutsearch.search(cost_model=again, **SMALL_JOB)
    assert again.launched == 0
    # ... unless its status is to be retried: the new row is appended and is the one read.
    retried = fake_measured_model(tmp_path, top_k=1)
    retried.retry = ("error",)
    ranked = layoutsearch.search(cost_model=retried, **SMALL_JOB)
    assert retried.launched == 1 and ranked["fits"].sum() == 1
    assert list(read_measurements(tmp_path / "measurements.csv")["status"]) == ["error", "ok"]


@pytest.mark.parametrize("setting, value, rule", [
    ("retry", ["eror"], r"measured.retry=\['eror'\]: must be a list of the statuses"),
    ("prescreen", 5, r"measured.prescreen=5: must be a name \(e.g. 'analytic'\)"),
    ("top_k", 2.5, r"measured.top_k=2.5: must be a positive integer"),
    # null fell back to measurements.csv in the working folder, unsaid.
    ("measurements", None, r"measured.measurements=None: must be the path of the "
                           r"measurement file"),
    ("measurements", "", r"measured.measurements='': must be the path"),
    # A settings file named by mistake: the first layout was launched, its run written as
    # CSV into the YAML file, and the file refused only when read back.
    ("measurements", "cost_models/mine.yaml",
     r"^measured.measurements='cost_models/mine.yaml': is a YAML file, not a measurement "
     r"table: name a CSV or Parquet file of runs \(docs/measurements.md\); cost-model "
     r"constants go to cost_model=, Megatron-LM settings to megatron=$"),
    # A scalar failed inside the check with "'bool' object is not iterable"; a mapping
    # passed as its keys.
    ("retry", True, r"^measured.retry=True: must be a list of the statuses to launch again"),
    ("retry", 3, r"^measured.retry=3: must be a list of the statuses"),
    ("retry", {"error": 1}, r"^measured.retry=\{'error': 1\}: must be a list of the statuses"),
    ("retry", [["error"]], r"^measured.retry=\[\['error'\]\]: must be a list of the statuses"),
    # 0, [] and {} were taken for no prescreen, as false is.
    ("prescreen", 0, r"^measured.prescreen=0: must be a name \(e.g. 'analytic'\)"),
    ("prescreen", [], r"^measured.prescreen=\[\]: must be a name \(e.g. 'analytic'\)"),
    ("prescreen", {}, r"^measured.prescreen: a cost-model mapping names its class with _target_"),
])
def test_measured_settings_name_their_rule(tmp_path, setting, value, rule):
    settings = {"measurements": str(tmp_path / "m.csv"), setting: value}
    with pytest.raises(layoutsearch.LayoutSearchError, match=rule):
        build_cost_model("measured", **settings)


def test_a_parquet_file_in_a_folder_that_cannot_be_written_in_stops_before_any_launch(
        tmp_path, monkeypatch, measurement_row):
    # The file could be written, so the check passed, but each row rewrites a Parquet file
    # through a temporary file beside it: the run trained, then its row failed to go in.
    # The tests run as root, to whom every folder is writable: os.access says otherwise here.
    shared = tmp_path / "shared"
    shared.mkdir()
    path = shared / "runs.parquet"
    pd.DataFrame([measurement_row]).to_parquet(path, index=False)
    access = os.access
    monkeypatch.setattr(os, "access", lambda where, mode: access(where, mode) and Path(
        where) != shared)
    model = fake_measured_model(tmp_path, top_k=1, measurements=path)
    with pytest.raises(LayoutSearchError, match=(
            rf"the measurement file '{re.escape(str(path))}' is Parquet, which each row "
            rf"rewrites through a file beside it, and its folder {re.escape(str(shared))} is "
            r"not writable \(a CSV file there could be appended to\)\. Nothing was launched")):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert model.launched == 0 and launches(tmp_path) == []


def test_a_measured_prescreen_is_refused_it_would_launch_every_candidate(tmp_path):
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=r"prescreen='measured' is a measured cost model, which would "
                             r"launch every candidate"):
        build_cost_model("measured", measurements=str(tmp_path / "m.csv"),
                         prescreen="measured", top_k=2)
    assert launches(tmp_path) == []


@pytest.mark.parametrize("where", ["folder", "under_a_file", "link_under_a_file", "pipe"])
def test_a_measurement_file_that_cannot_be_written_stops_before_any_launch(tmp_path, where):
    # A folder given as the file: each run finished, then its row failed to append
    # (IsADirectoryError), so the training run was lost. A pipe blocked the search forever.
    # A link to a file not made yet was checked beside the link: the search ended in
    # FileExistsError, making the folder of the file it links to.
    (tmp_path / "folder").mkdir()
    (tmp_path / "afile").write_text("kept\n")
    os.mkfifo(tmp_path / "pipe.csv")
    (tmp_path / "link.csv").symlink_to(tmp_path / "afile" / "m.csv")
    path = {"folder": tmp_path / "folder", "under_a_file": tmp_path / "afile" / "m.csv",
            "link_under_a_file": tmp_path / "link.csv", "pipe": tmp_path / "pipe.csv"}[where]
    message = {"folder": "is a folder, not a file",
               "under_a_file": "lies under .*afile, which is a file, not a folder",
               "link_under_a_file": "lies under .*afile, which is a file, not a folder",
               "pipe": r"is not a regular file \(a pipe or a device: writing to it would "
                       r"block or be lost\)"}[where]
    model = MeasuredCostModel(settings=fake_megatron_settings(tmp_path), measurements=path,
                              prescreen=build_cost_model("analytic"), top_k=2)
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=rf"cannot record a run: the measurement file .* {message}\. "
                             r"Nothing was launched"):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert model.launched == 0 and launches(tmp_path) == []


@pytest.mark.parametrize("launcher", ["local", "dry_run"])
def test_a_log_folder_under_a_file_stops_before_any_launch(tmp_path, launcher):
    # Every launcher writes the trial's log or script into megatron.log_dir: under a file,
    # the search ended in NotADirectoryError at its first launch.
    (tmp_path / "afile").write_text("kept\n")
    settings = fake_megatron_settings(tmp_path).replace(
        log_dir=str(tmp_path / "afile" / "logs"), launcher=launcher)
    model = MeasuredCostModel(settings=settings, measurements=tmp_path / "m.csv",
                              prescreen=build_cost_model("analytic"), top_k=2)
    with pytest.raises(layoutsearch.LayoutSearchError, match=re.escape(
            f"cost_models=measured cannot keep a trial's log: megatron.log_dir="
            f"{tmp_path}/afile/logs: lies under {tmp_path}/afile, a file; the outputs go "
            "into a folder (name a new or existing folder). Nothing was launched for ")):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert model.launched == 0 and launches(tmp_path) == []
    assert (tmp_path / "afile").read_text() == "kept\n"


def test_extra_args_layoutsearch_does_not_define_are_passed_on_and_measured(tmp_path):
    # cost_models/megatron.yaml itself recommends --no-gradient-accumulation-fusion without
    # Apex: reading a command back, the unknown flag failed the search with a traceback.
    extra = ("--no-gradient-accumulation-fusion", "--seed", "7")
    settings = fake_megatron_settings(tmp_path).replace(extra_args=extra)
    model = MeasuredCostModel(settings=settings, measurements=tmp_path / "m.csv",
                              prescreen=build_cost_model("analytic"), top_k=1)
    ranked = layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert model.launched == 1 and ranked["fits"].sum() == 1
    assert read_measurements(tmp_path / "m.csv")["status"].tolist() == ["ok"]
    assert "--no-gradient-accumulation-fusion --seed 7" in ranked.loc[0, "megatron_args"]


@pytest.mark.parametrize("driver", ["grid", {"name": "optuna", "n_trials": 2,
                                               "progress": False}])
def test_extra_args_that_break_every_command_stop_the_search(tmp_path, driver):
    # --data-path with the --mock-data every command carries: Megatron-LM refuses both.
    settings = fake_megatron_settings(tmp_path)
    settings = settings.replace(extra_args=("--data-path", "/data/corpus_text_document"))
    model = MeasuredCostModel(settings=settings, measurements=tmp_path / "m.csv",
                              prescreen=build_cost_model("analytic"), top_k=2)
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=r"extra_args \['--data-path', '/data/corpus_text_document'\], "
                             r"Megatron-LM would reject every command \(error: .*mock"):
        layoutsearch.search(cost_model=model, driver=driver, **SMALL_JOB)
    assert launches(tmp_path) == [] and not (tmp_path / "m.csv").exists()


def test_a_flag_megatron_does_not_know_stops_the_search_after_one_launch(tmp_path):
    # Passed on unchecked, a misspelt flag is refused by Megatron-LM's argparse for every
    # layout: one launch says so, and no layout is recorded as an error.
    settings = fake_megatron_settings(tmp_path).replace(
        extra_args=("--no-gradient-acumulation-fusion",))
    model = MeasuredCostModel(settings=settings, measurements=tmp_path / "m.csv",
                              prescreen=build_cost_model("analytic"), top_k=2)
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=r"failed before training, as every layout would: pretrain_gpt.py: "
                             r"error: unrecognized arguments: --no-gradient-acumulation-fusion "
                             r"\(log .*\)\. Check python, torchrun, megatron_path and "
                             r"extra_args"):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert len(launches(tmp_path)) == 1 and not (tmp_path / "m.csv").exists()


def test_two_jobs_sharing_a_layout_keep_a_log_each(tmp_path):
    layout = dict(tp=1, pp=1, micro_batch_size=1, attention="flash2", recompute="none")
    for vocab_size in (32000, 128000):  # the same name, sizes and layout; another model
        model = fake_measured_model(tmp_path, top_k=1)
        layoutsearch.search(cost_model=model, vocab_size=vocab_size, **layout, **SMALL_JOB)
    rows = read_measurements(tmp_path / "measurements.csv")
    assert len(rows) == 2 and rows["log_path"].nunique() == 2
    assert rows["step_time_s"].nunique() == 2  # the larger vocabulary is slower
    for step_time_s, log in zip(rows["step_time_s"], rows["log_path"], strict=True):
        assert parse_log(Path(log).read_text()).step_time_s == pytest.approx(step_time_s)


def test_failed_launches_are_named_in_a_note_when_others_ran(tmp_path):
    model = fake_measured_model(tmp_path, top_k=3, inject="1=crash,2=oom")
    ranked = layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert model.launched == 3 and ranked["fits"].sum() == 1
    note = ranked.attrs["failed_launches_note"]
    failed = ranked[ranked["reason"].str.startswith("measured ")]
    assert len(failed) == 2 and failed.index.min() > 0  # after the layout that ran
    first, second = (f"row {i} {Layout.from_row(dict(row)).describe()}"
                     for i, row in failed.iterrows())
    assert note.startswith(f"2 launched layouts failed and rank after every layout that "
                           f"ran: {first} (")
    assert f"{second} (" in note and "(error)" in note and "(oom)" in note
    # Nothing failed: no note.
    clean = fake_measured_model(tmp_path / "clean", top_k=1)
    assert layoutsearch.search(cost_model=clean, **SMALL_JOB).attrs["failed_launches_note"] == ""


def test_an_optuna_search_spends_its_trials_on_launches_only(tmp_path):
    # Half the space is flash1, which no current Megatron-LM command runs: every evaluation
    # of the study must still be a launch.
    model = fake_measured_model(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ranked = layoutsearch.search(
            cost_model=model, attention=["flash1", "flash2"], **SMALL_JOB,
            driver={"name": "optuna", "n_trials": 3, "seed": 0, "progress": False})
    assert model.launched == len(ranked) == len(launches(tmp_path)) == 3
    assert (ranked["attention"] == "flash2").all()


def test_an_optuna_search_answers_with_every_run_the_file_holds_of_its_job(tmp_path):
    # The file's runs of the job that the study did not sample were left out: after a grid
    # search measured the best layouts, an optuna search of 2 trials recommended tp4 pp2 at
    # 0.26 MFU over the recorded tp1 pp1 at 0.67.
    grid = layoutsearch.search(cost_model=fake_measured_model(tmp_path, top_k=2), **SMALL_JOB)
    recorded = grid[grid["mfu"].notna()]
    optuna = {"name": "optuna", "n_trials": 2, "seed": 0, "progress": False}
    model = fake_measured_model(tmp_path)
    ranked = layoutsearch.search(cost_model=model, driver=optuna, **SMALL_JOB)
    assert model.launched == 2  # the file's runs are read, not launched again
    assert len(ranked) == 4 == len(read_measurements(tmp_path / "measurements.csv"))
    from_file = ranked[ranked["trial"].isna()]
    assert sorted(from_file["mfu"]) == sorted(recorded["mfu"])
    assert ranked.iloc[0]["mfu"] == recorded.iloc[0]["mfu"] > 0.6
    assert from_file["reason"].eq("").all()
    # With two objectives the front is of the whole answer, the file's runs included.
    front = layoutsearch.search(cost_model=fake_measured_model(tmp_path), **SMALL_JOB,
                                driver={**optuna, "objectives": ["mfu", "peak_memory_gib"]})
    assert_pareto_marks(front)
    assert front.loc[front["trial"].isna(), "pareto"].any()


def test_local_optuna_workers_are_refused_a_measured_search_on_one_nodes_gpus(tmp_path):
    # Each would launch a trial at once on the node's GPUs, which one trial holds at a time.
    driver = {"name": "optuna", "n_trials": 2, "n_workers": 2, "seed": 0, "progress": False,
              "storage": f"sqlite:///{tmp_path / 'study.db'}"}
    model = fake_measured_model(tmp_path, top_k=1)
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=r"^driver.n_workers=2: with cost_models=measured and the local "
                             r"launcher, the workers would train 2 layouts at once .* use "
                             r"driver.n_workers=1, or cost_models.launcher=slurm"):
        layoutsearch.search(cost_model=model, driver=driver, **SMALL_JOB)
    assert launches(tmp_path) == []
    layoutsearch.search(cost_model=model, driver={**driver, "n_workers": 1}, **SMALL_JOB)
    assert model.launched == 2
    # Workers that launch nothing here (a dry run writes scripts) share no GPU.
    dry = fake_measured_model(tmp_path / "dry", top_k=1)
    dry.launcher = build_launcher(dry.settings.replace(launcher="dry_run"))
    ranked = layoutsearch.search(cost_model=dry, **SMALL_JOB, driver={
        **driver, "storage": f"sqlite:///{tmp_path / 'dry.db'}"})
    assert len(ranked) == 2 and ranked["reason"].str.contains("dry run: wrote").all()


def test_retry_relaunches_a_stored_optuna_studys_failures(tmp_path):
    # The study stores each trial's price; with retry the recorded failure must be launched
    # again, not reused from the study, and a retry that fails again is not looped on.
    driver = {"name": "optuna", "n_trials": 1, "seed": 0, "progress": False,
              "storage": f"sqlite:///{tmp_path / 'study.db'}", "study_name": "retry"}
    crashed = fake_measured_model(tmp_path, top_k=1, inject="1=crash")
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        layoutsearch.search(cost_model=crashed, driver=driver, **SMALL_JOB)
    assert crashed.launched == 1
    again = fake_measured_model(tmp_path, top_k=1, inject="1=crash")
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        layoutsearch.search(cost_model=again, driver=driver, **SMALL_JOB)
    assert again.launched == 0  # without retry the study's stored failure stands
    still = fake_measured_model(tmp_path, top_k=1, inject="2=crash")  # launch 2 fails
    still.retry = ("error",)
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        ranked = layoutsearch.search(cost_model=still, driver=driver, **SMALL_JOB)
    assert still.launched == 1 and len(ranked) == 1
    retried = fake_measured_model(tmp_path, top_k=1)
    retried.retry = ("error",)
    ranked = layoutsearch.search(cost_model=retried, driver=driver, **SMALL_JOB)
    assert retried.launched == 1
    assert len(ranked) == 1 and ranked["fits"].all()  # the new price replaces the failure
    assert list(read_measurements(tmp_path / "measurements.csv")["status"]) == [
        "error", "error", "ok"]


def test_a_dry_run_studys_trials_are_launched_by_a_later_local_search(tmp_path):
    # A dry run writes scripts and records nothing: its trials are no price to reuse.
    driver = {"name": "optuna", "n_trials": 1, "seed": 0, "progress": False,
              "storage": f"sqlite:///{tmp_path / 'study.db'}", "study_name": "dry"}
    dry = fake_measured_model(tmp_path, top_k=1)
    dry.launcher = build_launcher(dry.settings.replace(launcher="dry_run"))
    ranked = layoutsearch.search(cost_model=dry, driver=driver, **SMALL_JOB)
    assert dry.launched == 0 and ranked["reason"].str.contains("dry run: wrote").all()
    real = fake_measured_model(tmp_path, top_k=1)
    ranked = layoutsearch.search(cost_model=real, driver=driver, **SMALL_JOB)
    assert real.launched == 1 and ranked["fits"].all()


def test_an_optuna_search_whose_launches_all_failed_counts_what_it_evaluated(tmp_path):
    # Not the space's 1024 layouts that pass the rules, and no empty "not launched" list.
    model = fake_measured_model(tmp_path, inject="*=crash")
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        ranked = layoutsearch.search(
            cost_model=model, **SMALL_JOB,
            driver={"name": "optuna", "n_trials": 2, "seed": 0, "progress": False})
    message = ranked.attrs["message"]
    assert model.launched == len(ranked) == 2
    assert "Among those evaluated: no layout fits: the 2 layouts launched failed: " in message
    assert message.endswith("(rejects 2 of 2 layouts)")
    assert "pass the rules" not in message


def test_the_fake_runs_flash3_where_the_flash_backend_would_on_hopper(tmp_path):
    # --attention-backend flash is one command for flash2 and flash3: on Hopper the fake,
    # as Transformer Engine with flash_attn_interface installed, runs FlashAttention 3.
    model = fake_measured_model(tmp_path, top_k=1, gpu="h100_sxm")
    long_job = {**SMALL_JOB, "seq_length": 16384, "global_batch_size": 8}  # attention-bound
    layout = dict(tp=1, pp=1, micro_batch_size=1, recompute="full", attention="flash3")
    ranked = layoutsearch.search(cost_model=model, cluster="h100_sxm", **layout, **long_job)
    measured = read_measurements(tmp_path / "measurements.csv")
    assert model.launched == 1 and list(measured["attention"]) == ["flash3"]
    step = float(measured["step_time_s"].iloc[0])
    flash3, flash2 = (float(layoutsearch.search(cluster="h100_sxm", **{**layout, **kernel},
                                                **long_job)["step_time_s"].iloc[0])
                      for kernel in ({"attention": "flash3"}, {"attention": "flash2"}))
    assert step == pytest.approx(flash3, rel=0.02) and float(ranked["step_time_s"][0]) == step
    assert abs(step - flash2) > 0.1 * step


def test_the_paper_drivers_answer_holds_every_layout_it_launched(tmp_path, capsys):
    # The rules measure micro-batch 1, then raise it to 2 (faster, it fits): both runs are
    # in the ranking, the pick first; before, the slower run was launched but left out.
    model = fake_measured_model(tmp_path)
    ranked = layoutsearch.search(cost_model=model, driver="paper", model="llama_7b",
                                 num_gpus=8, seq_length=2048, global_batch_size=256)
    measured = ranked[ranked["mfu"].notna()]
    assert model.launched == len(launches(tmp_path)) == len(measured) == 2
    assert list(measured["micro_batch_size"]) == [2, 1]
    assert "micro-batch is raised" in ranked.iloc[0]["paper_rule"]
    assert ranked.iloc[1]["paper_rule"] == "passed over by the rules: fits, no faster than the pick"
    # Priced a layout a call, each launch is no "launch 1 of 1": the rules' progress line
    # counts them.
    told = result_lines(capsys.readouterr().err)
    assert len(told) == 2 and all(line.startswith("local: llama_7b_") for line in told)


def test_a_launchs_line_is_a_line_of_its_own_beside_a_progress_line(tmp_path, capsys):
    # Printed after the progress line, which ends in no newline, it ran on from it
    # ('... best MFU 22.2 % (tp4 pp8 ...)local: llama_13b_...: ok'), and the next repaint's
    # carriage return overwrote its start, in a terminal as in a notebook's output.
    model = fake_measured_model(tmp_path)
    layoutsearch.search(cost_model=model, driver={"name": "optuna", "n_trials": 2,
                                                  "progress": True}, **JOB)
    # What a terminal or a notebook shows: each line as its last carriage return left it.
    shown = [line.rsplit("\r", 1)[-1].rstrip() for line in capsys.readouterr().err.split("\n")]
    told = [line for line in without_starts(shown) if "(log " in line]
    # A trial launches one layout: its line says no "launch 1 of 1", the progress line counts.
    assert len(told) == 2 and all(line.startswith("local: llama_13b_") for line in told)
    assert shown[-2].startswith("optuna: 2/2 layouts priced · best MFU ")


def test_each_launchs_line_says_which_launch_of_how_many_the_search_makes(tmp_path, capsys):
    # A grid search's launches, one line each as it finished, never said how far along a
    # search of hours was.
    def lines_begin(top_k: int) -> list[str]:
        layoutsearch.search(cost_model=fake_measured_model(tmp_path, top_k=top_k), **SMALL_JOB)
        told = result_lines(capsys.readouterr().err)
        return [line.split(": llama_7b_")[0] for line in told]

    assert lines_begin(top_k=3) == [
        "local: launch 1 of 3", "local: launch 2 of 3", "local: launch 3 of 3"]
    # Resumed with a larger top_k: the count is of the layouts the file does not hold.
    assert lines_begin(top_k=5) == ["local: launch 1 of 2", "local: launch 2 of 2"]
    assert lines_begin(top_k=6) == ["local"]  # one launch: nothing to count
    assert len(launches(tmp_path)) == 6


def test_a_launch_says_it_started_before_it_trains(tmp_path, capsys):
    # A trial trains for up to its time limit before its result line; nothing said that
    # one was running, or for how long it may.
    layoutsearch.search(cost_model=fake_measured_model(tmp_path, top_k=2, timeout_s=150),
                        **SMALL_JOB)
    told = [line.split(": llama_7b_")[0] + " ..." + line.rpartition(": ")[2].split(" (log")[0]
            if ": started, " in line else line.split(": llama_7b_")[0] + " ...result"
            for line in capsys.readouterr().err.splitlines() if "(log " in line]
    assert told == ["local: launch 1 of 2 ...started, time limit 150 s",
                    "local: launch 1 of 2 ...result",
                    "local: launch 2 of 2 ...started, time limit 150 s",
                    "local: launch 2 of 2 ...result"]


def test_a_hopper_search_without_flash3_says_its_flashattention_layouts_are_not_measured(
        tmp_path):
    # On Hopper a flash2 layout's command runs FlashAttention 3, so it is passed over for
    # its flash3 twin; in a space without flash3 (the paper space) the measured search then
    # launched only fused and torch layouts and named none of the analytic best ones.
    model = fake_measured_model(tmp_path, top_k=1, gpu="h100_sxm")
    pins = dict(tp=[1], pp=[1], micro_batch_size=[1], recompute=["none"],
                rmsnorm_kernel=[True], sequence_parallel=[False])
    ranked = layoutsearch.search(cost_model=model, cluster="h100_sxm", **SMALL_JOB, **pins,
                                 attention=["fused", "flash2"])
    assert model.launched == 1 and list(ranked["attention"]) == ["fused", "flash2"]
    note = ranked.attrs["coverage_note"]
    assert note.startswith("the analytic model's 1 best layout is not measured, as no "
                           "command runs it as asked: the best, tp1 pp1 dp8 mb1 "
                           "flash2+rmsnorm recompute=none (predicted MFU ")
    assert "flash2 on Hopper is the flash3 command" in note
    assert note.endswith("add it (search_spaces.attention=[fused,flash2,flash3], or "
                         "attention=[..., 'flash3'] in Python).")
    # With flash3 in the space its layout is the analytic best, and it is measured.
    ranked = layoutsearch.search(cost_model=model, cluster="h100_sxm", **SMALL_JOB, **pins,
                                 attention=["fused", "flash2", "flash3"])
    assert ranked["attention"].iloc[0] == "flash3" and ranked.attrs["coverage_note"] == ""


def on_checkout(tmp_path: Path, arguments: str) -> tuple[MeasuredCostModel, Path]:
    """A measured model on the fake Megatron-LM (top_k=3) in a checkout whose arguments
    module is `arguments` (tests/checkouts.py), and that checkout."""
    folder = write_checkout(tmp_path / "Megatron-LM", arguments)
    fake = fake_measured_model(tmp_path, top_k=3)
    return MeasuredCostModel(settings=fake.settings.replace(megatron_path=str(folder)),
                             measurements=fake.file.path, launcher=fake.launcher,
                             prescreen=fake.prescreen, top_k=3), folder


def test_a_layout_the_checkouts_own_validate_args_rejects_is_not_launched(tmp_path):
    model, folder = on_checkout(tmp_path, MICRO_BATCH_1_ONLY)
    ranked = layoutsearch.search(cost_model=model, **JOB)
    refused = ranked[ranked["reason"].str.contains("rejects the command")]
    assert len(refused) >= 1 and (refused["micro_batch_size"] == 2).all()
    assert refused["reason"].iloc[0].startswith(
        f"not measured: Megatron-LM in {folder} rejects the command: validate_args: "
        "AssertionError: this checkout trains micro-batch 1 only, got 2 (")
    assert len(launches(tmp_path)) == 3 == model.launched
    assert all("--micro-batch-size 1 " in argv for argv in launches(tmp_path))


def test_a_checkout_that_does_not_take_the_flags_stops_the_search_before_a_launch(tmp_path):
    model, folder = on_checkout(tmp_path, KNOWS_NO_FLAG)
    with pytest.raises(LayoutSearchError, match=(
            rf"^cost_models=measured cannot launch: Megatron-LM in {folder} does not take the "
            r"command's flags \(pretrain_gpt.py: error: unrecognized arguments: --num-layers "
            r"40 .*\); layoutsearch writes those of Megatron-LM main \(2025-2026\). Use such a "
            r"checkout, or set validate_args: false in the Megatron-LM settings to launch "
            r"anyway. Nothing was launched; no run is recorded in .*measurements.csv yet$")):
        layoutsearch.search(cost_model=model, **JOB)
    assert launches(tmp_path) == []
