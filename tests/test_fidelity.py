"""Fidelity metrics (docs/fidelity.md) against values computed by hand on a tiny frame."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from layoutsearch.api import predict
from layoutsearch.errors import LayoutSearchError
from layoutsearch.fidelity import (
    collapse_twins,
    fidelity,
    knob_effects,
    order_errors_by_gap,
    run_noise,
    signed_errors,
    spearman_change_interval,
)

JOB_13B = {"model": "llama_13b", "seq_length": 2048, "gpu": "a100_80gb", "num_gpus": 64,
           "global_batch_size": 2048}
JOB_30B = {**JOB_13B, "model": "llama_30b"}


def run(job: dict[str, object], tp: int, pp: int, status: str, mfu: float | None,
        predicted: float, fits: bool, *, sp: bool = False, mb: int = 1) -> dict[str, object]:
    return {**job, "tp": tp, "pp": pp, "micro_batch_size": mb, "sequence_parallel": sp,
            "attention": "flash2", "recompute": "none", "status": status, "mfu": mfu,
            "predicted_mfu": predicted, "predicted_fits": fits}


@pytest.fixture
def runs() -> pd.DataFrame:
    return pd.DataFrame([
        # 13B: five effective layouts after collapsing.
        run(JOB_13B, 1, 1, "ok", 0.60, 0.50, True),
        run(JOB_13B, 1, 1, "ok", 0.62, 0.50, True, sp=True),  # SP at tp 1: a twin of the above
        run(JOB_13B, 2, 1, "ok", 0.55, 0.58, True),
        run(JOB_13B, 2, 1, "ok", 0.57, 0.58, True),            # a repeat
        run(JOB_13B, 1, 2, "oom", None, 0.70, True),           # predicted fits, went OOM
        run(JOB_13B, 4, 1, "ok", 0.50, 0.45, False),           # predicted OOM, ran
        run(JOB_13B, 1, 1, "unavailable", None, 0.90, True, mb=2),  # left out
        run(JOB_13B, 2, 2, "oom", None, 0.40, False),
        # 30B: the best measured layout is predicted worst.
        run(JOB_30B, 1, 1, "ok", 0.60, 0.40, True),
        run(JOB_30B, 2, 1, "ok", 0.50, 0.55, True),
        run(JOB_30B, 4, 1, "ok", 0.45, 0.50, True),
        run(JOB_30B, 2, 2, "ok", 0.40, 0.45, True),
        run(JOB_30B, 8, 1, "oom", None, 0.30, False),
    ])


def test_collapse_twins(runs: pd.DataFrame) -> None:
    collapsed = collapse_twins(runs)
    assert len(collapsed) == 5 + 5  # the unavailable row is gone, two pairs merged
    small = collapsed[collapsed["model"] == "llama_13b"].set_index(["tp", "pp"])
    assert not small["sequence_parallel"].any()
    assert small.loc[(1, 1), "mfu"] == pytest.approx((0.60 + 0.62) / 2)
    assert small.loc[(2, 1), "mfu"] == pytest.approx((0.55 + 0.57) / 2)
    assert small.loc[(1, 2), "status"] == "oom" and np.isnan(small.loc[(1, 2), "mfu"])


def test_sequence_parallel_at_tp2_is_not_a_twin(runs: pd.DataFrame) -> None:
    extra = pd.DataFrame([run(JOB_13B, 2, 1, "ok", 0.59, 0.60, True, sp=True)])
    collapsed = collapse_twins(pd.concat([runs, extra], ignore_index=True))
    assert len(collapsed) == 11


def test_a_layout_that_ran_once_and_went_oom_once_counts_as_ran() -> None:
    frame = pd.DataFrame([run(JOB_13B, 1, 1, "ok", 0.6, 0.5, True),
                          run(JOB_13B, 1, 1, "oom", None, 0.5, True)])
    collapsed = collapse_twins(frame)
    assert collapsed["status"].tolist() == ["ok"] and collapsed["mfu"].tolist() == [0.6]


def test_group_metrics_by_hand(runs: pd.DataFrame) -> None:
    table, _ = fidelity(runs)
    small, large = (row for _, row in table.set_index("model").iterrows())
    # 13B after collapsing (tp,pp: measured / predicted / predicted fits):
    #   1,1: ok 0.61 / 0.50 / yes   2,1: ok 0.56 / 0.58 / yes   1,2: oom / 0.70 / yes
    #   4,1: ok 0.50 / 0.45 / no    2,2: oom / 0.40 / no
    assert small["rows"] == 5
    assert small["fit_accuracy"] == pytest.approx(3 / 5)  # 1,2 and 4,1 are wrong calls
    assert (small["fits_but_oom"], small["oom_but_ran"]) == (1, 1)
    # Ranks of the ok rows, predicted (0.50, 0.58, 0.45) -> 2, 3, 1; measured -> 3, 2, 1;
    # d = (-1, 1, 0): rho = 1 - 6·2 / (3·(9 − 1)) = 0.5.
    assert small["spearman"] == pytest.approx(0.5)
    # The top pick (1,2 at 0.70) went OOM and scores 0: regret = 0.61 − 0 = 61 points.
    assert small["regret_points"] == pytest.approx(61.0)
    # The three best predicted-to-fit rows are 1,2; 2,1; 1,1 - the best measured is among them.
    assert small["top3_hit"]
    mape_small = (abs(0.50 - 0.61) / 0.61 + abs(0.58 - 0.56) / 0.56 + abs(0.45 - 0.50) / 0.50) / 3
    assert small["mape"] == pytest.approx(mape_small)
    # 30B: every fit call right; ranks predicted (1, 4, 3, 2) vs measured (4, 3, 2, 1):
    # d = (−3, 1, 1, 1), rho = 1 − 6·12 / (4·15) = −0.2.
    assert large["rows"] == 5 and large["fit_accuracy"] == 1.0
    assert large["spearman"] == pytest.approx(-0.2)
    assert large["regret_points"] == pytest.approx(10.0)  # picks 0.55 -> measured 0.50 vs 0.60
    assert not large["top3_hit"]  # the best (0.60) is predicted 4th
    mape_large = (0.20 / 0.60 + 0.05 / 0.50 + 0.05 / 0.45 + 0.05 / 0.40) / 4
    assert large["mape"] == pytest.approx(mape_large)


def test_summary_by_hand(runs: pd.DataFrame) -> None:
    _, summary = fidelity(runs)
    assert summary["rows"] == 10 and summary["groups"] == 2
    assert summary["fit_accuracy"] == pytest.approx((3 + 5) / 10)
    assert (summary["fits_but_oom"], summary["oom_but_ran"]) == (1, 1)
    assert summary["min_spearman"] == pytest.approx(-0.2)
    assert summary["max_regret_points"] == pytest.approx(61.0)
    assert summary["top3_hits"] == 1
    errors = [0.11 / 0.61, 0.02 / 0.56, 0.05 / 0.50, 0.20 / 0.60, 0.05 / 0.50, 0.05 / 0.45,
              0.05 / 0.40]
    assert summary["mape"] == pytest.approx(sum(errors) / len(errors))


def test_a_group_none_of_whose_runs_finished_is_counted_not_skipped(
        runs: pd.DataFrame) -> None:
    every_oom = pd.DataFrame([run({**JOB_13B, "model": "llama_65b"}, 1, 1, "oom", None, 0.9, True),
                              run({**JOB_13B, "model": "llama_65b"}, 2, 1, "oom", None, 0.8,
                                  False)])
    table, summary = fidelity(pd.concat([runs, every_oom], ignore_index=True))
    group = table.set_index("model").loc["llama_65b"]
    # No best MFU to regret against: NaN, not 0, and the summary says so.
    assert group[["spearman", "regret_points", "mape"]].isna().all()
    assert summary["groups"] == 3 and summary["groups_without_a_run"] == 1
    assert summary["max_regret_points"] == pytest.approx(61.0)  # of the jobs that ran
    _, alone = fidelity(runs)
    assert alone["groups_without_a_run"] == 0


def test_the_benchmark_counts_top3_hits_of_the_jobs_that_ran_and_says_what_it_left_out(
        tmp_path: Path, measurement_row: dict[str, Any]) -> None:
    failed = {"status": "oom", "step_time_s": None, "mfu": None}
    path = tmp_path / "runs.csv"
    pd.DataFrame([measurement_row, {**measurement_row, "tp": 4, "dp": 16, "mfu": 0.5},
                  {**measurement_row, "seq_length": 4096, **failed},
                  {**measurement_row, "seq_length": 4096, "tp": 4, "dp": 16, **failed},
                  ]).to_csv(path, index=False)
    benchmark = Path(__file__).parents[1] / "benchmarks" / "fidelity.py"
    out = subprocess.run([sys.executable, str(benchmark), "--runs", str(path)],
                         capture_output=True, text=True, check=True).stdout
    _, summary = fidelity(predict(path))
    hits = int(summary["top3_hits"])
    assert f"| top-3 hits {hits}/1 |" in out
    assert ("1 of the 2 jobs had no run that finished (every layout out of memory): their ρ, "
            "regret and MAPE are NaN, left out of the summary's min ρ, max regret, MAPE and "
            "top-3 hits\n") in out


def test_a_group_with_no_predicted_fit_regrets_its_best() -> None:
    frame = pd.DataFrame([run(JOB_13B, 1, 1, "ok", 0.6, 0.5, False),
                          run(JOB_13B, 2, 1, "ok", 0.5, 0.4, False)])
    table, _ = fidelity(frame)
    assert table.loc[0, "regret_points"] == pytest.approx(60.0)
    assert not table.loc[0, "top3_hit"]


def test_needs_predictions(runs: pd.DataFrame) -> None:
    with pytest.raises(LayoutSearchError, match=r"missing predicted_fits"):
        fidelity(runs.drop(columns="predicted_fits"))


@pytest.mark.parametrize("table", [order_errors_by_gap, run_noise,
                                   lambda frame: signed_errors(frame, "tp")])
def test_every_table_names_missing_predictions(runs: pd.DataFrame, table: Any) -> None:
    with pytest.raises(LayoutSearchError, match=r"missing predicted_mfu, predicted_fits; "
                                                r"score the rows .* with layoutsearch.predict"):
        table(runs.drop(columns=["predicted_mfu", "predicted_fits"]))


def test_predictions_read_back_as_text_keep_their_fit_calls(runs: pd.DataFrame) -> None:
    _, summary = fidelity(runs)
    _, as_text = fidelity(runs.assign(predicted_fits=runs["predicted_fits"].astype(str)))
    assert as_text == summary  # "False" is not taken as true
    with pytest.raises(LayoutSearchError, match=r"index 2, column 'predicted_fits': an empty "
                                                r"cell is not a boolean"):
        fidelity(runs.assign(predicted_fits=runs["predicted_fits"].where(runs.index != 2)))
    # A run that is left out (index 6, unavailable) needs no call: a tool may leave it blank.
    unpredicted = runs["predicted_fits"].astype(str).where(runs["status"] != "unavailable")
    assert fidelity(runs.assign(predicted_fits=unpredicted))[1] == summary


def test_a_row_predicted_to_fit_without_a_predicted_mfu_is_not_ranked() -> None:
    frame = pd.DataFrame([run(JOB_13B, 1, 1, "ok", 0.6, np.nan, True),
                          run(JOB_13B, 2, 1, "ok", 0.5, 0.4, True)])
    table, _ = fidelity(frame)
    assert table.loc[0, "regret_points"] == pytest.approx(10.0)
    assert not table.loc[0, "top3_hit"]  # the best run was never ranked


def test_runs_of_two_models_under_one_name_are_refused(measurement_row: dict[str, Any]) -> None:
    # One name for a family: the 13B's tp 2 run would be averaged with the 7B's as a repeat.
    small = {"num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 11008,
             "num_attention_heads": 32, "num_query_groups": 32}
    rows = pd.DataFrame([measurement_row, {**measurement_row, **small, "mfu": 0.5,
                                           "step_time_s": 18.0}]).assign(model="llama")
    with pytest.raises(LayoutSearchError, match=r"the rows of model=llama, .* differ in "
                                                r"num_layers \(32, 40\): runs of different jobs"):
        fidelity(predict(rows))
    # Spellings of one value are one job.
    same = rows.iloc[[0, 0]].assign(swiglu=["true", "yes"]).reset_index(drop=True)
    assert fidelity(predict(same))[1]["rows"] == 1


def test_predict_then_fidelity_on_a_file_with_spelled_out_booleans(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    rows = [{**measurement_row, "sequence_parallel": flag, "tp": tp, "dp": 64 // tp,
             "mfu": mfu}
            for flag, tp, mfu in (("true", 1, 0.60), ("false", 1, 0.62), ("yes", 2, 0.55),
                                  ("no", 4, 0.50))]
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    table, summary = fidelity(predict(path))
    assert table.loc[0, "rows"] == 3  # tp 1 with and without SP is one layout
    assert summary["groups"] == 1


def test_a_frame_without_ok_or_oom_rows_is_named() -> None:
    frame = pd.DataFrame({"status": ["error"], "tp": [1], "sequence_parallel": [False],
                          "mfu": [None], "predicted_mfu": [0.5], "predicted_fits": [True]})
    with pytest.raises(LayoutSearchError, match="status ok or oom"):
        fidelity(frame)


def test_order_errors_by_gap_by_hand() -> None:
    rows = pd.DataFrame([
        run(JOB_13B, 1, 1, "ok", 0.48, 0.500, True),
        run(JOB_13B, 2, 1, "ok", 0.50, 0.485, True),   # 3 % below the first, measured above it
        run(JOB_13B, 4, 1, "ok", 0.31, 0.300, True),   # far below both, and measured so
        run(JOB_13B, 8, 1, "oom", None, 0.200, True),  # no measured MFU: in no pair
        run(JOB_30B, 1, 1, "ok", 0.40, 0.400, True),   # alone in its job: no pair
    ])
    order = order_errors_by_gap(rows, edges=(0.0, 0.05, 0.2, 1.0))
    assert order["pairs"].tolist() == [1, 0, 2]
    assert order["wrong_order"].iloc[0] == 1.0 and np.isnan(order["wrong_order"].iloc[1])
    assert order["wrong_order"].iloc[2] == 0.0
    # A gap of exactly 1 (a predicted MFU of 0) is in the last bin.
    zero = rows.assign(predicted_mfu=[0.5, 0.485, 0.0, 0.2, 0.4])
    assert order_errors_by_gap(zero, edges=(0.0, 0.05, 1.0))["pairs"].tolist() == [1, 2]


def test_order_errors_leave_unpriced_rows_out_and_count_two_zeros_as_no_gap() -> None:
    rows = pd.DataFrame([
        run(JOB_13B, 1, 1, "ok", 0.50, 0.0, True),
        run(JOB_13B, 2, 1, "ok", 0.40, 0.0, True),      # same prediction: gap 0, not wrong
        run(JOB_13B, 4, 1, "ok", 0.45, np.nan, True),   # unpriced: in no pair
    ])
    order = order_errors_by_gap(rows, edges=(0.0, 0.05, 1.0))
    assert order["pairs"].tolist() == [1, 0]
    assert order["wrong_order"].iloc[0] == 0.0


def test_signed_errors_by_hand() -> None:
    rows = pd.DataFrame([
        run(JOB_13B, 1, 1, "ok", 0.50, 0.55, True),            # predicted 10 % too high
        run(JOB_13B, 1, 1, "ok", 0.50, 0.55, True, sp=True),   # its twin: counted once
        run(JOB_13B, 2, 1, "ok", 0.40, 0.38, True),            # 5 % too low
        run(JOB_13B, 2, 2, "oom", None, 0.90, True),           # no measured MFU: left out
        run(JOB_30B, 1, 1, "ok", 0.50, 0.45, True),            # 10 % too low
    ]).assign(predicted_peak_memory_gib=[70.0, 74.0, 30.0, 90.0, 50.0])
    per_job, overall = signed_errors(rows, "tp")
    assert overall["value"].tolist() == [1, 2]
    assert overall["rows"].tolist() == [2, 1]
    assert overall["mean_error"].tolist() == pytest.approx([0.0, -0.05])
    thirteen = per_job[per_job["model"] == "llama_13b"]
    assert thirteen["mean_error"].tolist() == pytest.approx([0.10, -0.05])
    # A numeric prediction in bands; twins' predictions are averaged (70 and 74 -> 72).
    _, bands = signed_errors(rows, "predicted_peak_memory_gib", edges=(0, 40, 60, 80))
    assert [str(v) for v in bands["value"]] == ["(0, 40]", "(40, 60]", "(60, 80]"]
    assert bands["mean_error"].tolist() == pytest.approx([-0.05, -0.10, 0.10])
    assert collapse_twins(rows)["predicted_peak_memory_gib"].iloc[0] == pytest.approx(72.0)


def test_signed_errors_name_a_missing_column() -> None:
    rows = pd.DataFrame([run(JOB_13B, 1, 1, "ok", 0.5, 0.5, True)])
    with pytest.raises(LayoutSearchError, match="no column 'headroom' to group by"):
        signed_errors(rows, "headroom")


def test_knob_effects_by_hand() -> None:
    def with_kernel(row: dict[str, object], attention: str) -> dict[str, object]:
        return {**row, "attention": attention}

    rows = pd.DataFrame([
        # Two twins at pp 1: flash2 measured 1.2x and 1.5x (geometric mean sqrt(1.8)),
        # predicted 1.1x both times.
        with_kernel(run(JOB_13B, 1, 1, "ok", 0.40, 0.50, True), "flash1"),
        run(JOB_13B, 1, 1, "ok", 0.48, 0.55, True),
        with_kernel(run(JOB_13B, 2, 1, "ok", 0.30, 0.40, True), "flash1"),
        run(JOB_13B, 2, 1, "ok", 0.45, 0.44, True),
        # One twin at pp 2, slower with flash2.
        with_kernel(run(JOB_13B, 1, 2, "ok", 0.50, 0.50, True), "flash1"),
        run(JOB_13B, 1, 2, "ok", 0.40, 0.60, True),
        # No twin: differs in micro-batch too; and a twin that went OOM.
        with_kernel(run(JOB_13B, 4, 1, "ok", 0.30, 0.30, True, mb=2), "flash1"),
        run(JOB_13B, 4, 1, "ok", 0.35, 0.35, True),
        with_kernel(run(JOB_13B, 2, 2, "ok", 0.30, 0.30, True), "flash1"),
        run(JOB_13B, 2, 2, "oom", None, 0.35, True),
        # Another job: its own row.
        with_kernel(run(JOB_30B, 1, 1, "ok", 0.40, 0.40, True), "flash1"),
        run(JOB_30B, 1, 1, "ok", 0.44, 0.40, True),
    ]).assign(recompute="none")
    effects = knob_effects(rows, "attention", "flash1", "flash2", by="pp")
    thirteen = effects[effects["model"] == "llama_13b"]
    assert thirteen["pp"].tolist() == [1, 2]
    assert thirteen["pairs"].tolist() == [2, 1]
    assert thirteen["measured_speedup"].tolist() == pytest.approx([1.8**0.5, 0.8])
    assert thirteen["predicted_speedup"].tolist() == pytest.approx([1.1, 1.2])
    overall = knob_effects(rows, "attention", "flash1", "flash2")
    assert "pp" not in overall.columns
    assert overall["pairs"].tolist() == [3, 1]
    assert overall["measured_speedup"].iloc[1] == pytest.approx(1.1)


def test_run_noise_by_hand() -> None:
    # Three flash1 -> flash2 twins at tp 1 (pp 1, 2, 4), all predicted x1.1; measured
    # x1.1 times e^+0.02, e^0 and e^-0.02. A constant error of the predicted effect would
    # cancel; the scatter left is two runs' noise: sqrt((0.02² + 0 + 0.02²) / (3 - 1) / 2).
    rows = []
    for pp, error in ((1, 0.02), (2, 0.0), (4, -0.02)):
        rows.append({**run(JOB_13B, 1, pp, "ok", 0.50, 0.50, True), "attention": "flash1"})
        rows.append(run(JOB_13B, 1, pp, "ok", 0.55 * np.exp(error), 0.55, True))
    noise = run_noise(pd.DataFrame(rows).assign(rmsnorm_kernel=True, recompute="none"))
    assert noise["twins"].tolist() == [3]
    assert noise["noise"].iloc[0] == pytest.approx(0.0002 ** 0.5)
    assert noise["noise_points"].iloc[0] == pytest.approx(100 * 0.0002 ** 0.5 * 0.55 * np.exp(0.02))
    # The same scatter around a model that is 10 % off on the switch: the same noise.
    rows = [{**r, "predicted_mfu": r["predicted_mfu"] * (1.1 if r["attention"] == "flash2"
                                                         else 1.0)} for r in rows]
    shifted = run_noise(pd.DataFrame(rows).assign(rmsnorm_kernel=True, recompute="none"))
    assert shifted["noise"].iloc[0] == pytest.approx(0.0002 ** 0.5)


def test_knob_effects_name_a_missing_column() -> None:
    rows = pd.DataFrame([run(JOB_13B, 1, 1, "ok", 0.5, 0.5, True)])
    with pytest.raises(LayoutSearchError, match="no column 'vpp'"):
        knob_effects(rows, "attention", "flash1", "flash2", by="vpp")
    with pytest.raises(LayoutSearchError, match="by='attention' is the knob switched"):
        knob_effects(rows, "attention", "flash1", "flash2", by="attention")


def sweep(measured: np.ndarray, predicted: np.ndarray) -> pd.DataFrame:
    """One job's ok rows, a layout each (tp × pp × micro-batch)."""
    layouts = [(tp, pp, mb) for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8) for mb in (1, 2, 4, 8)]
    return pd.DataFrame([run(JOB_13B, tp, pp, "ok", m, p, True, mb=mb) for (tp, pp, mb), m, p
                         in zip(layouts, measured, predicted, strict=False)])


def test_spearman_change_of_a_model_against_itself_is_exactly_zero() -> None:
    rows = sweep(np.linspace(0.3, 0.6, 20), np.linspace(0.3, 0.6, 20)[::-1] ** 2)
    assert spearman_change_interval(rows, rows) == (0.0, 0.0, 0.0)


def test_spearman_change_clear_on_many_rows_and_noise_on_few() -> None:
    rng = np.random.default_rng(1)
    measured = rng.uniform(0.3, 0.6, 64)
    good = sweep(measured, measured + rng.normal(0, 0.01, 64))   # ρ near 1
    poor = sweep(measured, measured + rng.normal(0, 0.15, 64))   # ρ near 0.5
    change, low, high = spearman_change_interval(poor, good)
    assert change > 0.3 and 0 < low < change < high
    # Six rows whose two models differ by one swapped neighbour pair: a change of
    # 6·2/(6·35) ≈ 0.057 in ρ, which six runs cannot tell from luck.
    six = np.array([0.30, 0.35, 0.40, 0.45, 0.50, 0.55])
    swapped = six[[0, 1, 3, 2, 4, 5]]
    change, low, high = spearman_change_interval(sweep(six, six), sweep(six, swapped))
    assert change == pytest.approx(-2 / 35)
    assert low < 0 <= high


def test_spearman_change_needs_the_same_rows_of_one_job(runs: pd.DataFrame) -> None:
    rows = sweep(np.linspace(0.3, 0.6, 8), np.linspace(0.3, 0.6, 8))
    with pytest.raises(LayoutSearchError, match="same measured rows"):
        spearman_change_interval(rows, rows.iloc[1:])
    with pytest.raises(LayoutSearchError, match="of one job"):
        spearman_change_interval(runs, runs)


def test_spearman_change_leaves_out_a_row_one_model_does_not_price() -> None:
    measured = np.array([0.30, 0.35, 0.40, 0.45, 0.50])
    reversed_first = np.array([0.50, 0.35, 0.40, 0.45, 0.30])  # swaps the ends
    unpriced_first = np.array([np.nan, 0.35, 0.40, 0.45, 0.30])
    # Five rows, ends swapped: d² = 16 + 16, ρ = 1 − 6·32/(5·24) = −0.6; the second model is exact.
    change, _, _ = spearman_change_interval(sweep(measured, reversed_first),
                                            sweep(measured, measured))
    assert change == pytest.approx(1.0 - (-0.6))
    # The four rows both price: predicted ranks 2, 3, 4, 1 against 1, 2, 3, 4, d² = 1+1+1+9,
    # ρ = 1 − 6·12/(4·15) = −0.2 (the first model, exact there, has ρ = 1).
    change, _, _ = spearman_change_interval(sweep(measured, measured),
                                            sweep(measured, unpriced_first))
    assert change == pytest.approx(-0.2 - 1.0)
