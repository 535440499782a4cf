"""Calibration: Nelder-Mead, recovering constants from synthetic measurements, the CLI."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import yaml

from layoutsearch.calibration import fit_constants, main, nelder_mead
from layoutsearch.catalog import clusters_by_gpu, load_cluster, load_model
from layoutsearch.costs import build_cost_model
from layoutsearch.costs.analytic import AnalyticCostModel
from layoutsearch.costs.constants import load_constants
from layoutsearch.rules import violations
from layoutsearch.space import SearchSpace
from layoutsearch.specs import Job


def test_nelder_mead_finds_a_quadratic_minimum():
    best, value = nelder_mead(lambda x: float(np.sum((x - [1.0, -2.0]) ** 2)), np.zeros(2),
                              max_evals=400)
    assert best == pytest.approx([1.0, -2.0], abs=1e-3) and value < 1e-6


def synthetic_runs(truth: AnalyticCostModel) -> pd.DataFrame:
    """Measurement rows of two small sweeps, 'measured' by a model with known constants."""
    frames = []
    for model, gpus in (("llama_7b", 16), ("llama_13b", 32)):
        job = Job(model=load_model(model), cluster=load_cluster("a100_80gb"), num_gpus=gpus,
                  seq_length=2048, global_batch_size=256)
        space = SearchSpace(tp=(1, 2, 4), pp=(1, 2, 4), micro_batch_size=(1, 2),
                            sequence_parallel=(False,), attention=("flash2",),
                            rmsnorm_kernel=(True,), recompute=("none", "full"))
        table = space.candidates(job)
        table = table[violations(table, clusters_by_gpu()) == ""].reset_index(drop=True)
        scored = truth.score(table, clusters_by_gpu())
        table["status"] = np.where(scored["fits"], "ok", "oom")
        table["step_time_s"] = scored["step_time_s"].where(scored["fits"])
        table["mfu"] = scored["mfu"].where(scored["fits"])
        frames.append(table)
    return pd.concat(frames, ignore_index=True)


def test_fit_recovers_a_known_gemm_efficiency():
    base = load_constants("analytic")
    true = dataclasses.replace(base["a100_80gb"],
                               gemm_efficiency=base["a100_80gb"].gemm_efficiency * 0.8)
    runs = synthetic_runs(AnalyticCostModel({"a100_80gb": true}))
    fitted = fit_constants(runs, base, ["gemm_efficiency"], max_evals=60)
    assert fitted["a100_80gb"].gemm_efficiency == pytest.approx(true.gemm_efficiency, rel=0.02)
    assert fitted["h100_sxm"] == base["h100_sxm"]  # no H100 rows: left as it was


def test_cli_writes_a_loadable_config_with_provenance(tmp_path, capsys):
    base = load_constants("analytic")
    true = dataclasses.replace(base["a100_80gb"],
                               gemm_efficiency=base["a100_80gb"].gemm_efficiency * 0.9)
    path = tmp_path / "runs.csv"
    synthetic_runs(AnalyticCostModel({"a100_80gb": true})).to_csv(path, index=False)
    out = tmp_path / "calibrated.yaml"
    assert main([str(path), "--out", str(out), "--free", "gemm_efficiency",
                 "--max-evals", "40"]) == 0
    printed = capsys.readouterr().out
    assert "leave-one-job-out" in printed and "summary after" in printed
    config = yaml.safe_load(out.read_text())
    assert config["provenance"]["rows"] == len(pd.read_csv(path))
    assert set(config["provenance"]["leave_one_job_out"]) == {"llama_7b 2048 16",
                                                              "llama_13b 2048 32"}
    model = build_cost_model(out)
    assert isinstance(model, AnalyticCostModel)
    assert model.constants["a100_80gb"].gemm_efficiency == pytest.approx(
        true.gemm_efficiency, rel=0.02)


def test_unknown_constant_is_named():
    base = load_constants("analytic")
    runs = synthetic_runs(AnalyticCostModel(base))
    from layoutsearch.errors import LayoutSearchError
    with pytest.raises(LayoutSearchError, match="gemm_eff"):
        fit_constants(runs, base, ["gemm_eff"], max_evals=5)
