"""The analytic cost model as a plug-in: constants per GPU kind, errors, fidelity guard."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import layoutsearch
from layoutsearch.catalog import cluster_names, clusters_by_gpu, load_cluster
from layoutsearch.costs import analytic, build_cost_model, distinct
from layoutsearch.costs.base import PREDICTION_COLUMNS
from layoutsearch.costs.constants import AnalyticConstants, load_constants
from layoutsearch.costs.shapes import Shapes
from layoutsearch.errors import LayoutSearchError
from layoutsearch.fidelity import collapse_twins, fidelity
from layoutsearch.measurements import read_measurements
from layoutsearch.notes import TIGHT_HEADROOM_GIB, TIGHT_HEADROOM_OTHER_KERNELS_GIB
from tests.costs.builders import score, table
from tests.study_runs import STUDY_RUNS, needs_study_runs


def test_every_catalog_gpu_has_constants() -> None:
    constants = load_constants("analytic")
    for name in cluster_names():
        assert load_cluster(name).gpu.name in constants


def test_scores_carry_the_prediction_columns_and_reasons() -> None:
    rows = score(micro_batch_size=[1, 8], tp=1)
    assert set(PREDICTION_COLUMNS) <= set(rows.columns)
    too_big = rows[~rows["fits"]]
    assert len(too_big) == 1
    assert too_big["cost_reason"].iloc[0].startswith("needs ")
    assert too_big["cost_reason"].iloc[0].endswith("GiB > 80.0 GiB per GPU")
    assert rows.loc[rows["fits"], "cost_reason"].eq("").all()


@pytest.mark.parametrize("model_fields", [
    {"vocab_size": 2**53},
    {"hidden_size": 40 * 2**35, "ffn_hidden_size": 2**40},
])
def test_an_absurd_size_still_reports_the_memory_it_needs(model_fields: dict[str, int]) -> None:
    # A 2**53 vocabulary needs ~4e11 GiB per GPU, past the packed key of (peak, limit); a
    # hidden size of 40 x 2**35 ~2e18 GiB, past what an int64 of tenths holds.
    row = score(model_fields=model_fields).iloc[0]
    needs = float(row["cost_reason"].split()[1])
    assert needs == pytest.approx(row["peak_memory_gib"], rel=1e-9)
    assert row["cost_reason"].endswith("GiB > 80.0 GiB per GPU")


def test_memory_reasons_name_a_peak_that_is_not_finite() -> None:
    reasons = analytic._memory_reasons(np.array([np.inf, 90.04, np.nan]), np.full(3, 80.0),
                                       np.array([False, False, False]), pd.RangeIndex(3))
    assert list(reasons) == ["needs inf GiB > 80.0 GiB per GPU",
                             "needs 90.0 GiB > 80.0 GiB per GPU",
                             "needs nan GiB > 80.0 GiB per GPU"]


def test_hopper_is_faster_than_ampere_and_h200_fits_more() -> None:
    a100 = score(cluster="a100_80gb", tp=1, micro_batch_size=[1, 2]).set_index("micro_batch_size")
    h100 = score(cluster="h100_sxm", tp=1, micro_batch_size=[1, 2]).set_index("micro_batch_size")
    h200 = score(cluster="h200", tp=1, micro_batch_size=[1, 2]).set_index("micro_batch_size")
    assert h100.loc[1, "step_time_s"] < a100.loc[1, "step_time_s"]
    assert not h100.loc[2, "fits"] and h200.loc[2, "fits"]


def test_a_constant_out_of_range_or_missing_is_named() -> None:
    good = load_constants("analytic")["a100_80gb"].to_dict()
    with pytest.raises(LayoutSearchError,
                       match=r"^test\.gemm_efficiency=-1: must be a fraction in \(0, 1\]$"):
        AnalyticConstants.from_dict({**good, "gemm_efficiency": -1}, "test")
    missing = {k: v for k, v in good.items() if k != "logit_bytes"}
    # Only the mistake made is named: no "unknown constant(s) []" beside the missing one.
    with pytest.raises(LayoutSearchError, match=r"^test: missing constant\(s\) logit_bytes$"):
        AnalyticConstants.from_dict(missing, "test")
    misspelt = {**missing, "logit_byte": 4}
    with pytest.raises(LayoutSearchError, match=r"^test: unknown constant\(s\) logit_byte; "
                                                r"missing constant\(s\) logit_bytes$"):
        AnalyticConstants.from_dict(misspelt, "test")
    # A zero or above-one efficiency would price a step infinite or faster than peak.
    for name, value, rule in [("gemm_efficiency", 0, r"a fraction in \(0, 1\]"),
                              ("network_efficiency", 1.5, r"a fraction in \(0, 1\]"),
                              ("logit_bytes", 0, "a finite number > 0"),
                              ("logits_sharded_by_tp", 0.5, "0 or 1"),
                              # Infinite: every layout at MFU 0, or out of memory.
                              ("kernel_overhead_s", float("inf"), "a finite number >= 0"),
                              ("activation_memory_factor", float("inf"),
                               "a finite number > 0"),
                              ("memory_overhead_gib", float("nan"), "a finite number >= 0"),
                              # No command reduces gradients at 3 bytes: bf16 (2) or fp32 (4).
                              ("gradient_bytes", 3, "2 or 4"),
                              ("gemm_efficiency", "0.7", "a number")]:
        with pytest.raises(LayoutSearchError, match=rf"test\.{name}={value!r}: must be {rule}"):
            AnalyticConstants.from_dict({**good, name: value}, "test")
    assert AnalyticConstants.from_dict({**good, "kernel_overhead_s": 0}, "test")


def test_a_gpu_without_constants_is_named() -> None:
    config = {"_target_": "layoutsearch.costs.analytic.AnalyticCostModel",
              "gpus": {"h100_sxm": load_constants("analytic")["h100_sxm"].to_dict()}}
    model = build_cost_model(config)
    with pytest.raises(LayoutSearchError, match=r"has no constants for GPU kind\(s\) a100_80gb; "
                                                r"it covers h100_sxm\. Add them to a copy of "
                                                r"cost_models/analytic_prior\.yaml"):
        model.score(table(), layoutsearch.catalog.clusters_by_gpu())


@needs_study_runs
def test_fidelity_on_the_study_runs_stays_at_its_measured_level() -> None:
    # A guard against regressions of the shipped constants; benchmarks/fidelity.py prints
    # the full table. Thresholds sit just under what the fitted model reaches.
    _, summary = fidelity(layoutsearch.predict(STUDY_RUNS))
    assert summary["fit_accuracy"] >= 0.97
    assert summary["min_spearman"] >= 0.90
    assert summary["mape"] <= 0.06
    assert summary["top3_hits"] == summary["groups"]


@needs_study_runs
def test_the_headroom_notes_figures_are_those_of_the_study_runs() -> None:
    # The headroom note tells a user how far from the limit a predicted fit ran out of
    # memory on the study's runs, by attention kernel: those figures must be the data's.
    predicted = collapse_twins(layoutsearch.predict(STUDY_RUNS))
    memory = predicted["gpu"].map(lambda gpu: clusters_by_gpu()[gpu].gpu.memory_gib)
    headroom = memory - predicted["predicted_peak_memory_gib"]
    wasted = predicted["predicted_fits"].astype(bool) & (predicted["status"] == "oom")
    flash = predicted["attention"].str.startswith("flash")
    assert wasted[flash].any() and wasted[~flash].any()
    assert headroom[wasted & flash].max() < TIGHT_HEADROOM_GIB
    assert np.ceil(headroom[wasted & ~flash].max()) == TIGHT_HEADROOM_OTHER_KERNELS_GIB


def test_the_megatron_settings_are_not_a_cost_model() -> None:
    with pytest.raises(LayoutSearchError, match=r"^megatron: these are the Megatron-LM backend's "
                                                r"settings .*not a cost model; launch layouts "
                                                r"with cost_models=measured"):
        build_cost_model("megatron")


def test_config_name_finds_the_shipped_constants_and_passes_over_other_files(
        tmp_path: Path) -> None:
    import layoutsearch.costs.analytic as analytic
    from layoutsearch.paths import config_dir, config_folders
    shipped = build_cost_model("analytic")
    prior = build_cost_model("analytic_prior")
    assert isinstance(shipped, analytic.AnalyticCostModel)
    assert isinstance(prior, analytic.AnalyticCostModel)
    assert (shipped.config_name(), prior.config_name()) == ("analytic", "analytic_prior")
    # A user's config folder with broken or foreign files beside a fit of their own.
    mine = tmp_path / "cost_models"
    mine.mkdir()
    (mine / "aaa_broken.yaml").write_text("gpus: [unclosed\n")
    (mine / "aab_list.yaml").write_text("- 1\n- 2\n")
    (mine / "aac_empty.yaml").write_text(
        "_target_: layoutsearch.costs.analytic.AnalyticCostModel\n")
    text = (config_dir("cost_models") / "analytic.yaml").read_text()
    (mine / "my_fit.yaml").write_text(text.replace("gemm_efficiency: 0.752",
                                                   "gemm_efficiency: 0.7", 1))
    with config_folders([tmp_path]):
        fit = build_cost_model("my_fit")
        assert isinstance(fit, analytic.AnalyticCostModel)
        assert (shipped.config_name(), fit.config_name()) == ("analytic", "my_fit")
        (mine / "my_fit.yaml").unlink()
        assert fit.config_name() is None  # read anew: a deleted config is not named


def test_other_gpu_kinds_carry_over_to_a_published_megatron_run() -> None:
    # Megatron-LM's README strong-scales GPT-3 175B (131,072-token vocabulary, 4,096 tokens,
    # batch 1,152) on H100: 47 % MFU on 96 GPUs, 42 % on 4,608. No constant was fitted to it.
    best = {}
    for gpus in (96, 4608):
        ranked = layoutsearch.search(
            model="gpt3_175b", vocab_size=131072, max_position_embeddings=4096,
            cluster="h100_sxm", num_gpus=gpus, seq_length=4096, global_batch_size=1152,
            search_space="default", cp=[1], attention=["flash3"], sequence_parallel=[True])
        best[gpus] = ranked[ranked["fits"]]["mfu"].iloc[0]
    assert best[96] == pytest.approx(0.47, abs=0.03)
    assert best[4608] == pytest.approx(0.42, abs=0.06)


PUBLISHED_RUNS = Path(__file__).parents[2] / "benchmarks" / "published_runs.csv"
# MFU as the sources print it, row by row: Korthikanti et al. 2022 (Table 5: full recompute,
# then SP + selective, for 22B, 175B, 530B, 1T; §6.3: 530B on 2,240 GPUs) and MegaScale
# (Table 2, Megatron-LM at 256 ... 12,288 GPUs). Korthikanti prints no MFU for full recompute.
PUBLISHED_MFU = [None, 0.415, None, 0.514, None, 0.560, None, 0.563, 0.542,
                 0.530, 0.499, 0.467, 0.447, 0.487, 0.478, 0.433, 0.412]


def test_the_studys_mfu_formula_gives_the_mfu_published_for_other_runs() -> None:
    runs = read_measurements(PUBLISHED_RUNS)
    mfu = Shapes.of(runs, clusters_by_gpu()).mfu(runs["step_time_s"].to_numpy())
    assert len(runs) == len(PUBLISHED_MFU)
    for ours, published in zip(mfu, PUBLISHED_MFU, strict=True):
        if published is not None:
            assert ours == pytest.approx(published, abs=0.002)
    assert runs["mfu"].to_numpy() == pytest.approx(mfu, abs=1e-4)  # the file's column


def test_the_a_priori_constants_price_published_runs_no_one_fitted_them_to() -> None:
    # benchmarks/published_runs.py prints the table; these are its bounds as measured.
    runs = read_measurements(PUBLISHED_RUNS)
    prior = layoutsearch.predict(runs, cost_model="analytic_prior")
    assert prior["predicted_fits"].all()  # every one of them ran
    error = prior["predicted_step_time_s"] / runs["step_time_s"] - 1
    assert error.abs().max() < 0.25
    # Full recompute against SP + selective recompute, same layout: x1.29-1.32 measured.
    full, selective = runs["recompute"] == "full", runs["recompute"] == "selective"
    for model in ("gpt_22b", "gpt3_175b", "mtnlg_530b", "gpt_1t"):
        pair = (runs["model"] == model) & (runs["dp"] == 1)
        measured = (runs.loc[pair & full, "step_time_s"].iloc[0]
                    / runs.loc[pair & selective, "step_time_s"].iloc[0])
        predicted = (prior.loc[pair & full, "predicted_step_time_s"].iloc[0]
                     / prior.loc[pair & selective, "predicted_step_time_s"].iloc[0])
        assert predicted == pytest.approx(measured, rel=0.06)


@pytest.mark.parametrize("config, got", [
    ({}, "got none"), ({"gpus": []}, "got gpus=[]")])
def test_an_analytic_config_without_constants_says_where_to_start(config, got) -> None:
    with pytest.raises(LayoutSearchError, match=f"needs a 'gpus' mapping of GPU kind -> "
                       f"constants, {re.escape(got)}; start from a copy of "
                       r"cost_models/analytic.yaml"):
        layoutsearch.search(model="llama_7b", num_gpus=8, seq_length=2048,
                            global_batch_size=64, cost_model={
                                "_target_": "layoutsearch.costs.analytic.AnalyticCostModel",
                                **config})


def test_constants_of_a_gpu_kind_that_are_no_mapping_are_named() -> None:
    with pytest.raises(LayoutSearchError, match=r"gpus.a100_80gb=3: must be a mapping of "
                                                r"constant name -> value"):
        layoutsearch.search(model="llama_7b", num_gpus=8, seq_length=2048,
                            global_batch_size=64, cost_model={
                                "_target_": "layoutsearch.costs.analytic.AnalyticCostModel",
                                "gpus": {"a100_80gb": 3}})


def test_a_layout_priced_alone_gets_the_same_bits_as_in_a_whole_table() -> None:
    # A sampling driver prices one row at a time; summed in another order for one row than
    # for many, its step time differed from the grid's in the last bits, and a ranking,
    # which sorts by MFU, could break a tie the other way.
    rows = table(tp=[1, 2, 4], pp=[1, 2, 4], micro_batch_size=[1, 2],
                 attention=["torch", "flash2"], recompute=["none", "full"])
    model, clusters = build_cost_model("analytic"), clusters_by_gpu()
    whole = model.score(rows, clusters)
    for i in range(len(rows)):
        alone = model.score(rows.iloc[[i]], clusters)
        for column in ("step_time_s", "peak_memory_gib", "mfu"):
            assert alone[column].to_numpy().tobytes() == \
                whole[column].to_numpy()[i:i + 1].tobytes(), (i, column)


@pytest.mark.parametrize("keyed_from_rows", [0, distinct.MIN_ROWS])
def test_a_table_of_several_jobs_prices_each_row_as_its_own_job_does(
        keyed_from_rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # One job's rows share their model, cluster and batch, which the model then holds as one
    # number each; a table that mixes jobs (a replay, a calibration) holds them per row.
    # Every row must come out the same, bit for bit, either way, and whether the formulas
    # of layout sizes and of one layer are worked out per distinct size and layer shape
    # (big tables) or row by row.
    monkeypatch.setattr(distinct, "MIN_ROWS", keyed_from_rows)
    jobs = [table(model="llama_13b", tp=[1, 2, 4], pp=[1, 2], recompute=["none", "full"]),
            table(model="llama_65b", cluster="h100_sxm", num_gpus=128, tp=[2, 8], pp=[4, 8],
                  vp=[1, 2]),
            table(model="llama_7b", num_gpus=8, global_batch_size=512, tp=[1, 2, 4],
                  micro_batch_size=[1, 4])]
    mixed = pd.concat(jobs, ignore_index=True)
    model, clusters = build_cost_model("analytic"), clusters_by_gpu()
    together = model.score(mixed, clusters)
    apart = pd.concat([model.score(rows, clusters) for rows in jobs], ignore_index=True)
    for column in together.columns:
        mixed_bits, own_bits = together[column].to_numpy(), apart[column].to_numpy()
        if mixed_bits.dtype.kind in "fb":
            assert mixed_bits.tobytes() == own_bits.tobytes(), column
        else:
            assert together[column].equals(apart[column]), column
