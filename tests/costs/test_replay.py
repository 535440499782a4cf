"""The replay cost model: measured rows price their layouts, nothing is guessed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import layoutsearch
from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.costs import PREDICTION_COLUMNS, ReplayCostModel, build_cost_model
from layoutsearch.errors import LayoutSearchError
from layoutsearch.rules import violations


def _runs(base: dict[str, Any], *changes: dict[str, Any]) -> pd.DataFrame:
    """Rows of the fixture's run, changed; sharded optimizer as the candidates default."""
    return pd.DataFrame([{**base, "distributed_optimizer": True, **change}
                         for change in changes])


@pytest.fixture
def runs_csv(tmp_path: Path, measurement_row: dict[str, Any]) -> Path:
    path = tmp_path / "runs.csv"
    _runs(
        measurement_row,
        {"step_time_s": 30.0, "mfu": 0.60},                      # tp2, measured twice:
        {"step_time_s": 34.0, "mfu": 0.52},                      # ... averaged
        {"tp": 1, "dp": 64, "status": "oom", "step_time_s": None, "mfu": None},
        {"tp": 4, "dp": 16, "sequence_parallel": True, "mfu": 0.5, "step_time_s": 36.0},
    ).to_csv(path, index=False)
    return path


def test_ok_rows_are_averaged_and_tokens_per_s_derived(runs_csv: Path, candidate: Any) -> None:
    model = build_cost_model("replay", path=str(runs_csv))
    rows = candidate("llama_13b", tp=2, attention="flash2", rmsnorm_kernel=True)
    rows["vocab_size"] = 32000
    scored = model.score(rows, clusters_by_gpu())
    assert set(PREDICTION_COLUMNS) <= set(scored.columns)
    row = scored.iloc[0]
    assert row["step_time_s"] == pytest.approx(32.0)
    assert row["mfu"] == pytest.approx(0.56)
    assert row["tokens_per_s"] == pytest.approx(2048 * 2048 / 32.0)
    assert bool(row["fits"]) and row["cost_reason"] == ""
    assert row["measured_runs"] == 2


def test_a_layout_that_ran_in_most_runs_fits_and_says_how_many_did_not(
        tmp_path: Path, measurement_row: dict[str, Any], candidate: Any) -> None:
    path = tmp_path / "runs.csv"
    failed = {"step_time_s": None, "mfu": None}
    _runs(measurement_row,
          {"mfu": 0.60}, {"status": "oom", **failed},                            # tp2: 1 of 2
          {"tp": 4, "dp": 16, "mfu": 0.5, "step_time_s": 36.0},                   # tp4: 2 of 3,
          {"tp": 4, "dp": 16, "mfu": 0.5, "step_time_s": 36.0},                   # the failure
          {"tp": 4, "dp": 16, "status": "timeout", **failed},                     # a timeout
          {"tp": 8, "dp": 8, "status": "oom", **failed},                          # tp8: 1 of 3
          {"tp": 8, "dp": 8, "status": "error", **failed},
          {"tp": 8, "dp": 8, "mfu": 0.4, "step_time_s": 45.0}).to_csv(path, index=False)
    rows = pd.concat([candidate("llama_13b", tp=tp, attention="flash2", rmsnorm_kernel=True)
                      for tp in (2, 4, 8)], ignore_index=True)
    rows["vocab_size"] = 32000
    scored = ReplayCostModel.load(path).score(rows, clusters_by_gpu())
    assert scored["fits"].tolist() == [True, True, False]
    assert scored["mfu"].iloc[0] == pytest.approx(0.60)  # the mean of the runs that finished
    assert scored["cost_reason"].tolist() == [
        "measured: 1 of 2 runs ran out of memory", "measured: 1 of 3 runs timed out",
        "measured: out of memory"]


def test_the_fingerprint_of_a_file_is_the_one_a_stored_study_was_made_with(
        runs_csv: Path) -> None:
    # The digest layoutsearch gave this file before reasons counted the runs that did not
    # finish: an optuna study made then resumes instead of being "made for another search"
    # (or, under its default name, silently started over).
    assert ReplayCostModel.load(runs_csv).fingerprint() == "47a8fd77197e165e"


def test_oom_does_not_fit_and_unmeasured_is_not_guessed(runs_csv: Path,
                                                        candidate: Any) -> None:
    model = ReplayCostModel.load(runs_csv)
    common = {"attention": "flash2", "rmsnorm_kernel": True}
    rows = pd.concat([candidate("llama_13b", tp=1, **common),
                      candidate("llama_13b", tp=8, **common)], ignore_index=True)
    rows["vocab_size"] = 32000
    scored = model.score(rows, clusters_by_gpu())
    assert scored["fits"].tolist() == [False, False]
    assert scored["cost_reason"].iloc[0] == "measured: out of memory"
    assert scored["cost_reason"].iloc[1] == (
        f"unmeasured: no measurement of this layout in {runs_csv}, whose runs of this job "
        "never have tp=8")
    assert scored[["mfu", "step_time_s"]].isna().all().all()


def test_unpriced_names_only_the_layouts_never_measured(runs_csv: Path,
                                                       candidate: Any) -> None:
    model = ReplayCostModel.load(runs_csv)
    common = {"attention": "flash2", "rmsnorm_kernel": True}
    rows = pd.concat([candidate("llama_13b", tp=tp, **common) for tp in (2, 1, 8)],
                     ignore_index=True)
    rows["vocab_size"] = 32000
    rows.index = [30, 10, 20]
    unpriced = model.unpriced(rows, clusters_by_gpu())
    # Measured (ok or out of memory): priced. Never measured: not.
    assert unpriced.to_dict() == {
        30: "", 10: "", 20: f"unmeasured: no measurement of this layout in {runs_csv}, whose "
                            "runs of this job never have tp=8"}
    # A layout of values each run, in a combination that was not, is merely unmeasured.
    combination = candidate("llama_13b", tp=2, sequence_parallel=True, **common)
    combination["vocab_size"] = 32000
    assert model.unpriced(combination, clusters_by_gpu()).iloc[0] == (
        f"unmeasured: no measurement of this layout in {runs_csv}")


def test_matches_on_dimensions_not_the_model_name(runs_csv: Path, candidate: Any) -> None:
    rows = candidate("llama_13b", tp=2, attention="flash2", rmsnorm_kernel=True)
    rows["vocab_size"] = 32000
    rows["model"] = "my-13b"  # another name, same shape: the same job
    model = ReplayCostModel.load(runs_csv)
    assert bool(model.score(rows, clusters_by_gpu())["fits"].iloc[0])
    rows["num_layers"] = 41  # same name, another shape: not measured
    rows["model"] = "llama_13b"
    scored = model.score(rows, clusters_by_gpu())
    assert not bool(scored["fits"].iloc[0])
    # The reason says the file never measured this job, and how it differs from one it did.
    assert scored["cost_reason"].iloc[0] == (
        f"unmeasured: {runs_csv} has no runs of this job (it holds 1 other job): this job "
        f"has num_layers=41 where the nearest measured job has 40")


def test_sequence_parallel_at_tp1_is_the_same_layout(tmp_path: Path,
                                                     measurement_row: dict[str, Any],
                                                     candidate: Any) -> None:
    path = tmp_path / "runs.csv"
    _runs(measurement_row, {"tp": 1, "dp": 64, "sequence_parallel": True}).to_csv(path)
    rows = candidate("llama_13b", tp=1, attention="flash2", rmsnorm_kernel=True)
    rows["vocab_size"] = 32000
    scored = ReplayCostModel.load(path).score(rows, clusters_by_gpu())
    assert scored["mfu"].iloc[0] == pytest.approx(0.6)


def test_a_single_data_parallel_rank_is_the_same_layout_with_either_optimizer(
        tmp_path: Path, measurement_row: dict[str, Any], candidate: Any) -> None:
    # A search keeps tp·pp = 64 (dp·cp = 1) with the sharded optimizer only (its twin with
    # the plain one runs the same); a run measured with the plain optimizer prices it.
    path = tmp_path / "runs.csv"
    _runs(measurement_row, {"tp": 8, "pp": 8, "dp": 1, "distributed_optimizer": False,
                            "mfu": 0.4}).to_csv(path)
    rows = candidate("llama_13b", tp=8, pp=8, attention="flash2", rmsnorm_kernel=True,
                     overlap_grad_reduce=True)
    rows["vocab_size"] = 32000
    assert rows["distributed_optimizer"].iloc[0] and rows["dp"].iloc[0] == 1
    scored = ReplayCostModel.load(path).score(rows, clusters_by_gpu())
    assert scored["mfu"].iloc[0] == pytest.approx(0.4)


def test_scores_many_rows_in_order_on_the_callers_index(runs_csv: Path,
                                                        candidate: Any) -> None:
    knobs = [{"tp": 8}, {"tp": 2}, {"tp": 1}, {"tp": 4, "sequence_parallel": True}]
    rows = pd.concat([candidate("llama_13b", attention="flash2", rmsnorm_kernel=True, **k)
                      for k in knobs])
    rows.index = [40, 30, 20, 10]
    rows["vocab_size"] = 32000
    scored = ReplayCostModel.load(runs_csv).score(rows, clusters_by_gpu())
    assert scored.index.tolist() == [40, 30, 20, 10]
    np.testing.assert_allclose(scored["mfu"].to_numpy(), [np.nan, 0.56, np.nan, 0.5])
    assert scored["fits"].tolist() == [False, True, False, True]


def test_a_measurement_file_under_home_is_read_from_there(
        runs_csv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Read as written, "~/runs.csv" was said not to exist.
    monkeypatch.setenv("HOME", str(runs_csv.parent))
    model = build_cost_model("replay", path="~/runs.csv")
    assert model.fingerprint() == ReplayCostModel.load(runs_csv).fingerprint()


def test_bad_files_and_configs_are_named(tmp_path: Path, measurement_row: dict[str, Any]) -> None:
    with pytest.raises(LayoutSearchError, match=r"^replay: the replay cost model needs 'path', "
                                                r"a measurement file \(CSV or Parquet"):
        build_cost_model("replay")
    missing = tmp_path / "missing.csv"
    with pytest.raises(LayoutSearchError, match=rf"^measurement file '{missing}' does not exist$"):
        build_cost_model("replay", path=str(missing))
    with pytest.raises(LayoutSearchError, match=r"^replay: unknown setting\(s\) pth for the "
                                                r"replay cost model; it takes 'path'"):
        build_cost_model("replay", path="x.csv", pth="y.csv")
    bad = tmp_path / "bad.csv"
    _runs(measurement_row, {}, {"tp": "two"}).to_csv(bad, index=False)
    with pytest.raises(LayoutSearchError, match=rf"{bad}: line 3, column 'tp': 'two' is not a "
                                                r"positive integer"):
        build_cost_model("replay", path=str(bad))


def _replay_search_fitting_nothing(path: Path, **job: Any) -> pd.DataFrame:
    """A 13B search at tp 1-2, pp 1 on 64 GPUs replaying `path`, which warns that nothing fits."""
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        return layoutsearch.search(model="llama_13b", num_gpus=64, cost_model={
            "_target_": "layoutsearch.costs.replay.ReplayCostModel", "path": str(path)},
            tp=[1, 2], pp=[1], **job)


def test_a_search_over_out_of_memory_runs_alone_says_the_cost_model_found_no_fit(
        tmp_path: Path, measurement_row: dict[str, Any]) -> None:
    path = tmp_path / "oom.csv"
    _runs(measurement_row, {"status": "oom", "step_time_s": None, "mfu": None}).to_csv(
        path, index=False)
    # The paper space: some layouts break rules, which are no finding of the replay's.
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        ranked = layoutsearch.search(model="llama_13b", num_gpus=64, seq_length=2048,
                                     global_batch_size=2048, cost_model={
            "_target_": "layoutsearch.costs.replay.ReplayCostModel", "path": str(path)})
    message = ranked.attrs["message"]
    passing = int((ranked["reason"].str.startswith("unmeasured: ")).sum()) + 1
    assert message.startswith(f"no layout fits: {passing} of {len(ranked)} layouts pass the "
                              "rules; 1 measured, none fit: measured: out of memory (rejects 1 "
                              f"of 1 layouts); the other {passing - 1} were not measured: ")
    assert "no layout passes the rules" not in message
    assert "must divide" not in message  # the rules' rejections are not the replay's findings


def test_a_search_over_a_job_the_file_never_ran_says_nothing_was_priced(
        runs_csv: Path) -> None:
    # The file holds llama_13b with a 32000 vocabulary; this job has the catalog's 13B
    # at 4096 tokens: nothing is known about it, which is not the same as "too big".
    ranked = _replay_search_fitting_nothing(runs_csv, seq_length=4096, global_batch_size=1024)
    message = ranked.attrs["message"]
    assert message.startswith("no layout was priced: ")
    assert "no layout fits" not in message
    # The job's differences are one reason, counted once over every layout.
    assert message.endswith(
        "this job has seq_length=4096 where the nearest measured job has 2048, "
        f"global_batch_size=1024 where the nearest measured job has 2048 (rejects "
        f"{len(ranked)} of {len(ranked)} layouts)")


def test_a_space_asking_for_a_knob_value_the_file_never_ran_names_it(runs_csv: Path) -> None:
    # Every run in the file leaves the data-parallel overlap off; a space that turns it on
    # (the default space does) has nothing measured, and the knob to pin is named.
    ranked = _replay_search_fitting_nothing(runs_csv, seq_length=2048, global_batch_size=2048,
                                            overlap_grad_reduce=[True])
    assert ranked.attrs["message"].endswith(
        f"no measurement of this layout in {runs_csv}, whose runs of this job never have "
        f"overlap_grad_reduce=True (rejects {len(ranked)} of {len(ranked)} layouts)")


def test_an_unknown_cost_model_lists_the_cost_models_only() -> None:
    # megatron.yaml beside them holds the Megatron-LM settings, not a cost model.
    with pytest.raises(LayoutSearchError, match=r"did you mean 'analytic'\? valid cost model "
                       r"names: analytic, analytic_prior, measured, replay$"):
        build_cost_model("analytc")


def _replay_search(path: Path, **pins: Any) -> pd.DataFrame:
    """The catalog's 13B at the file's 32000 vocabulary, 2k tokens on 64 A100s, replaying
    `path` over the paper space (pinned by `pins`)."""
    return layoutsearch.search(model="llama_13b", vocab_size=32000, num_gpus=64,
                               seq_length=2048, global_batch_size=2048, cost_model={
        "_target_": "layoutsearch.costs.replay.ReplayCostModel", "path": str(path)}, **pins)


def test_a_search_over_a_space_the_file_covers_in_part_counts_and_names_the_rest(
        runs_csv: Path, tmp_path: Path) -> None:
    ranked = _replay_search(runs_csv)
    passing = int((violations(ranked, clusters_by_gpu()) == "").sum())
    assert ranked.attrs["coverage_note"] == (
        f"{runs_csv} measured 3 of the {passing} layouts of the space that pass the rules for "
        f"this job; the other {passing - 3} have no figures (unmeasured, never guessed): the "
        "ranking is of the measured ones alone. Its runs of this job never have pp=2 or 4 or "
        "8 or 16, micro_batch_size=2 or 4 or 8, attention=flash1 or fused or torch, "
        "rmsnorm_kernel=False, recompute=full, tp=8; pin pp=[1] micro_batch_size=[1] "
        "attention=[flash2] rmsnorm_kernel=[True] recompute=[none] tp=[1,2,4] "
        "(search_spaces.<knob>=[...] on the command line) to keep the search to the knob "
        "values it ran.")
    # The knob values it ran: tp 1, 2 and 4 (sequence parallel at tp 4 only, which
    # leaves tp 2 with it and tp 4 without unmeasured).
    pinned = _replay_search(runs_csv, pp=[1], micro_batch_size=[1], attention=["flash2"],
                            rmsnorm_kernel=[True], recompute=["none"], tp=[1, 2, 4])
    assert pinned.attrs["coverage_note"] == (
        f"{runs_csv} measured 3 of the 5 layouts of the space that pass the rules for this "
        "job; the other 2 have no figures (unmeasured, never guessed): the ranking is of the "
        "measured ones alone.")
    measured_all = _replay_search(runs_csv, pp=[1], micro_batch_size=[1], attention=["flash2"],
                                  rmsnorm_kernel=[True], recompute=["none"], tp=[2],
                                  sequence_parallel=[False])
    assert measured_all.attrs["coverage_note"] == ""


def test_a_file_without_a_column_the_space_sets_names_the_default_it_ran_with(
        tmp_path: Path, measurement_row: dict[str, Any]) -> None:
    # No distributed_optimizer column: every run is read as False, the paper space asks True.
    path = tmp_path / "runs.csv"
    pd.DataFrame([measurement_row]).to_csv(path, index=False)
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        ranked = _replay_search(path, tp=[2], pp=[1], micro_batch_size=[1],
                                attention=["flash2"], rmsnorm_kernel=[True], recompute=["none"])
    assert ranked.attrs["coverage_note"].endswith(
        "Its runs of this job never have distributed_optimizer=True, sequence_parallel=True; "
        "pin distributed_optimizer=[False] sequence_parallel=[False] (search_spaces.<knob>=[...] "
        "on the command line) to keep the search to the knob values it ran.")


def test_a_search_over_a_job_the_file_never_ran_leaves_the_coverage_to_the_message(
        runs_csv: Path) -> None:
    ranked = _replay_search_fitting_nothing(runs_csv, seq_length=4096, global_batch_size=1024)
    assert ranked.attrs["coverage_note"] == ""


def test_a_mapping_without_a_class_says_how_to_name_one() -> None:
    # {"name": "replay", ...} reads like a name, but a mapping is a config: it needs its class.
    with pytest.raises(LayoutSearchError, match=re.escape(
            "cost model config: a cost-model mapping names its class with _target_ (one of "
            "layoutsearch.costs.analytic.AnalyticCostModel, layoutsearch.costs.measured."
            "MeasuredCostModel, layoutsearch.costs.replay.ReplayCostModel), e.g. {'_target_': "
            "'layoutsearch.costs.replay.ReplayCostModel', 'path': 'runs.csv'}; or pass a cost "
            "model: layoutsearch.costs.ReplayCostModel.load('runs.csv')")):
        build_cost_model({"name": "replay", "path": "runs.csv"})
