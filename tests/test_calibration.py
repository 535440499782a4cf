"""Calibration: bounds, the memory fit, the time fit, leave-one-job-out and the CLI.

Measurements are synthetic: two small sweeps "measured" by the analytic model with known
constants, so a fit can be checked against the truth.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from layoutsearch.calibration import (
    Bound,
    bounds_for,
    cross_validate,
    fit_constants,
    fit_memory,
    main,
    nelder_mead,
    timing,
)
from layoutsearch.calibration.cli import _parser
from layoutsearch.calibration.fit import at_least_as_good
from layoutsearch.calibration.memory import _tile, best_overhead
from layoutsearch.calibration.timing import (
    DISORDER_WEIGHT,
    DISORDER_WIDTH,
    PRIOR_SPREAD,
    REGRET_WEIGHT,
    TIME_ERROR_SMOOTHING,
    TIME_ERROR_WEIGHT,
    TimeObjective,
)
from layoutsearch.catalog import clusters_by_gpu, load_cluster, load_model
from layoutsearch.costs import build_cost_model, distinct
from layoutsearch.costs.analytic import AnalyticCostModel
from layoutsearch.costs.constants import AnalyticConstants, load_constants
from layoutsearch.errors import LayoutSearchError
from layoutsearch.paths import config_dir
from layoutsearch.rules import violations
from layoutsearch.space import SearchSpace
from layoutsearch.specs import Job
from tests.costs.builders import shapes

PRIOR = load_constants("analytic_prior")


def synthetic_runs(truth: AnalyticConstants, seq_length: int = 2048) -> pd.DataFrame:
    """Measurement rows of two small sweeps on A100 80GB, 'measured' with `truth`."""
    model = AnalyticCostModel({"a100_80gb": truth})
    frames = []
    for name, gpus in (("llama_7b", 16), ("llama_13b", 32)):
        job = Job(model=load_model(name), cluster=load_cluster("a100_80gb"), num_gpus=gpus,
                  seq_length=seq_length, global_batch_size=256)
        space = SearchSpace(tp=(1, 2, 4), pp=(1, 2, 4), micro_batch_size=(1, 2, 4),
                            sequence_parallel=(False,), attention=("flash2",),
                            rmsnorm_kernel=(True,), recompute=("none", "full"))
        table = space.candidates(job)
        table = table[violations(table, clusters_by_gpu()) == ""].reset_index(drop=True)
        scored = model.score(table, clusters_by_gpu())
        table["status"] = np.where(scored["fits"], "ok", "oom")
        table["step_time_s"] = scored["step_time_s"].where(scored["fits"])
        table["mfu"] = scored["mfu"].where(scored["fits"])
        frames.append(table)
    return pd.concat(frames, ignore_index=True)


def test_nelder_mead_finds_a_quadratic_minimum():
    best, value = nelder_mead(lambda x: float(np.sum((x - [1.0, -2.0]) ** 2)), np.zeros(2),
                              max_evals=400)
    assert best == pytest.approx([1.0, -2.0], abs=1e-3) and value < 1e-6


@pytest.mark.parametrize("bound", [Bound(lo=0.5, hi=0.73), Bound(lo=1e-6, hi=1e-2, log=True)])
def test_bounds_round_trip_and_never_leave_the_range(bound):
    inside = bound.lo + (bound.hi - bound.lo) / 3
    assert bound.from_free(bound.to_free(inside)) == pytest.approx(inside, rel=1e-9)
    for z in (-50.0, 0.0, 50.0):
        assert bound.lo <= bound.from_free(z) <= bound.hi


def test_flash_bounds_are_the_published_ones_per_architecture():
    assert bounds_for("a100_80gb")["flash2_efficiency"] == Bound(lo=0.50, hi=0.73)
    assert bounds_for("h100_sxm")["flash3_efficiency"].hi == 0.75
    assert bounds_for("some_new_gpu")["flash2_efficiency"] == Bound(lo=0.01, hi=1.0)


def test_prior_file_has_every_constant_for_every_gpu_kind():
    assert set(PRIOR) == {"a100_80gb", "a100_40gb", "h100_sxm", "h200"}
    for constants in PRIOR.values():
        for name, bound in bounds_for("a100_80gb").items():
            if name.startswith("flash"):
                continue  # published per architecture, checked below
            assert bound.lo <= getattr(constants, name) <= bound.hi, name
    assert PRIOR["a100_80gb"].gradient_bytes == 4  # Megatron-LM's fp32 main grads with --bf16


def test_best_overhead_takes_the_middle_of_the_widest_error_free_band():
    # Slack (GiB under the limit without overhead): ok rows 5 and 6, oom rows 1 and 2.
    slack = np.array([[5.0, 6.0, 1.0, 2.0]])
    ran = np.array([True, True, False, False])
    errors, overhead, margin = best_overhead(slack, ran, Bound(lo=0.0, hi=16.0))
    assert errors[0] == 0 and overhead[0] == pytest.approx(3.5) and margin[0] == 1.5
    # An upper bound below the band: the best in bounds calls the oom row at slack 2 wrong.
    errors, overhead, _ = best_overhead(slack, ran, Bound(lo=0.0, hi=1.5))
    assert errors[0] == 1 and 1.0 <= overhead[0] <= 1.5


def test_memory_fit_recovers_the_discrete_choices_and_every_call():
    truth = dataclasses.replace(PRIOR["a100_80gb"], gradient_bytes=2.0, logits_sharded_by_tp=0.0,
                                activation_memory_factor=1.5, memory_overhead_gib=2.0)
    runs = synthetic_runs(truth, seq_length=8192)
    assert 0.2 < (runs["status"] == "ok").mean() < 0.8  # both outcomes to learn from
    fit = fit_memory(runs, PRIOR["a100_80gb"], clusters_by_gpu(), grid=9)
    assert fit.errors == 0 and fit.rows == len(runs) and fit.margin_gib > 0
    assert fit.constants.gradient_bytes == 2.0
    predicted = AnalyticCostModel({"a100_80gb": fit.constants}).score(runs, clusters_by_gpu())
    assert (predicted["fits"] == (runs["status"] == "ok")).all()
    # Time constants are left as they were.
    assert fit.constants.gemm_efficiency == PRIOR["a100_80gb"].gemm_efficiency


def test_time_fit_recovers_a_known_gemm_efficiency():
    truth = dataclasses.replace(PRIOR["a100_80gb"], gemm_efficiency=0.65)
    runs = synthetic_runs(truth)
    fitted = fit_constants(runs, PRIOR, ["gemm_efficiency"], max_evals=40,
                           fit_memory_constants=False)
    assert fitted["a100_80gb"].gemm_efficiency == pytest.approx(0.65, rel=0.02)
    assert list(fitted) == ["a100_80gb"]  # no H100 rows: no H100 constants


def test_free_names_time_constants_once_each():
    runs = synthetic_runs(PRIOR["a100_80gb"])
    # The memory fit sets every memory constant or none: naming one would change nothing.
    with pytest.raises(LayoutSearchError, match=r"--free: logit_bytes is a memory constant, "
                       r"which the memory fit sets with the others \(leave out --keep-memory\);"
                       r" --free names time constants: .*gemm_efficiency"):
        fit_constants(runs, PRIOR, ["logit_bytes"], fit_memory_constants=False)
    # A name given twice is one constant, fitted as if given once.
    once, twice = (fit_constants(runs, PRIOR, names, max_evals=20, fit_memory_constants=False)
                   for names in (["gemm_efficiency"], ["gemm_efficiency", "gemm_efficiency"]))
    assert once == twice


def test_time_loss_charges_a_pair_predicted_in_the_wrong_order(monkeypatch):
    runs = synthetic_runs(PRIOR["a100_80gb"])
    ok = runs[(runs["status"] == "ok") & (runs["model"] == "llama_7b")]
    pair = ok.sort_values("step_time_s").iloc[[0, -1]].reset_index(drop=True)
    log_fast, log_slow = np.log(pair["step_time_s"])
    gap = log_slow - log_fast
    objective = TimeObjective(pair, clusters_by_gpu())
    # Both predictions are off by `offset` in log time on each run (the same time error);
    # one spreads the runs apart, the other swaps them by half their gap.
    offset = 0.75 * gap
    apart = np.exp([log_fast - offset, log_slow + offset])
    swapped = np.exp([log_fast + offset, log_slow - offset])

    def loss_of(predicted: np.ndarray) -> float:
        class Predicted(AnalyticCostModel):
            def score(self, table, clusters):  # type: ignore[no-untyped-def]
                return pd.DataFrame({"step_time_s": predicted, "fits": True})
        monkeypatch.setattr(timing, "AnalyticCostModel", Predicted)
        return objective(PRIOR["a100_80gb"])

    # The swap pays the log-time it is wrong by, 2·offset − gap, smoothed over DISORDER_WIDTH,
    # and the regret of picking the slower run; spreading apart pays next to nothing.
    def disorder(predicted_gap: float) -> float:
        return DISORDER_WEIGHT * DISORDER_WIDTH * float(np.logaddexp(0, -predicted_gap
                                                                        / DISORDER_WIDTH))
    regret = REGRET_WEIGHT * 100 * (pair["mfu"].iloc[0] - pair["mfu"].iloc[1])
    # Each run is off by `offset`: the time term is its absolute log error, smoothed below
    # TIME_ERROR_SMOOTHING (the two runs weigh half each).
    time_error = TIME_ERROR_WEIGHT * (np.hypot(offset, TIME_ERROR_SMOOTHING)
                                      - TIME_ERROR_SMOOTHING)
    assert loss_of(apart) == pytest.approx(time_error + disorder(gap + 2 * offset), rel=1e-9)
    assert loss_of(swapped) == pytest.approx(
        time_error + disorder(gap - 2 * offset) + regret, rel=1e-9)
    assert disorder(gap + 2 * offset) < 1e-9
    assert 0 < disorder(gap - 2 * offset) - (2 * offset - gap) < DISORDER_WIDTH * np.log(2)


def test_leave_one_job_out_beats_a_wrong_prior_on_each_held_out_job():
    truth = dataclasses.replace(PRIOR["a100_80gb"], gemm_efficiency=0.65)
    table, pooled = cross_validate(synthetic_runs(truth), PRIOR, ["gemm_efficiency"],
                                   max_evals=40, fit_memory_constants=False)
    assert list(table["model"]) == ["llama_7b", "llama_13b"]
    assert (table["verdict"] == "at least as good").all()
    # The pull towards the prior (19 % off, where its spread is 15 %) costs about 1 point.
    assert (table["mape_cv"] < 0.02).all() and (table["mape_prior"] > 0.1).all()
    assert pooled["mape"] < 0.02
    # Each held-out job's change in ρ comes with an interval around it.
    change = table["spearman_cv"] - table["spearman_prior"]
    assert (table["spearman_change_low"] <= change + 1e-12).all()
    assert (change <= table["spearman_change_high"] + 1e-12).all()


def test_a_job_the_other_jobs_cannot_be_fitted_without_is_not_scored_and_the_rest_are():
    # A big sweep and one of 8 runs: without the big one, too few runs for the constants.
    runs = synthetic_runs(PRIOR["a100_80gb"])
    small = runs[runs["model"] == "llama_13b"].head(8)
    runs = pd.concat([runs[runs["model"] == "llama_7b"], small], ignore_index=True)
    runs["model"] = runs["model"].str.replace("_", "|")  # a free-text name may hold the key's |
    runs["attention"] = runs["attention"].astype(str)
    runs.loc[0, "attention"] = "flash3"  # a rule-breaking row, warned of by the fold fitting it
    with pytest.warns(UserWarning, match=r"^holding out llama\|13b 2048 a100_80gb 32 256: 1 of "):
        table, pooled = cross_validate(runs, PRIOR, max_evals=20, fit_memory_constants=False)
    assert list(table["model"]) == ["llama|7b", "llama|13b"]
    assert table["verdict"].iloc[0].startswith("not scored: without it, a100_80gb: ")
    assert "a fit needs at least 3 per constant" in table["verdict"].iloc[0]
    assert np.isnan(table["spearman_cv"].iloc[0]) and not np.isnan(table["spearman_cv"].iloc[1])
    assert pooled["rows"] == len(small)


def test_cli_counts_held_out_jobs_of_the_scored_ones_and_says_why_once(tmp_path, capsys):
    # Two jobs, one of 8 runs: held out, the big one leaves too few runs to fit, and it was
    # counted as a job not "at least as good" ("0 of 2") with its reason in the table too.
    runs = synthetic_runs(PRIOR["a100_80gb"])
    small = runs[runs["model"] == "llama_13b"].head(8)
    path = tmp_path / "runs.csv"
    pd.concat([runs[runs["model"] == "llama_7b"], small]).to_csv(path, index=False)
    assert main([str(path), "--out", str(tmp_path / "fit.yaml"), "--free", "gemm_efficiency",
                 "--max-evals", "20", "--keep-memory"]) == 0
    printed = capsys.readouterr().out
    assert "held-out jobs at least as good as the prior: 1 of 1 scored (1 not scored)" in printed
    assert printed.count("a fit needs at least 3 per constant") == 1
    assert "  llama_7b 2048 a100_80gb 16 256: not scored: without it, a100_80gb: " in printed
    table = printed.split("score the held-out one")[1].split("held-out jobs")[0]
    assert "not scored (below)" in table


def test_a_figure_neither_model_has_is_no_worse():
    nan = float("nan")
    before = {"fit_accuracy": 0.7, "spearman": nan, "regret_points": nan, "mape": nan}
    after = {**before, "fit_accuracy": 0.9}
    assert all(at_least_as_good(before, after).values())
    assert not at_least_as_good(before, {**after, "fit_accuracy": 0.6})["fit_accuracy"]


def test_cli_writes_a_loadable_config_with_provenance(tmp_path, capsys):
    truth = dataclasses.replace(PRIOR["a100_80gb"], gemm_efficiency=0.7,
                                activation_memory_factor=1.3)
    path = tmp_path / "runs.csv"
    synthetic_runs(truth).to_csv(path, index=False)
    out = tmp_path / "calibrated.yaml"
    assert main([str(path), "--out", str(out), "--free", "gemm_efficiency",
                 "--max-evals", "30", "--memory-grid", "5"]) == 0
    printed = capsys.readouterr().out
    assert "before (analytic_prior)" in printed and "leave-one-job-out pooled" in printed
    assert "held-out jobs at least as good as the prior" in printed
    config = yaml.safe_load(out.read_text())
    provenance = config["provenance"]
    measured = pd.read_csv(path)["status"].isin(["ok", "oom"]).sum()
    assert provenance["rows"] == measured and provenance["base"] == "analytic_prior"
    assert "memory constants: fewest wrong ok/oom calls" in provenance["method"]
    assert provenance["data_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert provenance["settings"] == {"max_evals": 30, "memory_grid": 5, "keep_memory": False}
    assert provenance["layoutsearch"] == importlib.metadata.version("layoutsearch")
    # Jobs are named by every field that makes one: two jobs may differ in GPU kind alone.
    jobs = {"llama_7b 2048 a100_80gb 16 256", "llama_13b 2048 a100_80gb 32 256"}
    assert set(provenance["leave_one_job_out"]) == jobs
    held_out = provenance["leave_one_job_out"]["llama_7b 2048 a100_80gb 16 256"]
    assert {"verdict", "mape_prior", "mape_cv", "spearman_change_95"} <= set(held_out)
    low, high = held_out["spearman_change_95"]
    assert low <= held_out["spearman_cv"] - held_out["spearman_prior"] + 1e-3 and low <= high
    assert "paired-bootstrap interval" in printed
    model = build_cost_model(out)
    assert isinstance(model, AnalyticCostModel)
    assert model.constants["a100_80gb"].gemm_efficiency == pytest.approx(0.7, rel=0.03)


def test_cli_without_usable_runs_exits_2_with_the_reason(tmp_path, capsys):
    runs = synthetic_runs(PRIOR["a100_80gb"]).assign(status="error", step_time_s=np.nan,
                                                     mfu=np.nan)
    path = tmp_path / "errors.csv"
    runs.to_csv(path, index=False)
    with pytest.raises(SystemExit) as stop:
        main([str(path), "--out", str(tmp_path / "x.yaml")])
    assert stop.value.code == 2
    assert "no measured row has status ok or oom" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize(("options", "message"), [
    (["--memory-grid", "1"], "memory_grid=1: must be an integer >= 2"),
    (["--memory-grid", "100000"], "memory_grid=100000: must be at most 101"),
    (["--max-evals", "0"], "max_evals=0: must be an integer >= 1"),
])
def test_cli_settings_out_of_range_exit_2_before_fitting(tmp_path, capsys, options, message):
    path = tmp_path / "runs.csv"
    synthetic_runs(PRIOR["a100_80gb"]).to_csv(path, index=False)
    with pytest.raises(SystemExit) as stop:
        main([str(path), "--out", str(tmp_path / "x.yaml"), "--no-cv", *options])
    assert stop.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main([str(path), "--out", str(tmp_path)])
    assert stop.value.code == 2 and "is a folder" in capsys.readouterr().err


def test_cli_refuses_an_out_it_cannot_or_must_not_write_before_fitting(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    synthetic_runs(PRIOR["a100_80gb"]).to_csv(path, index=False)
    (tmp_path / "afile").write_text("kept\n")
    for out, message in ((path, "is the measurement file"),
                         (tmp_path / "afile" / "x.yaml", "afile, which is a file, not a folder"),
                         (f"{tmp_path}/new/", "is a folder"),
                         # cost_model= reads YAML alone; a .csv may be another measurement file
                         (tmp_path / "other.csv", "must end in .yaml or .yml"),
                         (tmp_path / "fit.txt", "must end in .yaml or .yml")):
        with pytest.raises(SystemExit) as stop:
            main([str(path), "--out", str(out), "--no-cv"])
        assert stop.value.code == 2 and message in capsys.readouterr().err
    # The base's own file: it may hold other GPU kinds, which the fit's file would drop.
    base = tmp_path / "base.yaml"
    base.write_text((config_dir("cost_models") / "analytic_prior.yaml").read_text())
    with pytest.raises(SystemExit) as stop:
        main([str(path), "--base", str(base), "--out", str(base), "--no-cv"])
    assert stop.value.code == 2 and "is the base constants' file" in capsys.readouterr().err
    assert "h100_sxm" in base.read_text()
    assert pd.read_csv(path).shape[0] > 0 and (tmp_path / "afile").read_text() == "kept\n"
    assert not (tmp_path / "other.csv").exists() and not (tmp_path / "fit.txt").exists()


@pytest.mark.parametrize("free", [",", "", " , "])
def test_cli_free_that_names_no_constant_is_refused_not_taken_as_the_default(
        tmp_path, capsys, free):
    path = tmp_path / "runs.csv"
    synthetic_runs(PRIOR["a100_80gb"]).to_csv(path, index=False)
    with pytest.raises(SystemExit) as stop:
        main([str(path), "--out", str(tmp_path / "x.yaml"), "--no-cv", "--free", free])
    assert stop.value.code == 2
    assert f"--free {free!r}: names no constant" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


def test_cli_keeps_the_fit_when_out_cannot_be_written(tmp_path, capsys, monkeypatch):
    import layoutsearch.calibration.cli as cli
    path = tmp_path / "runs.csv"
    synthetic_runs(PRIOR["a100_80gb"]).to_csv(path, index=False)
    write = cli.write_config

    def refuse_first(target, constants, provenance):
        if str(target).endswith("out.yaml") and "layoutsearch-calibrate-" not in str(target):
            raise PermissionError(13, "Permission denied", str(target))
        return write(target, constants, provenance)

    monkeypatch.setattr(cli, "write_config", refuse_first)
    assert main([str(path), "--out", str(tmp_path / "out.yaml"), "--no-cv", "--free",
                 "gemm_efficiency", "--max-evals", "5", "--memory-grid", "3"]) == 1
    error = capsys.readouterr().err
    assert "cannot be written ([Errno 13] Permission denied" in error
    kept = error.rsplit("the fit is kept in ", 1)[1].strip()
    assert isinstance(build_cost_model(kept), AnalyticCostModel)
    # The fit is kept under a name of its own: the one asked for may be what failed.
    assert kept.endswith("/calibrated.yaml")
    assert "memory constants: fewest wrong ok/oom calls" in (
        yaml.safe_load(Path(kept).read_text())["provenance"]["method"])
    # A name the file system refuses is refused before the fit.
    with pytest.raises(SystemExit) as stop:
        main([str(path), "--out", str(tmp_path / f"{'a' * 300}.yaml"), "--no-cv"])
    assert stop.value.code == 2 and "cannot be used (File name too long)" in (
        capsys.readouterr().err)


def test_kept_memory_constants_are_said_so_in_the_provenance(tmp_path):
    path = tmp_path / "runs.csv"
    synthetic_runs(PRIOR["a100_80gb"]).to_csv(path, index=False)
    out = tmp_path / "kept.yaml"
    assert main([str(path), "--out", str(out), "--no-cv", "--keep-memory", "--free",
                 "gemm_efficiency", "--max-evals", "5"]) == 0
    method = yaml.safe_load(out.read_text())["provenance"]["method"]
    assert method.startswith("memory constants: kept from the base (--keep-memory); time")


def test_memory_constants_no_row_pins_are_said_kept_in_the_provenance(tmp_path):
    # Without a run that ran out of memory the memory fit is skipped (with a warning): the
    # provenance must not say a grid chose the constants.
    path = tmp_path / "runs.csv"
    runs = synthetic_runs(PRIOR["a100_80gb"])
    runs[runs["status"] == "ok"].to_csv(path, index=False)
    out = tmp_path / "no_oom.yaml"
    assert main([str(path), "--out", str(out), "--no-cv", "--free", "gemm_efficiency",
                 "--max-evals", "5"]) == 0
    method = yaml.safe_load(out.read_text())["provenance"]["method"]
    assert method.startswith("memory constants: kept from the base (no row ran out of "
                             "memory); time")


def test_cli_writes_only_the_measured_gpu_kinds(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    synthetic_runs(PRIOR["a100_80gb"]).to_csv(path, index=False)
    out = tmp_path / "cost_models" / "mine.yaml"
    assert main([str(path), "--out", str(out), "--no-cv", "--free", "gemm_efficiency",
                 "--max-evals", "5", "--memory-grid", "3"]) == 0
    assert f"use it: layoutsearch --config-dir {tmp_path} cost_models=mine" in (
        capsys.readouterr().out)
    config = yaml.safe_load(out.read_text())
    assert list(config["gpus"]) == ["a100_80gb"] == config["provenance"]["gpus"]
    h100 = load_cluster("h100_sxm")
    with pytest.raises(LayoutSearchError, match="has no constants for GPU kind"):
        build_cost_model(out).score(synthetic_runs(PRIOR["a100_80gb"]).head(3).assign(
            gpu="h100_sxm"), {"h100_sxm": h100})


def test_a_calibrated_base_without_a_kind_of_the_data_leaves_its_rows_out(tmp_path, capsys):
    runs = synthetic_runs(PRIOR["a100_80gb"])
    path = tmp_path / "runs.csv"
    runs.to_csv(path, index=False)
    first = tmp_path / "cost_models" / "mine.yaml"
    fit = ["--no-cv", "--free", "gemm_efficiency", "--max-evals", "5", "--memory-grid", "3"]
    assert main([str(path), "--out", str(first), *fit]) == 0
    # Recalibrating from that file (A100 only) on data that has H100 runs too.
    h100 = runs[runs["status"] == "ok"].assign(gpu="h100_sxm")
    h100["mfu"] *= 312 / 989
    both = tmp_path / "both.csv"
    pd.concat([runs, h100], ignore_index=True).to_csv(both, index=False)
    capsys.readouterr()
    assert main([str(both), "--base", str(first), "--out", str(tmp_path / "again.yaml"),
                 *fit]) == 0
    assert (f"warning: {len(h100)} rows left out: --base {first} has no constants for GPU "
            "kind(s) h100_sxm") in capsys.readouterr().err
    # Only rows the base cannot start from: the reason, exit status 2, no traceback.
    h100.to_csv(both, index=False)
    with pytest.raises(SystemExit) as stop:
        main([str(both), "--base", str(first), "--out", str(tmp_path / "x.yaml"), *fit])
    assert stop.value.code == 2 and "start from analytic_prior" in capsys.readouterr().err


def test_a_gpu_kind_with_too_few_runs_is_left_out_and_the_other_still_fitted(tmp_path, capsys):
    runs = synthetic_runs(PRIOR["a100_80gb"])
    # Two H100 runs beside the A100 sweeps: too few for its constants, and no reason to
    # lose the A100 fit. Their times are the A100's, which would be far off for an H100.
    h100 = runs[runs["status"] == "ok"].head(2).assign(gpu="h100_sxm")
    h100["mfu"] *= 312 / 989  # the same step time, as a share of the H100's bf16 peak
    path = tmp_path / "runs.csv"
    pd.concat([runs, h100], ignore_index=True).to_csv(path, index=False)
    out = tmp_path / "mine.yaml"
    assert main([str(path), "--out", str(out), "--no-cv", "--free", "gemm_efficiency",
                 "--max-evals", "5", "--memory-grid", "3"]) == 0
    printed = capsys.readouterr()
    assert ("layoutsearch-calibrate: warning: h100_sxm: 2 layouts with status ok (repeated "
            "runs count once) for 1 constants (gemm_efficiency)") in printed.err
    assert "its constants are not fitted" in printed.err
    # The figures are those of the kinds the file holds constants for.
    assert ("warning: the rows of h100_sxm are left out of the figures below: their "
            "constants were not fitted") in printed.err
    assert "h100_sxm" not in printed.out and f"({len(runs)} rows)" in printed.out
    config = yaml.safe_load(out.read_text())
    assert list(config["gpus"]) == ["a100_80gb"] == config["provenance"]["gpus"]
    assert config["provenance"]["rows"] == runs["status"].isin(["ok", "oom"]).sum()
    # With the A100 rows gone too, nothing can be fitted: the error names why.
    with (pytest.raises(LayoutSearchError,
                        match=r"h100_sxm: 2 layouts with status ok \(repeated runs count once\)"),
          pytest.warns(UserWarning, match="h100_sxm: no row with status oom")):
        fit_constants(h100, PRIOR, max_evals=5, memory_grid=3)


def test_measured_rows_that_break_a_rule_are_named_and_left_out(tmp_path, capsys):
    runs = synthetic_runs(PRIOR["a100_80gb"])
    runs["attention"] = runs["attention"].astype(str)
    runs.loc[3, "attention"] = "flash3"  # a typo: FlashAttention-3 needs a Hopper GPU
    path = tmp_path / "runs.csv"
    header, *records = runs.to_csv(index=False).splitlines()
    path.write_text("\n".join([header, "", *records]) + "\n")  # a blank line: row 3 on line 6
    assert main([str(path), "--out", str(tmp_path / "mine.yaml"), "--no-cv", "--free",
                 "gemm_efficiency", "--max-evals", "5", "--memory-grid", "3"]) == 0
    error = capsys.readouterr().err
    assert (f"warning: 1 of {len(runs)} ok/oom rows break a rule and are left out of the fit, "
            "e.g. line 6 (llama_7b, a100_80gb, tp ") in error
    assert "flash3" in error.split("e.g. line 6", 1)[1]
    provenance = yaml.safe_load((tmp_path / "mine.yaml").read_text())["provenance"]
    assert provenance["rows"] == len(runs) - 1  # the rows the fit used


def test_memory_constants_kept_because_every_oom_row_breaks_a_rule_are_said_kept(tmp_path,
                                                                                 capsys):
    runs = synthetic_runs(PRIOR["a100_80gb"])
    runs["attention"] = runs["attention"].astype(str)
    runs.loc[runs["status"] == "oom", "attention"] = "flash3"  # not on an A100
    path = tmp_path / "runs.csv"
    runs.to_csv(path, index=False)
    assert main([str(path), "--out", str(tmp_path / "mine.yaml"), "--no-cv", "--free",
                 "gemm_efficiency", "--max-evals", "5"]) == 0
    assert "a100_80gb: no row with status oom" in capsys.readouterr().err
    method = yaml.safe_load((tmp_path / "mine.yaml").read_text())["provenance"]["method"]
    assert method.startswith("memory constants: kept from the base (no row ran out of memory)")


def test_step_times_in_the_wrong_unit_are_refused_before_the_fit():
    runs = synthetic_runs(PRIOR["a100_80gb"])
    runs["step_time_s"] *= 1000  # milliseconds
    with pytest.raises(LayoutSearchError, match=r"index 0 \(llama_7b, a100_80gb, tp 1 pp 1\): "
                       r"step_time_s=.* gives MFU .* but mfu=.* \(1e\+03x\); .* is "
                       "step_time_s in seconds"):
        fit_constants(runs, PRIOR, ["gemm_efficiency"], max_evals=5, memory_grid=3)


def test_out_of_memory_rows_alone_are_refused_they_pin_no_constant():
    # All oom: any memory constant pushed far enough "agrees" with every row (the fit
    # would report fit accuracy 1.0 with 8 GiB of overhead), and no row has a step time.
    runs = synthetic_runs(PRIOR["a100_80gb"], seq_length=8192)
    only_oom = runs[runs["status"] == "oom"]
    assert len(only_oom) >= 15
    with pytest.raises(LayoutSearchError, match="a100_80gb: every row has status oom, which "
                       "pins no constant"):
        fit_constants(only_oom, PRIOR, max_evals=5, memory_grid=3)


def test_runs_that_all_fit_keep_the_memory_constants_and_fit_the_time_ones():
    runs = synthetic_runs(dataclasses.replace(PRIOR["a100_80gb"], gemm_efficiency=0.7))
    only_ok = runs[runs["status"] == "ok"]
    with pytest.warns(UserWarning, match="a100_80gb: no row with status oom; its memory "
                      "constants stay the base's"):
        fitted = fit_constants(only_ok, PRIOR, ["gemm_efficiency"], max_evals=60,
                               memory_grid=3)["a100_80gb"]
    assert fitted.memory_overhead_gib == PRIOR["a100_80gb"].memory_overhead_gib
    assert fitted.gemm_efficiency == pytest.approx(0.7, rel=0.05)


def test_too_few_rows_for_the_constants_are_refused(tmp_path, capsys):
    runs = synthetic_runs(PRIOR["a100_80gb"])
    path = tmp_path / "three.csv"
    few = pd.concat([runs[runs["status"] == status].head(1) for status in ("ok", "oom")])
    few.to_csv(path, index=False)
    with pytest.raises(SystemExit) as stop:
        main([str(path), "--out", str(tmp_path / "x.yaml")])
    assert stop.value.code == 2
    assert ("a100_80gb: 2 layouts with status ok or oom (repeated runs count once) for 5 "
            "constants" in capsys.readouterr().err)
    assert not (tmp_path / "x.yaml").exists()
    with pytest.raises(LayoutSearchError, match=r"2 layouts with status ok \(repeated runs "
                                                r"count once\) for 2 constants "
                                                r"\(gemm_efficiency, network_efficiency\); "
                                                r"a fit needs at least 3 per constant \(6\)"):
        fit_constants(runs[runs["status"] == "ok"].head(2), PRIOR,
                      ["gemm_efficiency", "network_efficiency"], fit_memory_constants=False)
    # Eleven runs of each of those two layouts are still two layouts.
    repeated = pd.concat([runs[runs["status"] == "ok"].head(2)] * 11, ignore_index=True)
    with pytest.raises(LayoutSearchError, match=r"2 layouts with status ok \(repeated runs "):
        fit_constants(repeated, PRIOR, ["gemm_efficiency", "network_efficiency"],
                      fit_memory_constants=False)


def test_cli_on_one_job_fits_and_says_why_it_skips_cross_validation(tmp_path, capsys):
    runs = synthetic_runs(PRIOR["a100_80gb"])
    path = tmp_path / "one_job.csv"
    runs[runs["model"] == "llama_7b"].to_csv(path, index=False)
    out = tmp_path / "one.yaml"
    assert main([str(path), "--out", str(out), "--free", "gemm_efficiency",
                 "--max-evals", "10", "--memory-grid", "3"]) == 0
    printed = capsys.readouterr()
    assert "layoutsearch-calibrate: cross-validation skipped: leave-one-job-out needs " \
           "measurements of at least 2 jobs" in printed.err and "these rows hold 1" in printed.err
    assert "held-out jobs" not in printed.out and out.is_file()
    provenance = yaml.safe_load(out.read_text())["provenance"]
    assert provenance["leave_one_job_out"].startswith("skipped: leave-one-job-out needs")


def test_a_free_constant_these_rows_cannot_move_is_kept_with_a_warning():
    # flash2 only (no FlashAttention-3 on A100), measured with slower GEMMs than the prior's.
    runs = synthetic_runs(dataclasses.replace(PRIOR["a100_80gb"], gemm_efficiency=0.65))
    with pytest.warns(UserWarning, match="--free flash3_efficiency moves no predicted step "
                                         "time of these rows"):
        fitted = fit_constants(runs, PRIOR, ["flash3_efficiency", "gemm_efficiency"],
                               max_evals=10, fit_memory_constants=False)
    assert fitted["a100_80gb"].flash3_efficiency == PRIOR["a100_80gb"].flash3_efficiency
    assert fitted["a100_80gb"].gemm_efficiency != PRIOR["a100_80gb"].gemm_efficiency


def test_unknown_constant_is_named():
    runs = synthetic_runs(PRIOR["a100_80gb"])
    with pytest.raises(LayoutSearchError, match=r"^--free: unknown constant\(s\) gemm_eff "
                                                r"\(did you mean 'gemm_efficiency'\?\), "
                                                r"zzz; constants: .*, gemm_efficiency, "):
        fit_constants(runs, PRIOR, ["gemm_eff", "zzz"], max_evals=5)


def test_prior_spreads_name_continuous_constants():
    assert set(PRIOR_SPREAD) <= set(bounds_for("a100_80gb"))
    assert all(spread > 0 for spread in PRIOR_SPREAD.values())


def test_the_base_must_be_analytic_constants_and_an_unknown_one_lists_those(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    synthetic_runs(PRIOR["a100_80gb"]).to_csv(path, index=False)
    for base, message in (
            ("measured", "holds a MeasuredCostModel config, not analytic constants"),
            ("analytc", "did you mean 'analytic'? valid analytic constants names: analytic, "
                        "analytic_prior")):
        with pytest.raises(SystemExit) as stop:
            main([str(path), "--out", str(tmp_path / "x.yaml"), "--base", base])
        assert stop.value.code == 2 and message in capsys.readouterr().err


def test_the_calibration_runs_as_a_module(tmp_path):
    done = subprocess.run([sys.executable, "-m", "layoutsearch.calibration", "--help"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.startswith("usage: layoutsearch-calibrate")
    assert "Warning" not in done.stderr


def test_every_calibration_option_says_what_it_does_in_its_help():
    silent = [action.option_strings or action.dest for action in _parser()._actions
              if not action.help]
    assert silent == []


def test_every_calibration_option_with_a_default_names_it_in_its_help():
    # `--base` starts the fit from analytic_prior unless told otherwise: `--help` says so.
    unnamed = [action.option_strings for action in _parser()._actions
               if action.option_strings and action.default not in (None, False, argparse.SUPPRESS)
               and f"default {action.default}" not in action.help % vars(action)]
    assert unnamed == []


def test_tiled_shapes_repeat_each_row_and_keep_what_every_row_shares(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distinct, "MIN_ROWS", 0)  # the table's layer shapes are found
    sh = shapes(tp=[1, 2], pp=[1, 2])
    tiled = _tile(sh, 3)
    np.testing.assert_array_equal(tiled.layer.tp, np.tile(sh.layer.tp, 3))
    np.testing.assert_array_equal(tiled.pp, np.tile(sh.pp, 3))
    assert tiled.stage_layers.shape == (3, 3 * len(sh.pp))
    assert np.ndim(tiled.layer.hidden) == 0  # one model: one number, not repeated
    assert isinstance(tiled.gpu_kinds, list) and tiled.gpu_kinds == sh.gpu_kinds
    # A fit's blocks price their layers row by row: finding the shapes of a table many
    # times over costs more than it saves.
    assert sh.layer_groups is not None and tiled.layer_groups is None
