"""The fake Megatron-LM prints what the parser reads, and the conformance suite's own checks."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import layoutsearch
from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.costs import build_cost_model
from layoutsearch.layout import Layout
from layoutsearch.measurements import read_measurements
from layoutsearch.megatron import LocalLauncher, Trial, build_command, parse_log
from layoutsearch.specs import Job
from layoutsearch.testing import (
    FAKE_MEGATRON_PATH,
    check_cost_model,
    fake_megatron_settings,
    launches,
)
from layoutsearch.testing.__main__ import main as write_fake_settings


def _fake_run(tmp_path, model: str, layout: Layout, name: str):
    """One launch of the fake Megatron-LM for `layout` of `model` on 8 A100 80GB."""
    job = Job(model=load_model(model), cluster=load_cluster("a100_80gb"), num_gpus=8,
              seq_length=2048, global_batch_size=64)
    settings = fake_megatron_settings(tmp_path)
    command = build_command(layout, job, settings)
    return LocalLauncher(settings).run(Trial(name=name, command=command,
                                             log_path=tmp_path / f"{name}.log"))


def test_fake_run_of_a_layout_that_does_not_fit_is_an_oom(tmp_path):
    log = _fake_run(tmp_path, "llama_65b", Layout(tp=8, dp=1, rmsnorm_kernel=True), "oom")
    result = parse_log(log.text, returncode=log.returncode)
    assert result.status == "oom" and "torch.OutOfMemoryError" in result.message


def test_fake_prints_the_lines_of_current_megatron_lm(tmp_path):
    # training.py::training_log and utils.py::report_memory of Megatron-LM main (2026): a
    # timestamp with microseconds, memory to two decimals after iterations 1 and 2.
    log = _fake_run(tmp_path, "llama_7b", Layout(tp=1, dp=8, rmsnorm_kernel=True), "ok")
    lines = log.text.splitlines()
    iters = fake_megatron_settings(tmp_path).train_iters
    first = next(line for line in lines if " iteration        1/" in line)
    assert re.match(r" \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] iteration        1/"
                    rf"{iters:8d} \| consumed samples:           64 \| "
                    r"elapsed time per iteration \(ms\): [\d.]+ \| "
                    r"throughput per GPU \(TFLOP/s/GPU\): [\d.]+ \| learning rate: "
                    r"1\.000000E-04 \| global batch size:    64 \|", first), first
    memory = [line for line in lines if "memory (MB)" in line]
    assert [line.split(" memory")[0] for line in memory] == [
        "[Rank 0] (after 1 iterations)", "[Rank 0] (after 2 iterations)"]
    assert all(re.fullmatch(r".*\| allocated: \d+\.\d\d \| max allocated: \d+\.\d\d \| "
                            r"reserved: \d+\.\d\d \| max reserved: \d+\.\d\d", line)
               for line in memory), memory
    assert parse_log(log.text, returncode=log.returncode).status == "ok"


def test_fake_accepts_a_flag_current_megatron_lm_ignores(tmp_path):
    # --use-mcore-models (older example scripts): arguments.py still defines it, ignored.
    job = Job(model=load_model("llama_7b"), cluster=load_cluster("a100_80gb"), num_gpus=8,
              seq_length=2048, global_batch_size=64)
    settings = fake_megatron_settings(tmp_path).replace(extra_args=("--use-mcore-models",))
    command = build_command(Layout(tp=1, dp=8, rmsnorm_kernel=True), job, settings)
    log = LocalLauncher(settings).run(Trial(name="mcore", command=command,
                                            log_path=tmp_path / "mcore.log"))
    assert parse_log(log.text, returncode=log.returncode).status == "ok", log.text


def test_a_local_launch_takes_a_checkout_under_home_and_a_program_by_relative_path(
        tmp_path, monkeypatch):
    # The preflight expanded '~' and found a relative program from this folder, but the
    # process started in the literal '~/...' folder, where neither exists: every layout
    # was "not measured" and the search ended "no layout fits".
    monkeypatch.setenv("HOME", str(FAKE_MEGATRON_PATH.parent))
    monkeypatch.chdir(tmp_path)
    fake = fake_megatron_settings(tmp_path)
    settings = fake.replace(megatron_path=f"~/{FAKE_MEGATRON_PATH.name}",
                            torchrun=(os.path.relpath(sys.executable), *fake.torchrun[1:]))
    job = Job(model=load_model("llama_7b"), cluster=load_cluster("a100_80gb"), num_gpus=8,
              seq_length=2048, global_batch_size=64)
    command = build_command(Layout(tp=1, dp=8, rmsnorm_kernel=True), job, settings)
    launcher = LocalLauncher(settings)
    assert launcher.preflight(command) is None
    log = launcher.run(Trial(name="home", command=command, log_path=tmp_path / "home.log"))
    assert log.ran and parse_log(log.text, returncode=log.returncode).status == "ok"
    assert Path(settings.launch_prefix()[0]).is_absolute()


def test_conformance_suite_passes_the_analytic_model_and_catches_a_broken_one():
    check_cost_model(build_cost_model("analytic"))

    class Reindexed:
        name = "broken"

        def score(self, candidates, clusters):
            return build_cost_model("analytic").score(candidates, clusters).reset_index(drop=True)

    with pytest.raises(AssertionError, match="index"):
        check_cost_model(Reindexed())

    class Silent:
        name = "silent"

        def score(self, candidates, clusters):
            out = build_cost_model("analytic").score(candidates, clusters)
            out["fits"] = False
            out["cost_reason"] = ""
            return pd.DataFrame(out)

    with pytest.raises(AssertionError, match="must say why"):
        check_cost_model(Silent())


def test_written_fake_settings_run_a_measured_search_from_a_file(tmp_path, capsys):
    settings = tmp_path / "sub" / "fake.yaml"  # a folder still to be made
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "launches.txt").write_text("an earlier search's launch\n")
    assert write_fake_settings([str(settings), "--inject", "2=oom"]) == 0
    told = capsys.readouterr().out
    assert f"cost_models.megatron={settings}" in told  # absolute: usable from anywhere
    assert f"cost_models.measurements={tmp_path / 'sub' / 'fake_measurements.csv'}" in told
    model = build_cost_model({"_target_": "layoutsearch.costs.measured.MeasuredCostModel",
                              "megatron": str(settings), "top_k": 2,
                              "measurements": str(tmp_path / "runs.csv")})
    ranked = layoutsearch.search(cost_model=model, model="llama_7b", num_gpus=8,
                                 seq_length=2048, global_batch_size=256)
    # Launch numbers count from these settings on: the second launch is the injected OOM.
    assert list(read_measurements(tmp_path / "runs.csv")["status"]) == ["ok", "oom"]
    assert ranked.iloc[0]["fits"] and len(launches(tmp_path / "sub")) == 2


@pytest.mark.parametrize("args, error", [
    (["{tmp}"], "is a folder, not a file"),
    (["{tmp}/new/"], "is a folder, not a file"),
    (["{tmp}/x.yaml", "--inject", "1=boom"], "inject entry '1=boom' must be LAUNCH=KIND"),
    (["{tmp}/x.yaml", "--inject", "0=oom"], "inject entry '0=oom' must be LAUNCH=KIND"),
    (["{tmp}/x.yaml", "--sleep-s", "-1"], "sleep_s=-1.0 must be >= 0 seconds"),
    (["{tmp}/x.yaml", "--gpu", "h100"], "fake Megatron-LM: unknown GPU 'h100'"),
])
def test_fake_settings_that_would_not_run_as_asked_are_refused(tmp_path, capsys, args, error):
    assert write_fake_settings([a.format(tmp=tmp_path) for a in args]) == 2
    assert error in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists() and not (tmp_path / "new").exists()


def test_fake_settings_for_an_h100_cluster_price_its_runs_as_h100_runs(tmp_path, capsys):
    # The settings always ran the fake as an A100: a search with cluster=h100_sxm recorded
    # A100 step times as H100 runs, and a calibration on them fitted H100 constants to them.
    settings = tmp_path / "fake.yaml"
    assert write_fake_settings([str(settings), "--gpu", "h100_sxm"]) == 0
    assert "layoutsearch cluster=h100_sxm ... cost_models=measured" in capsys.readouterr().out
    written = yaml.safe_load(settings.read_text())
    assert written["env"]["LAYOUTSEARCH_FAKE_GPU"] == "h100_sxm"
