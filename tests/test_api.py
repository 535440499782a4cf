"""The public API: search() and predict() behaviour, and every bad input a user can give."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import layoutsearch
from layoutsearch import LayoutSearchError, ModelSpec, NoLayoutFitsWarning, predict, search
from layoutsearch.api import resolve_model
from layoutsearch.costs import ReplayCostModel
from layoutsearch.costs.constants import load_constants
from layoutsearch.layout import LAYOUT_COLUMNS
from layoutsearch.megatron import emit_megatron
from layoutsearch.paths import config_dir
from layoutsearch.results import job_of

JOB: dict[str, Any] = dict(model="llama_13b", cluster="a100_80gb", num_gpus=64,
                           seq_length=2048, global_batch_size=2048)


def raises_user_error(match: str, **arguments: Any) -> pytest.ExceptionInfo[LayoutSearchError]:
    """search(**JOB | arguments) fails with the user-facing error, raised by layoutsearch."""
    with pytest.raises(LayoutSearchError, match=match) as error:
        search(**{**JOB, **arguments})
    assert type(error.value) is LayoutSearchError
    # Raised by our own validation, not by pandas or numpy deep inside a formula.
    assert "/layoutsearch/" in str(error.traceback[-1].path)
    return error


@pytest.fixture(scope="module")
def ranked() -> pd.DataFrame:
    return search(**JOB)


# search(): the ranked table

def test_result_has_the_documented_columns(ranked: pd.DataFrame) -> None:
    expected = [*LAYOUT_COLUMNS, "mfu", "step_time_s", "tokens_per_s", "peak_memory_gib",
                "headroom_gib", "fits", "reason"]
    assert list(ranked.columns[: len(expected)]) == expected
    assert any(c.startswith("time_") and c.endswith("_s") for c in ranked.columns)
    assert any(c.startswith("memory_") and c.endswith("_gib") for c in ranked.columns)
    assert len(ranked) == 2240  # the paper space for 64 GPUs (see test_space.py)
    assert list(ranked.index) == list(range(len(ranked)))


def test_result_is_sorted_feasible_first_by_mfu(ranked: pd.DataFrame) -> None:
    fits = ranked["fits"].to_numpy()
    assert fits.any() and not fits.all()
    first_infeasible = int(np.argmin(fits))
    assert fits[:first_infeasible].all() and not fits[first_infeasible:].any()
    feasible_mfu = ranked.loc[ranked["fits"], "mfu"].to_numpy()
    assert (np.diff(feasible_mfu) <= 0).all()
    assert (ranked.loc[ranked["fits"], "reason"] == "").all()
    assert (ranked.loc[~ranked["fits"], "reason"] != "").all()  # infeasible rows say why
    assert (ranked["tokens_per_s"].dropna() > 0).all()


def test_infeasible_rows_keep_rule_reasons(ranked: pd.DataFrame) -> None:
    row = ranked[(ranked["tp"] == 8) & (ranked["pp"] == 16)].iloc[0]
    assert not row["fits"]
    assert "tp·pp·cp (128) must divide num_gpus (64)" in row["reason"]
    assert np.isnan(row["mfu"])  # rule-breaking rows are never priced


def test_overrides_pin_knobs_and_change_model_fields(ranked: pd.DataFrame) -> None:
    pinned = search(**JOB, tp=2, attention=["flash2", "fused"])
    assert set(pinned["tp"]) == {2} and set(pinned["attention"]) == {"flash2", "fused"}
    bigger = search(**JOB, vocab_size=128000)
    assert (bigger["vocab_size"] == 128000).all()
    keys = list(LAYOUT_COLUMNS)
    both = ranked.merge(bigger, on=keys, suffixes=("", "_big"))
    priced = both["peak_memory_gib"].notna()
    assert (both.loc[priced, "peak_memory_gib_big"] > both.loc[priced, "peak_memory_gib"]).all()


def test_search_takes_specs_and_space_mappings() -> None:
    model = layoutsearch.load_model("llama_13b")
    result = search(**{**JOB, "model": model},
                    search_space={"tp": [1, 2], "pp": [1], "micro_batch_size": [1],
                                  "attention": ["flash2"], "recompute": ["none"]})
    # 2 tp x 2 sp x 2 rmsnorm, minus the sp twin at tp 1 for each rmsnorm value.
    assert len(result) == 2 * 2 * 2 - 2
    assert result.attrs["message"] == "" and job_of(result, "test").model == model


def test_nothing_fits_warns_with_a_suggestion() -> None:
    with pytest.warns(NoLayoutFitsWarning, match=r"no layout fits.*use at least") as record:
        result = search(model="llama3_405b", cluster="a100_80gb", num_gpus=8,
                        seq_length=2048, global_batch_size=64)
    assert not result["fits"].any()
    assert result.attrs["message"] == str(record[0].message)
    # The space already allows recompute=full: the message must not suggest it.
    assert "allow recompute=full" not in result.attrs["message"]
    # Weights, gradients and Adam state alone need 128 GPUs at the paper space's tp8 pp16;
    # on 128 a layout fits, so the count is no more than needed.
    assert result.attrs["message"].endswith(
        "; use at least 128 GPUs (the weights, gradients and optimizer state alone fit from "
        "there, at tp·pp=128 with the distributed optimizer; activations need more) or GPUs "
        "with more memory")
    assert search(model="llama3_405b", cluster="a100_80gb", num_gpus=128, seq_length=2048,
                  global_batch_size=64)["fits"].any()


def test_nothing_fits_names_only_fixes_that_make_the_smallest_layout_fit() -> None:
    # 65B at 32k on 16 GPUs: the smallest layout, tp8 pp2, has dp = 1, so a distributed
    # optimizer shards nothing, and cp has no GPUs left to take.
    with pytest.warns(NoLayoutFitsWarning):
        stuck = search(model="llama_65b", num_gpus=16, seq_length=32768, global_batch_size=256,
                       max_position_embeddings=32768, distributed_optimizer=False)
    assert "distributed_optimizer" not in stuck.attrs["message"]
    assert "context parallelism" not in stuck.attrs["message"]
    assert stuck.attrs["message"].endswith("use more GPUs or GPUs with more memory")
    # 13B at 16k with torch attention: FlashAttention or recompute alone bring it under.
    with pytest.warns(NoLayoutFitsWarning):
        heavy = search(model="llama_13b", num_gpus=8, seq_length=16384, global_batch_size=64,
                       max_position_embeddings=16384, tp=8, pp=1, micro_batch_size=1,
                       attention="torch", recompute="none")
    assert heavy.attrs["message"].endswith(
        "; use more GPUs or GPUs with more memory, or allow recompute=full, or allow "
        "FlashAttention (attention=flash2)")


def test_when_no_layout_passes_the_rules_the_message_names_tp_pp_that_would() -> None:
    # tp=16 on 8 GPUs breaks two rules; with the paper space's other settings, the tp×pp
    # whose product divides 8 (and 40 heads divide by tp) pass, smallest first.
    with pytest.warns(NoLayoutFitsWarning, match=r"no layout passes the rules"):
        result = search(model="llama_13b", num_gpus=8, seq_length=2048, global_batch_size=64,
                        tp=[16])
    assert result.attrs["message"].endswith(
        "with the space's other settings these tp×pp pass: 1×1, 1×2, 2×1, 1×4, 2×2, 4×1, "
        "1×8, 2×4, 4×2, 8×1 (set tp and pp to them)")


def test_a_global_batch_no_layout_can_divide() -> None:
    # 256 GPUs: tp·pp is at most 8·16 = 128, so dp >= 2 and 3 sequences never split evenly;
    # the nearest batches that do are 2 (dp 2, mb 1) and 4.
    raises_user_error(r"global_batch_size=3: no layout of the space divides it .* "
                      r"micro_batch_size·dp is at least 2 here\); use 2 or 4",
                      **{**JOB, "num_gpus": 256, "global_batch_size": 3})


def test_a_batch_that_some_layouts_divide_only_rejects_the_others() -> None:
    # 6 sequences on 64 GPUs: only dp ∈ {1, 2} (tp·pp ≥ 32) with mb 1, 2 or 3 split them.
    result = search(**{**JOB, "global_batch_size": 6})
    rejected = result["reason"].str.contains(r"global_batch_size \(6\) must divide")
    assert rejected.any() and not rejected.all()
    assert (result.loc[~rejected, "dp"] <= 2).all()


def test_a_feasible_search_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoLayoutFitsWarning)
        result = search(**JOB, tp=1, pp=1, micro_batch_size=1, attention="flash2")
    # 2 RMSNorm kernels x 2 recomputes (no SP twin at tp 1), every one fitting: no message.
    assert len(result) == 4 and result["fits"].all() and result.attrs["message"] == ""


def test_close_runners_up_of_the_analytic_model_get_a_note(ranked: pd.DataFrame) -> None:
    # LLaMA 13B on 64 A100s: six fitting layouts within 5 % of the best's predicted MFU, three
    # of them flash1 ones, which no current Megatron-LM command runs (a measured search
    # passes over them): three to name, four to measure.
    fitting = ranked[ranked["fits"]]
    close = fitting[fitting["mfu"] >= 0.95 * fitting["mfu"].iloc[0]]
    assert len(close) == 7 and (close["attention"] == "flash1").sum() == 3
    note = ranked.attrs["close_call_note"]
    assert note.startswith("3 other layouts are within 5 % of the best's predicted MFU (the "
                           "next: tp1 pp2 dp32 mb2 flash2+rmsnorm")
    # 64 GPUs are 8 nodes: the local launcher runs one, so the command asks for Slurm.
    assert note.endswith("cost_models.prescreen=analytic cost_models.top_k=4 "
                         "cost_models.launcher=slurm.")
    one_node = search(model="llama_7b", num_gpus=8, seq_length=2048, global_batch_size=64)
    assert one_node.attrs["close_call_note"].endswith("cost_models.top_k=2.")
    pinned = search(**JOB, tp=1, pp=1, micro_batch_size=1, attention="flash2",
                    rmsnorm_kernel=True, recompute="none")
    assert pinned.attrs["close_call_note"] == ""  # one layout left: nothing to call


def test_the_close_call_note_names_the_constants_that_ranked(tmp_path: Path) -> None:
    prior = search(**JOB, cost_model="analytic_prior")
    assert "cost_models.prescreen=analytic_prior " in prior.attrs["close_call_note"]
    own = tmp_path / "mine.yaml"
    shipped = config_dir("cost_models") / "analytic.yaml"
    own.write_text(shipped.read_text().replace("gemm_efficiency: 0.752", "gemm_efficiency: 0.7"))
    mine = search(**JOB, cost_model=own)
    assert f"cost_models.prescreen={own} " in mine.attrs["close_call_note"]


def test_measured_mfus_get_no_close_call_note(tmp_path: Path,
                                              measurement_row: dict[str, Any]) -> None:
    # Two measured layouts 1 % apart: the replay ranks by measurement, no model error.
    runs = pd.DataFrame([{**measurement_row, "distributed_optimizer": True},
                         {**measurement_row, "distributed_optimizer": True, "tp": 4, "dp": 16,
                          "mfu": 0.594, "step_time_s": 30.3}])
    runs.to_csv(tmp_path / "runs.csv", index=False)
    replayed = search(**JOB, vocab_size=32000, tp=[2, 4], pp=1, micro_batch_size=1,
                      attention="flash2", rmsnorm_kernel=True, recompute="none",
                      sequence_parallel=False,
                      cost_model=ReplayCostModel.load(tmp_path / "runs.csv"))
    assert replayed["fits"].sum() == 2
    assert replayed.attrs["close_call_note"] == ""


# search(): bad input

@pytest.mark.parametrize(
    ("argument", "value", "closest"),
    [("model", "llama13b", "llama_13b"), ("cluster", "a100_80", "a100_80gb"),
     ("search_space", "papr", "paper"), ("driver", "gird", "grid")],
)
def test_unknown_names_list_valid_ones(argument: str, value: str, closest: str) -> None:
    error = raises_user_error(rf"unknown .*'{value}'; did you mean '{closest}'\? valid ",
                              **{argument: value})
    assert closest in str(error.value).split("valid")[-1]


@pytest.mark.parametrize(
    ("argument", "value"),
    [("model", 13), ("model", None), ("cluster", 8), ("search_space", ["tp"]),
     ("cost_model", 5), ("driver", ["grid"]), ("driver", 1)],
)
def test_arguments_of_the_wrong_type(argument: str, value: object) -> None:
    raises_user_error(re.escape(f"{argument}={value!r}: must be a"), **{argument: value})


def test_predict_takes_a_frame_or_a_path() -> None:
    with pytest.raises(LayoutSearchError, match=r"predict: frame=5 must be a pandas DataFrame"):
        predict(5)  # type: ignore[arg-type]


def test_a_misspelt_driver_setting_gets_the_closest_name() -> None:
    raises_user_error(r"unknown driver=optuna setting 'ntrials'; did you mean 'n_trials'\?",
                      driver={"name": "optuna", "ntrials": 5})
    raises_user_error(r"driver=grid takes no settings, got 'n_trials'",
                      driver={"name": "grid", "n_trials": 5})


def test_unknown_cost_model() -> None:
    raises_user_error(r"unknown cost model 'nope'.*analytic", cost_model="nope")


@pytest.mark.parametrize("field", ["num_gpus", "seq_length", "global_batch_size"])
@pytest.mark.parametrize("value", [0, -64, 64.0, "64"])
def test_job_sizes_must_be_positive_integers(field: str, value: object) -> None:
    raises_user_error(rf"^{field}={value!r}: must be a positive integer", **{field: value})


def test_a_size_beyond_2_53_is_refused_before_the_search() -> None:
    # It overflowed the candidate table's int64 columns deep inside pandas.
    raises_user_error(r"^num_gpus=10{30}: must be a positive integer of at most 2\*\*53",
                      num_gpus=10**30)


def test_gpus_must_fill_whole_nodes() -> None:
    raises_user_error(r"^num_gpus=12: must be a whole number of nodes of 8 GPUs.*try 8 or 16",
                      num_gpus=12)


def test_model_shapes_are_checked() -> None:
    with pytest.raises(LayoutSearchError, match=r"hidden_size \(1000\) must divide by "
                                                r"num_attention_heads \(16\)"):
        ModelSpec(name="odd", num_layers=4, hidden_size=1000, ffn_hidden_size=4000,
                  num_attention_heads=16, vocab_size=32000)
    raises_user_error(r"hidden_size \(5121\) must divide by num_attention_heads \(40\)",
                      hidden_size=5121)
    raises_user_error(r"vocab_size=0: must be a positive integer", vocab_size=0)


def test_unknown_override_names_the_closest_and_lists_fields_and_knobs() -> None:
    error = raises_user_error(r"unknown override vocab=128000: not a model field nor a knob; "
                              r"did you mean 'vocab_size'\? model fields: ", vocab=128000)
    assert "micro_batch_size" in str(error.value)
    raises_user_error(r"unknown override dp=2: not a model field nor a knob; dp follows from "
                      r"num_gpus / \(tp·pp·cp\)", dp=2)


@pytest.mark.parametrize(
    ("pin", "message"),
    [({"tp": 0}, r"search space tp=0: must be a positive integer"),
     ({"attention": "flash9"}, r"unknown attention 'flash9'"),
     ({"recompute": ["sometimes"]}, r"unknown recompute 'sometimes'")],
)
def test_bad_knob_values(pin: dict[str, Any], message: str) -> None:
    raises_user_error(message, **pin)


def test_bad_search_space_mapping() -> None:
    raises_user_error(r"unknown knob 'dp'", search_space={"dp": [1, 2]})


# predict()

@pytest.fixture
def measured(measurement_row: dict[str, Any]) -> pd.DataFrame:
    rows = [
        measurement_row,
        {**measurement_row, "tp": 8, "pp": 8, "dp": 1, "status": "oom", "step_time_s": None,
         "mfu": None},  # all 64 GPUs model-parallel, dp 1
        {**measurement_row, "tp": 4, "dp": 16, "attention": "fused", "micro_batch_size": 2},
        {**measurement_row, "tp": 8, "dp": 8, "attention": "flash3", "note": "extra"},
    ]
    return pd.DataFrame(rows, index=[10, 11, 12, 13])


def test_predict_adds_columns_and_changes_nothing(measured: pd.DataFrame) -> None:
    given = measured.copy()
    out = predict(measured)
    pd.testing.assert_frame_equal(measured, given)  # the input is not mutated
    pd.testing.assert_frame_equal(out[list(given.columns)], given)  # nor are its columns
    new = [c for c in out.columns if c not in given.columns]
    assert new[:4] == ["predicted_mfu", "predicted_step_time_s", "predicted_peak_memory_gib",
                       "predicted_fits"]
    assert out["predicted_fits"].dtype == bool
    # flash3 on an A100 breaks a rule: not fitting, and the reason says why.
    assert not out.loc[13, "predicted_fits"]
    assert "flash3 needs a Hopper GPU" in out.loc[13, "predicted_reason"]
    assert out.loc[10, "predicted_mfu"] > 0


def test_predict_prices_layouts_not_run_yet(tmp_path: Path, measurement_row) -> None:
    # A search's rows carry predictions, not measurements: priced again by the same model
    # they get the same figures, and by another its own.
    ranked = search(**JOB).head(5)
    again = predict(ranked)
    np.testing.assert_allclose(again["predicted_mfu"], ranked["mfu"])
    np.testing.assert_allclose(again["predicted_peak_memory_gib"], ranked["peak_memory_gib"])
    assert again["predicted_fits"].tolist() == ranked["fits"].tolist()
    assert not np.allclose(predict(ranked, cost_model="analytic_prior")["predicted_mfu"],
                           ranked["mfu"])
    # A planned layout has no outcome columns at all.
    planned = {k: v for k, v in measurement_row.items()
               if k not in ("status", "step_time_s", "mfu")}
    path = tmp_path / "planned.csv"
    pd.DataFrame([planned]).to_csv(path, index=False)
    out = predict(path)
    assert "status" not in out.columns and 0.3 < out["predicted_mfu"].iloc[0] < 0.8
    # A run's outcome is whole: a status without its figures is a measurement row missing
    # them, named.
    with pytest.raises(LayoutSearchError, match=r"missing required column\(s\) step_time_s, "
                                                r"mfu"):
        predict(pd.DataFrame([{**planned, "status": "ok"}]))


def test_predict_again_replaces_its_own_columns(measured: pd.DataFrame) -> None:
    once = predict(measured)
    slower = {"_target_": "layoutsearch.costs.analytic.AnalyticCostModel",
              "gpus": {"a100_80gb": {**load_constants("analytic")["a100_80gb"].to_dict(),
                                     "gemm_efficiency": 0.3}}}
    again = predict(once, cost_model=slower)  # a notebook cell run again with other constants
    assert list(again.columns) == list(once.columns)
    assert again.loc[10, "predicted_mfu"] < once.loc[10, "predicted_mfu"]


def test_predict_reads_a_file(tmp_path: Path, measured: pd.DataFrame) -> None:
    path = tmp_path / "runs.csv"
    measured.to_csv(path, index=False)
    out = predict(path)
    assert len(out) == len(measured)
    assert list(out["tp"]) == list(measured["tp"])
    np.testing.assert_allclose(out["predicted_mfu"], predict(measured)["predicted_mfu"])


def test_predict_names_row_and_column_of_a_bad_value(measured: pd.DataFrame) -> None:
    measured = measured.astype({"micro_batch_size": object})
    measured.loc[12, "micro_batch_size"] = "two"
    with pytest.raises(LayoutSearchError,
                       match=r"frame: index 12, column 'micro_batch_size': 'two' is not a "):
        predict(measured)
    with pytest.raises(LayoutSearchError, match=r"measurement file '/no/such.csv' does not exist"):
        predict("/no/such.csv")


@pytest.mark.parametrize(("clusters", "named"), [
    (["a100_80gb"], r"clusters=\['a100_80gb'\]"),
    ({"a100_80gb": "a100_80gb"}, r"clusters\['a100_80gb'\]='a100_80gb'"),
    ({}, r"clusters=\{\}"),
])
def test_predict_clusters_must_map_gpu_names_to_cluster_specs(
    measured: pd.DataFrame, clusters: Any, named: str
) -> None:
    with pytest.raises(LayoutSearchError, match=rf"predict: {named}: must be a mapping of GPU "
                                                r"names to ClusterSpecs"):
        predict(measured, clusters=clusters)


def test_predict_unknown_gpu(measured: pd.DataFrame) -> None:
    measured.loc[11, "gpu"] = "b300"
    with pytest.raises(LayoutSearchError, match=r"unknown gpu 'b300'"):
        predict(measured)


def test_fitting_rows_carry_their_megatron_arguments(ranked: pd.DataFrame) -> None:
    top = ranked.iloc[0]
    assert top["fits"]
    assert f"--tensor-model-parallel-size {top['tp']} " in top["megatron_args"]
    assert f"--pipeline-model-parallel-size {top['pp']} " in top["megatron_args"]
    fits = ranked["fits"].astype(bool)
    best = ranked.index[fits][: layoutsearch.api.MEGATRON_ARGS_ROWS]
    assert (ranked.loc[best, "megatron_args"] != "").all()
    assert (~fits).any() and (ranked.loc[~fits, "megatron_args"] == "").all()


def test_a_ranking_saved_as_parquet_keeps_its_job_and_settings(tmp_path: Path) -> None:
    # DataFrame.to_parquet writes attrs as JSON: a Job object in them would fail it.
    settings = {"megatron_path": str(tmp_path), "extra_args": ["--seed", "7"]}
    ranked = search(**JOB, tp=[1, 2], megatron=settings)
    ranked.to_parquet(tmp_path / "ranked.parquet")
    back = pd.read_parquet(tmp_path / "ranked.parquet")
    assert job_of(back, "test") == job_of(ranked, "test")
    assert job_of(back, "test").model == resolve_model("llama_13b")
    assert layoutsearch.report(back, tmp_path / "report").is_file()
    emit_megatron(back, tmp_path / "run", top_k=2)
    script = sorted((tmp_path / "run" / "megatron").glob("*.sh"))[0].read_text()
    assert "--seed 7" in script and str(tmp_path) in script
    # A job without its settings (set by hand) gets the shipped ones.
    del back.attrs["megatron_settings"]
    emit_megatron(back, tmp_path / "shipped", top_k=1)
    assert "--seed" not in next((tmp_path / "shipped" / "megatron").glob("*.sh")).read_text()
    bare = back.copy()
    bare.attrs.clear()  # as pd.concat leaves it
    with pytest.raises(LayoutSearchError, match=r"^report\(result\): the frame's "
                                                r"attrs\['job'\] is missing"):
        layoutsearch.report(bare, tmp_path / "x")


def test_megatron_arguments_follow_the_megatron_settings_given(tmp_path: Path) -> None:
    settings = {"megatron_path": str(tmp_path), "extra_args": ["--no-gradient-accumulation-fusion"]}
    ranked = search(**JOB, tp=1, pp=1, megatron=settings)
    assert ranked.loc[0, "megatron_args"].endswith(" --no-gradient-accumulation-fusion")
    plain = search(**JOB, tp=1, pp=1)
    assert "--no-gradient-accumulation-fusion" not in plain.loc[0, "megatron_args"]
    with pytest.raises(LayoutSearchError, match=r"unknown Megatron-LM settings 'megatrom'"):
        search(**JOB, megatron="megatrom")


def test_a_close_call_suggests_measuring_with_the_settings_named(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(f"megatron_path: {tmp_path}\nextra_args: [--seed, '7']\n")
    study = {**JOB, "vocab_size": 128000}  # its runners-up are within 5 %
    note = search(**study, megatron=str(site)).attrs["close_call_note"]
    assert note.endswith(f"cost_models.launcher=slurm cost_models.megatron={site}.")
    assert "cost_models.megatron" not in search(**study).attrs["close_call_note"]


def test_megatron_arguments_are_built_for_the_best_fitting_rows_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layoutsearch.api, "MEGATRON_ARGS_ROWS", 3)
    ranked = search(**JOB)
    assert list(ranked.index[ranked["megatron_args"] != ""]) == [0, 1, 2]
    assert ranked["fits"].sum() > 3


def test_a_ranking_on_the_study_fabric_says_so() -> None:
    job = {"model": "llama_13b", "num_gpus": 64, "seq_length": 2048, "global_batch_size": 2048}
    fitted = search(**job)
    assert fitted.attrs["fabric_note"].startswith("cost_models=analytic prices inter-node")
    assert search(**job, cost_model="analytic_prior").attrs["fabric_note"] == ""
    assert fitted.attrs["mfu_convention_note"] == ""  # 2k tokens
