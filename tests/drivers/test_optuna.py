"""The optuna driver: rules before evaluation, no evaluation twice, budgets, warm start,
Pareto fronts, storages, resume after SIGKILL, several workers, and the command line.

A small job (LLaMA 7B on 16 GPUs, 200-odd layouts of which some break the rules) keeps
every search well under a second with the analytic model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna
import pandas as pd
import pytest
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from layoutsearch import search
from layoutsearch.catalog import clusters_by_gpu, load_cluster, load_model
from layoutsearch.costs import PREDICTION_COLUMNS, build_cost_model
from layoutsearch.costs.replay import ReplayCostModel
from layoutsearch.drivers import build_driver
from layoutsearch.drivers.layout_index import LayoutIndex
from layoutsearch.drivers.optuna import OptunaDriver, open_storage
from layoutsearch.drivers.optuna.storage import STALE_S, Heartbeat, alive
from layoutsearch.drivers.optuna.worker import EvaluationBudget, Worker, encode, is_evaluation
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import LAYOUT_COLUMNS
from layoutsearch.problem import SearchProblem
from layoutsearch.space import KNOBS, SearchSpace
from layoutsearch.specs import ClusterSpec, Job
from tests.presses import PressesCtrlCWhileFinalized
from tests.rankings import assert_pareto_marks

if TYPE_CHECKING:  # not imported by the searches KILLABLE runs in a process of their own
    from tests.commands import Command

SPACE = {
    "tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2],
    "attention": ["flash2", "torch"], "recompute": ["none", "full"],
    "sequence_parallel": [False, True], "rmsnorm_kernel": [False, True],
}
JOB = {"model": "llama_7b", "num_gpus": 16, "seq_length": 2048, "global_batch_size": 256}


def label(row: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={row[k]}" for k in KNOBS)


class CountingModel:
    """The analytic model, writing one line per layout it prices to a file (any process)."""

    def __init__(self, log: Path, fail_tp: int | None = None, delay_s: float = 0.0) -> None:
        self.name = "analytic"
        self.log = log
        self.fail_tp = fail_tp
        self.delay_s = delay_s
        self.inner = build_cost_model("analytic")

    def score(self, candidates: pd.DataFrame,
              clusters: Mapping[str, ClusterSpec]) -> pd.DataFrame:
        with self.log.open("a") as handle:
            handle.writelines(label(row) + "\n" for _, row in candidates.iterrows())
        if self.fail_tp is not None and (candidates["tp"] == self.fail_tp).any():
            raise RuntimeError("launcher exploded")
        time.sleep(self.delay_s)
        return self.inner.score(candidates, clusters)

    def priced(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def make_problem(model: Any, num_gpus: int = 16,
                 space: SearchSpace | None = None) -> SearchProblem:
    job = Job(model=load_model(JOB["model"]), cluster=load_cluster("a100_80gb"),
              num_gpus=num_gpus, seq_length=2048, global_batch_size=256)
    space = space or SearchSpace.load("paper").pin(**SPACE)
    return SearchProblem.build(job, space, model, clusters_by_gpu())


@pytest.fixture
def counting(tmp_path: Path) -> CountingModel:
    return CountingModel(tmp_path / "priced.txt")


def test_rules_apply_before_evaluation_and_no_layout_is_priced_twice(
        counting: CountingModel) -> None:
    problem = make_problem(counting)
    ranked = OptunaDriver(n_trials=40, progress=False).run(problem)
    priced = counting.priced()
    assert len(priced) == len(ranked) == 40  # the budget counts evaluations
    assert len(set(priced)) == 40
    reasons = problem.candidates.assign(label=problem.candidates.apply(label, axis=1))
    assert set(reasons.set_index("label").loc[priced, "rule_reason"]) == {""}
    assert ranked.attrs["trials"] > 40  # rule rejections and duplicates were trials too
    assert ranked["trial"].is_unique and ranked["trial"].dtype == np.int64


def test_search_returns_the_grid_columns_plus_the_trial() -> None:
    ranked = search(**JOB, search_space=SearchSpace.load("paper").pin(**SPACE),
                    driver={"name": "optuna", "n_trials": 15, "progress": False})
    grid = search(**JOB, search_space=SearchSpace.load("paper").pin(**SPACE))
    assert set(ranked.columns) == {*grid.columns, "trial"}
    assert bool(ranked["fits"].iloc[0])
    best = ranked[ranked["fits"]]["mfu"].max()
    assert best == ranked["mfu"].iloc[0]
    assert best <= grid["mfu"].max() + 1e-12  # it cannot beat the exhaustive search
    # Only an exhaustive ranking can say which layouts come close to the best.
    assert ranked.attrs["close_call_note"] == "" and grid.attrs["close_call_note"]
    # Both know the space they searched; only the grid returned all of it.
    assert ranked.attrs["space_size"] == grid.attrs["space_size"] == len(grid) > len(ranked)


def test_a_seed_makes_the_search_reproducible(tmp_path: Path) -> None:
    def layouts(seed: int) -> list[str]:
        model = CountingModel(tmp_path / f"priced-{seed}-{len(list(tmp_path.iterdir()))}.txt")
        OptunaDriver(n_trials=20, seed=seed, progress=False).run(make_problem(model))
        return model.priced()

    assert layouts(3) == layouts(3)
    assert layouts(3) != layouts(4)


def test_a_cost_model_error_fails_one_trial_and_the_search_goes_on(tmp_path: Path) -> None:
    model = CountingModel(tmp_path / "priced.txt", fail_tp=4)
    ranked = OptunaDriver(n_trials=40, progress=False).run(make_problem(model))
    failed = ranked[ranked["tp"] == 4]
    assert len(failed) >= 1 and not failed["fits"].any()
    assert failed["reason"].str.contains("cost model error: RuntimeError: launcher exploded").all()
    assert failed["mfu"].isna().all()
    assert len(ranked) == 40 and ranked["fits"].any()
    assert len(set(model.priced())) == len(model.priced())  # failures are not retried


class BrokenSetup(CountingModel):
    """Stops as a measured model does on a setup mistake, until it is fixed."""

    broken = True

    def score(self, candidates: pd.DataFrame,
              clusters: Mapping[str, ClusterSpec]) -> pd.DataFrame:
        if self.broken:
            raise LayoutSearchError("cannot launch: megatron_path 'nowhere' does not exist")
        return super().score(candidates, clusters)


def test_a_setup_mistake_stops_the_study_and_a_rerun_after_the_fix_prices_the_layouts(
        tmp_path: Path) -> None:
    # Caught per trial, it was stored as the price of each layout sampled; the rerun after
    # the fix reused those failures and priced nothing.
    model = BrokenSetup(tmp_path / "priced.txt")
    url = f"sqlite:///{tmp_path}/study.db"
    with pytest.raises(LayoutSearchError, match=r"megatron_path 'nowhere' does not exist"):
        OptunaDriver(n_trials=4, storage=url, progress=False).run(make_problem(model))
    model.broken = False
    ranked = OptunaDriver(n_trials=4, storage=url, progress=False).run(make_problem(model))
    assert len(model.priced()) == 4 and ranked["fits"].any()
    assert not ranked["reason"].str.contains("megatron_path").any()


class InterruptedOnce(CountingModel):
    """Ctrl-C while its first layout is priced, as in a notebook cell."""

    interrupt = True

    def score(self, candidates: pd.DataFrame,
              clusters: Mapping[str, ClusterSpec]) -> pd.DataFrame:
        if self.interrupt:
            self.interrupt = False
            with self.log.open("a") as handle:
                handle.writelines(label(row) + "\n" for _, row in candidates.iterrows())
            raise KeyboardInterrupt
        return super().score(candidates, clusters)


def test_ctrl_c_fails_the_trial_in_flight_so_a_search_in_the_same_process_prices_it(
        tmp_path: Path) -> None:
    # Left running, its worker (this process) alive, the trial kept the layout "being
    # evaluated" for every later search of the notebook.
    model = InterruptedOnce(tmp_path / "priced.txt")
    space = SearchSpace.load("paper").pin(**{**SPACE, "tp": [1, 2], "pp": [1],
                                             "micro_batch_size": [1], "attention": ["flash2"]})
    url = f"sqlite:///{tmp_path}/study.db"
    driver = OptunaDriver(n_trials=None, storage=url, progress=False)  # every open layout
    with pytest.raises(KeyboardInterrupt):
        driver.run(make_problem(model, space=space))
    interrupted, = model.priced()
    name, = optuna.get_all_study_names(url)
    assert [t.state for t in optuna.load_study(study_name=name, storage=url).trials] == [
        TrialState.FAIL]
    ranked = driver.run(make_problem(model, space=space))
    assert interrupted in list(ranked.apply(label, axis=1))
    assert model.priced().count(interrupted) == 2


def test_ctrl_c_while_a_price_is_stored_fails_that_trial_too(
        tmp_path: Path, counting: CountingModel, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C outside the cost model's call (here while optuna stores the price) left the
    # trial running, claimed by this live process: every later search of the notebook
    # answered its layout "being evaluated in trial 0" and never priced it.
    tell = optuna.Study.tell

    def interrupted_once(study: optuna.Study, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("state") == TrialState.COMPLETE and len(counting.priced()) == 1:
            raise KeyboardInterrupt
        return tell(study, *args, **kwargs)

    monkeypatch.setattr(optuna.Study, "tell", interrupted_once)
    url = f"sqlite:///{tmp_path}/study.db"
    driver = OptunaDriver(n_trials=3, storage=url, progress=False)
    with pytest.raises(KeyboardInterrupt):
        driver.run(make_problem(counting))
    interrupted, = counting.priced()
    name, = optuna.get_all_study_names(url)
    assert [t.state for t in optuna.load_study(study_name=name, storage=url).trials] == [
        TrialState.FAIL]
    monkeypatch.setattr(optuna.Study, "tell", tell)
    ranked = driver.run(make_problem(counting))
    assert interrupted in list(ranked.apply(label, axis=1)) and len(ranked) == 3


def test_warm_start_tries_the_analytic_top_k_first(counting: CountingModel) -> None:
    problem = make_problem(counting)
    grid = search(**JOB, search_space=problem.space)
    ranked = OptunaDriver(n_trials=12, warm_start="analytic", warm_start_top_k=4,
                          progress=False).run(problem)
    first = ranked.sort_values("trial").head(4)
    assert first["trial"].tolist() == [0, 1, 2, 3]
    assert [label(r) for _, r in first.iterrows()] == [label(r) for _, r in grid.head(4).iterrows()]


class TorchUnmeasured(CountingModel):
    """Like a replay of a file that never ran torch attention: no figures for those rows."""

    REASON = "unmeasured: no torch-attention runs in this file"

    def unpriced(self, candidates: pd.DataFrame,
                 clusters: Mapping[str, ClusterSpec]) -> pd.Series:
        torch = candidates["attention"].astype(str) == "torch"
        return pd.Series(np.where(torch, self.REASON, ""), index=candidates.index)

    def score(self, candidates: pd.DataFrame,
              clusters: Mapping[str, ClusterSpec]) -> pd.DataFrame:
        scored = super().score(candidates, clusters)
        torch = (candidates["attention"].astype(str) == "torch").to_numpy()
        scored.loc[torch, ["mfu", "step_time_s", "tokens_per_s", "peak_memory_gib"]] = np.nan
        scored.loc[torch, "fits"] = False
        scored.loc[torch, "cost_reason"] = self.REASON
        return scored


def test_layouts_the_cost_model_cannot_price_spend_no_evaluation(tmp_path: Path) -> None:
    model = TorchUnmeasured(tmp_path / "priced.txt")
    problem = make_problem(model)
    ranked = OptunaDriver(n_trials=30, warm_start="analytic", warm_start_top_k=3,
                          progress=False).run(problem)
    priced = model.priced()
    assert len(priced) == len(ranked) == 30 and len(set(priced)) == 30
    assert not any("attention=torch" in layout for layout in priced)
    assert ranked.attrs["trials"] > 30  # sampled torch layouts were trials all the same
    # The warm start's guesses are the analytic model's best among the priceable layouts.
    grid = search(**JOB, search_space=problem.space)
    best_priceable = grid[grid["attention"] != "torch"].head(3)
    first = ranked.sort_values("trial").head(3)
    assert [label(r) for _, r in first.iterrows()] == [
        label(r) for _, r in best_priceable.iterrows()]


def test_a_trial_on_a_layout_without_a_price_records_why(tmp_path: Path) -> None:
    model = TorchUnmeasured(tmp_path / "priced.txt")
    problem = make_problem(model)
    driver = OptunaDriver(n_trials=1, progress=False)
    storage = open_storage(None)
    study = driver.open_study(problem, storage)
    index = LayoutIndex.of(problem)
    torch = next(i for i in index.unpriced)
    study.enqueue_trial(encode(index, index.params_of(torch)))
    worker = Worker(driver, problem, index, study, storage, 0)
    trial = study.ask()
    worker.answer(trial)
    frozen = study.get_trials(deepcopy=False)[0]
    assert frozen.user_attrs["reason"] == TorchUnmeasured.REASON
    assert frozen.constraints == {"priced": 1.0}
    assert model.priced() == []


def test_a_proposal_of_one_data_parallel_rank_is_its_kept_twin(tmp_path: Path) -> None:
    # tp4 pp4 on 16 GPUs is dp 1: the candidates hold it with the sharded optimizer and no
    # overlap only, so a sampler's proposal of the plain optimizer or of overlap is that row,
    # not "not a candidate of this search" (a rule's worst score).
    space = SearchSpace.load("paper").pin(**SPACE, distributed_optimizer=[False, True],
                                          overlap_grad_reduce=[True, False])
    index = LayoutIndex.of(make_problem(CountingModel(tmp_path / "priced.txt"), space=space))
    proposal = {"tp": 4, "pp": 4, "micro_batch_size": 1, "attention": "flash2",
                "recompute": "none", "sequence_parallel": True, "rmsnorm_kernel": True,
                "distributed_optimizer": False, "overlap_grad_reduce": True}
    kept = index.position({**proposal, "distributed_optimizer": True,
                           "overlap_grad_reduce": False})
    assert kept is not None and index.position(proposal) == kept
    # At dp 2 (tp2 pp4) the settings are four layouts.
    wider = {**proposal, "tp": 2}
    assert len({index.position({**wider, "distributed_optimizer": d,
                                "overlap_grad_reduce": o})
                for d in (False, True) for o in (False, True)} - {None}) == 4


def test_a_study_stored_with_twins_of_one_data_parallel_rank_resumes_with_them_as_one(
        tmp_path: Path, counting: CountingModel) -> None:
    # Before dp·cp = 1 kept one optimizer setting, a study priced tp4 pp4 on 16 GPUs with
    # the plain optimizer too, under a label no candidate has now: resuming it raised
    # KeyError on that label.
    space = SearchSpace.load("paper").pin(**SPACE, distributed_optimizer=[False, True])
    problem = make_problem(counting, space=space)
    url = f"sqlite:///{tmp_path}/study.db"
    driver = OptunaDriver(n_trials=1, storage=url, sampler="random", seed=0, progress=False)
    driver.run(problem)
    index = LayoutIndex.of(problem)
    study = optuna.load_study(study_name=driver.default_study_name(driver.fingerprint(problem)),
                              storage=url)
    kept = next(int(i) for i in index.open if problem.candidates["dp"].iat[int(i)] == 1)
    scored = problem.evaluate(problem.candidates.iloc[[kept]]).iloc[0]
    old = {**index.params_of(kept), "distributed_optimizer": False}
    stored = study.trials[0]
    for params in (old, index.params_of(kept)):  # the plain twin, then the kept one
        study.add_trial(optuna.trial.create_trial(
            params=encode(index, params), distributions=stored.distributions,
            values=[float(scored["mfu"])], constraints={"fits": 0.0}, user_attrs={
                "layout": " ".join(f"{k}={v}" for k, v in {**index.fixed, **params}.items()),
                "evaluated": True, "costs": {"mfu": float(scored["mfu"]), "fits": True}}))
    later = study.trials[-1].number
    ranked = OptunaDriver(n_trials=3, storage=url, sampler="random", seed=0,
                          progress=False).run(problem)
    assert len(ranked) == 3 and ranked["trial"].is_unique
    twins = ranked[ranked.apply(label, axis=1) == index.labels[kept]]
    assert len(twins) == 1 and bool(twins["distributed_optimizer"].iloc[0])
    assert twins["trial"].iloc[0] == later  # the later of the two stands


def test_with_no_layout_it_can_price_the_driver_answers_with_the_reasons(
        tmp_path: Path) -> None:
    model = TorchUnmeasured(tmp_path / "priced.txt")
    space = SearchSpace.load("paper").pin(**{**SPACE, "attention": ["torch"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ranked = search(**JOB, search_space=space, cost_model=model,
                        driver={"name": "optuna", "n_trials": 10, "progress": False})
    assert model.priced() == [] and not ranked["fits"].any()
    assert ranked.attrs["space_size"] == len(ranked)  # every layout, each with its reason
    assert ranked.attrs["message"].startswith("no layout was priced: ")
    passing = make_problem(model, space=space).feasible_candidates()
    assert (ranked["reason"] == TorchUnmeasured.REASON).sum() == len(passing) > 0
    assert (ranked["reason"] != "").all()


def test_target_stops_the_search_once_reached(counting: CountingModel) -> None:
    problem = make_problem(counting)
    best = search(**JOB, search_space=problem.space)["mfu"].iloc[0]
    ranked = OptunaDriver(n_trials=200, target=float(best), warm_start="analytic",
                          progress=False).run(problem)
    assert len(ranked) == 1 and ranked["mfu"].iloc[0] == pytest.approx(best)


def test_two_objectives_mark_the_pareto_front(counting: CountingModel) -> None:
    ranked = OptunaDriver(n_trials=40, objectives=["mfu", "peak_memory_gib"],
                          progress=False).run(make_problem(counting))
    front = ranked[ranked["pareto"]]
    assert len(front) >= 1 and front["fits"].all()
    assert_pareto_marks(ranked)


class NoMemoryFigure(CountingModel):
    """A replay of runs without a peak_memory_gib column: times, fits, no memory figure."""

    def score(self, candidates: pd.DataFrame,
              clusters: Mapping[str, ClusterSpec]) -> pd.DataFrame:
        return super().score(candidates, clusters).assign(peak_memory_gib=np.nan)


def test_an_objective_the_cost_model_does_not_price_stops_the_study(tmp_path: Path) -> None:
    # Stored as not fitting, each such layout would look alike to the sampler: a random
    # search, no Pareto front, and no word of why.
    driver = OptunaDriver(n_trials=10, objectives=["mfu", "peak_memory_gib"], progress=False,
                          storage=f"sqlite:///{tmp_path}/study.db", seed=0)
    with pytest.raises(LayoutSearchError, match=r"^driver.objectives=\['mfu', "
                       r"'peak_memory_gib'\]: the cost model gives no peak_memory_gib for "
                       r"tp\d .*, which it finds to fit .* e.g. driver.objectives=\[mfu\]$"):
        driver.run(make_problem(NoMemoryFigure(tmp_path / "priced.txt")))
    # MFU alone it prices.
    ranked = OptunaDriver(n_trials=5, progress=False, seed=0).run(
        make_problem(NoMemoryFigure(tmp_path / "again.txt")))
    assert ranked["fits"].any()


@pytest.mark.parametrize("storage", ["sqlite:///{dir}/study.db", "{dir}/study.log",
                                     "journal://{dir}/study.jsonl"])
def test_a_study_resumes_from_its_storage(tmp_path: Path, counting: CountingModel,
                                          storage: str) -> None:
    url = storage.format(dir=tmp_path)
    first = OptunaDriver(n_trials=10, storage=url, progress=False).run(make_problem(counting))
    again = OptunaDriver(n_trials=25, storage=url, progress=False).run(make_problem(counting))
    assert len(first) == 10 and len(again) == 25
    assert first.attrs["study_name"] == again.attrs["study_name"]  # derived from the job
    kept = again.merge(first, on=["trial", *KNOBS], suffixes=("", "_first"))
    assert len(kept) == 10 and np.allclose(kept["mfu"], kept["mfu_first"], equal_nan=True)
    assert len(counting.priced()) == len(set(counting.priced())) == 25


def test_a_study_whose_budget_is_spent_says_so(tmp_path: Path, counting: CountingModel,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # Rerun with a smaller n_trials: the progress line had read "10/4 layouts priced".
    url = f"sqlite:///{tmp_path}/study.db"
    OptunaDriver(n_trials=10, storage=url, progress=False).run(make_problem(counting))
    capsys.readouterr()
    again = OptunaDriver(n_trials=4, storage=url, progress=False).run(make_problem(counting))
    assert len(again) == 10 and len(counting.priced()) == 10  # nothing more priced
    assert capsys.readouterr().err == (
        "optuna: the study already holds 10 evaluations, driver.n_trials=4: nothing more is "
        "priced; these are its results (raise driver.n_trials to search further)\n")


def test_a_sweep_over_sampler_settings_gets_a_default_named_study_per_job(
        tmp_path: Path, counting: CountingModel) -> None:
    # `-m driver.sampler=tpe,random` (or driver.seed=0,1) on one storage: each job had
    # reported the first job's trials as its own.
    url = f"sqlite:///{tmp_path}/study.db"
    problem = make_problem(counting)

    def study(**sampling: Any) -> str:
        driver = OptunaDriver(n_trials=3, storage=url, progress=False, **sampling)
        return str(driver.run(problem).attrs["study_name"])

    tpe = study()
    assert len({tpe, study(sampler="random"), study(seed=1)}) == 3
    assert len(counting.priced()) == 9  # each study priced its own three
    assert study() == tpe and len(counting.priced()) == 9  # the same command resumes
    assert len(optuna.get_all_study_names(url)) == 3
    # A study named explicitly resumes under other sampler settings.
    assert study(study_name="mine") == study(study_name="mine", sampler="random") == "mine"


def test_a_study_under_the_earlier_default_name_is_resumed_and_said_so(
        tmp_path: Path, counting: CountingModel, capsys: pytest.CaptureFixture[str]) -> None:
    # Before the sampler settings were part of the default name, it was the digest of the
    # fingerprint alone: a search begun then resumes instead of starting over.
    url = f"sqlite:///{tmp_path}/study.db"
    problem = make_problem(counting)
    fingerprint = OptunaDriver(n_trials=3).fingerprint(problem)
    earlier = "layoutsearch-" + hashlib.sha1(
        json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:12]
    OptunaDriver(n_trials=3, storage=url, study_name=earlier, progress=False).run(problem)
    capsys.readouterr()
    ranked = OptunaDriver(n_trials=3, storage=url, progress=False).run(problem)
    assert ranked.attrs["study_name"] == earlier and len(counting.priced()) == 3
    assert f"resuming study {earlier!r}" in capsys.readouterr().err
    # It is resumed under the sampler settings that resumed it first: in a sweep over the
    # seed, the other jobs start studies of their own instead of all sharing it.
    other_seed = OptunaDriver(n_trials=3, storage=url, seed=1, progress=False)
    assert other_seed.run(problem).attrs["study_name"] == other_seed.default_study_name(
        fingerprint)
    assert len(counting.priced()) == 6
    again = OptunaDriver(n_trials=3, storage=url, progress=False).run(problem)
    assert again.attrs["study_name"] == earlier and len(counting.priced()) == 6
    # Where no such study is, the default name is the new one.
    fresh = OptunaDriver(n_trials=3, storage=f"sqlite:///{tmp_path}/fresh.db", progress=False)
    assert fresh.run(problem).attrs["study_name"] == fresh.default_study_name(fingerprint)


def test_a_resumed_studys_progress_counts_from_what_it_already_priced(
        tmp_path: Path, counting: CountingModel, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/study.db"
    OptunaDriver(n_trials=10, storage=url, progress=False).run(make_problem(counting))
    ranked = OptunaDriver(n_trials=25, storage=url, progress=True).run(make_problem(counting))
    lines = [line for line in capsys.readouterr().err.split("\r") if line.strip()]
    assert lines[0].startswith("optuna: 10/25 layouts priced · best MFU ")
    assert lines[-1].startswith("optuna: 25/25 layouts priced · best MFU ")
    best = ranked.loc[ranked["fits"], "mfu"].max()
    assert f"best MFU {100 * best:.1f} %" in lines[-1]


def test_the_progress_line_counts_to_the_layouts_there_are_to_price(
        counting: CountingModel, capsys: pytest.CaptureFixture[str]) -> None:
    # A space with fewer layouts than n_trials: done when all are priced, the line ended at
    # "24/50 layouts priced", as if the search had stopped short.
    space = SearchSpace.load("paper").pin(**{**SPACE, "tp": [1, 2], "pp": [1],
                                             "attention": ["flash2"]})
    problem = make_problem(counting, space=space)
    open_layouts = len(LayoutIndex.of(problem).open)
    ranked = OptunaDriver(n_trials=50, progress=True).run(problem)
    assert len(ranked) == open_layouts < 50
    lines = [line for line in capsys.readouterr().err.split("\r") if line.strip()]
    assert lines[-1].startswith(f"optuna: {open_layouts}/{open_layouts} layouts priced · ")


def test_a_study_made_for_another_job_or_space_is_refused(tmp_path: Path,
                                                          counting: CountingModel) -> None:
    url = f"sqlite:///{tmp_path}/study.db"
    OptunaDriver(n_trials=3, storage=url, study_name="s", progress=False).run(
        make_problem(counting))
    with pytest.raises(LayoutSearchError, match=r"job num_gpus: study 16, this search 32"):
        OptunaDriver(n_trials=3, storage=url, study_name="s", progress=False).run(
            make_problem(counting, num_gpus=32))
    problem = make_problem(counting)
    narrower = SearchProblem.build(problem.job, problem.space.pin(tp=[1, 2]), counting,
                                   problem.clusters)
    with pytest.raises(LayoutSearchError, match=r"space tp: study \[1, 2, 4, 8\]"):
        OptunaDriver(n_trials=3, storage=url, study_name="s", progress=False).run(narrower)
    # A model field one search sets and the other leaves unset is named, not passed over.
    scaled = problem.job.model.replace(rope_scaling_factor=8.0)
    rescaled = SearchProblem.build(dataclasses.replace(problem.job, model=scaled), problem.space,
                                   counting, problem.clusters)
    with pytest.raises(LayoutSearchError,
                       match=r"job rope_scaling_factor: study \(absent\), this search 8.0"):
        OptunaDriver(n_trials=3, storage=url, study_name="s", progress=False).run(rescaled)
    # So is a cluster whose GPU or fabric differs under the same kind's name.
    cluster = problem.job.cluster
    smaller = cluster.replace(gpu=dataclasses.replace(cluster.gpu, memory_gib=40.0))
    on_smaller = SearchProblem.build(dataclasses.replace(problem.job, cluster=smaller),
                                     problem.space, counting, problem.clusters)
    with pytest.raises(LayoutSearchError,
                       match=r"cluster gpu.memory_gib: study 80, this search 40.0"):
        OptunaDriver(n_trials=3, storage=url, study_name="s", progress=False).run(on_smaller)


@pytest.mark.parametrize("trials", [0, 2])
def test_a_study_of_that_name_layoutsearch_did_not_make_is_refused(
        tmp_path: Path, counting: CountingModel, trials: int) -> None:
    # It was taken over: fingerprinted, filled with layouts, MFU maximized in a study that
    # minimizes, where a rule-rejected layout's 0.0 is the best value.
    url = f"sqlite:///{tmp_path}/study.db"
    foreign = optuna.create_study(storage=url, study_name="foreign", direction="minimize")
    for _ in range(trials):
        foreign.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    with pytest.raises(LayoutSearchError, match=rf"study 'foreign' in .* was not made by "
                                                rf"layoutsearch \({trials} trials, direction "
                                                r"minimize, no layoutsearch fingerprint\)"):
        OptunaDriver(n_trials=3, storage=url, study_name="foreign",
                     progress=False).run(make_problem(counting))
    assert counting.priced() == []
    assert len(optuna.load_study(study_name="foreign", storage=url).trials) == trials


def test_a_study_priced_by_other_constants_is_refused(tmp_path: Path) -> None:
    # Two analytic configs share the name "analytic"; their constants tell them apart.
    url = f"sqlite:///{tmp_path}/study.db"
    problem = make_problem(build_cost_model("analytic"))
    OptunaDriver(n_trials=2, storage=url, study_name="s", progress=False).run(problem)
    other = SearchProblem.build(problem.job, problem.space, build_cost_model("analytic_prior"),
                                problem.clusters)
    with pytest.raises(LayoutSearchError, match=r"^study 's' in .* was made for another search: "
                                                r"cost_model: study 'analytic:\w+', this search "
                                                r"'analytic:\w+' \(a cost model's "
                                                r"fingerprint covers the constants of "
                                                r"analytic_prior: they changed\); use another "
                                                r"driver.study_name or driver.storage, or "
                                                r"delete study 's' \(optuna.delete_study\) "
                                                r"to start over$"):
        OptunaDriver(n_trials=2, storage=url, study_name="s", progress=False).run(other)


def test_a_replay_study_whose_file_changed_says_what_its_fingerprint_covers(
        tmp_path: Path, measurement_row: dict[str, Any]) -> None:
    url = f"sqlite:///{tmp_path}/study.db"
    runs = tmp_path / "runs.csv"
    rows = [{**measurement_row, "distributed_optimizer": True}]
    pd.DataFrame(rows).to_csv(runs, index=False)
    problem = make_problem(ReplayCostModel.load(runs))
    OptunaDriver(n_trials=2, storage=url, study_name="s", progress=False).run(problem)
    # The file gains a run between two searches: its fingerprint, a digest of its runs,
    # changes, and the refusal says why and what to do, not two digests alone.
    rows.append({**rows[0], "tp": 4, "dp": 16})
    pd.DataFrame(rows).to_csv(runs, index=False)
    grown = SearchProblem.build(problem.job, problem.space, ReplayCostModel.load(runs),
                                problem.clusters)
    with pytest.raises(LayoutSearchError, match=(
            r"^study 's' in .* was made for another search: cost_model: study 'replay:\w+', "
            r"this search 'replay:\w+' \(a cost model's fingerprint covers the runs of "
            + re.escape(str(runs)) + r" as layoutsearch reads them: the file changed, or a "
            r"newer layoutsearch reads it differently\); use another driver.study_name or "
            r"driver.storage, or delete study 's' \(optuna.delete_study\) to start over$")):
        OptunaDriver(n_trials=2, storage=url, study_name="s", progress=False).run(grown)


def test_bad_storage_urls_and_settings_are_named(tmp_path: Path,
                                                 counting: CountingModel) -> None:
    problem = make_problem(counting)
    for url in ("not a url", f"sqlite:///{tmp_path}/no/such/dir/x.db",
                f"{tmp_path}/no/such/dir/x.log", "postgresql://nobody@127.0.0.1:1/none"):
        with pytest.raises(LayoutSearchError, match=rf"^driver\.storage={re.escape(repr(url))}: "
                                                    r"cannot open it \(.*\); use "
                                                    r"sqlite:///study\.db, "):
            OptunaDriver(n_trials=2, storage=url, progress=False).run(problem)
    for url in (f"sqlite:///{tmp_path}/no/such/dir/x.db", f"{tmp_path}/no/such/dir/x.log"):
        with pytest.raises(LayoutSearchError, match=rf"folder '{tmp_path}/no/such/dir' does "
                                                    "not exist"):
            OptunaDriver(n_trials=2, storage=url, progress=False).run(problem)
    # A database file given as a path is told its URL.
    with pytest.raises(LayoutSearchError, match=rf"not a storage URL; for an SQLite file, "
                                                rf"sqlite:///{re.escape(str(tmp_path))}/s\.db\)"):
        OptunaDriver(n_trials=2, storage=f"{tmp_path}/s.db", progress=False).run(problem)
    # Two slashes: once 'folder 'sqlite:/tmp/...' does not exist'.
    with pytest.raises(LayoutSearchError, match=r"Invalid SQLite URL: sqlite://tmp/x\.db"):
        OptunaDriver(n_trials=2, storage="sqlite://tmp/x.db", progress=False).run(problem)
    with pytest.raises(LayoutSearchError, match=r"^driver\.n_workers=2: workers share a study "
                                                r"through a storage; set driver\.storage="):
        OptunaDriver(n_workers=2)
    with pytest.raises(LayoutSearchError, match="unknown objective 'mfuu'"):
        build_driver({"name": "optuna", "objectives": ["mfuu"]})
    with pytest.raises(LayoutSearchError, match=r"^driver\.n_trials=0: must be a positive integer"):
        build_driver("optuna", n_trials=0)
    with pytest.raises(LayoutSearchError, match="setting 'n_trails'; did you mean 'n_trials'"):
        build_driver("optuna", n_trails=5)
    with pytest.raises(LayoutSearchError, match=r"driver\.timeout='10': must be a finite positive"):
        build_driver("optuna", timeout="10")


@pytest.mark.parametrize(("setting", "value", "rule"), [
    ("seed", 1.5, "must be null or an integer in 0 .. 2**32 - 1"),
    # Never reached: the search would not stop at it (NaN stopped it before any trial).
    ("target", float("nan"), "must be a finite number"),
    ("timeout", float("nan"), "must be a finite positive number of seconds (null: no limit)"),
    ("timeout", float("inf"), "must be a finite positive number of seconds (null: no limit)"),
    # Past a float's range: math.isfinite raised OverflowError on it.
    ("target", 10**400, "must be a finite number"),
    ("seed", -1, "must be null or an integer in 0 .. 2**32 - 1"),
    ("n_startup_trials", "x", "must be an integer >= 0"),
    ("multivariate", "maybe", "must be true or false"),
    ("progress", "yes", "must be true, false or null"),
    ("storage", 5, "must be null or a non-empty string"),
    # null failed later with "'>' not supported between 'NoneType' and 'int'".
    ("n_workers", None, "must be a positive integer"),
    ("warm_start_top_k", None, "must be a positive integer"),
    # A scalar failed with "'bool' object is not iterable"; a mapping passed as its keys.
    ("objectives", False, "must be an objective or a list of them (e.g. [mfu]), of mfu, "
                          "tokens_per_s, step_time_s, peak_memory_gib, num_gpus"),
    ("objectives", None, "must be an objective or a list of them (e.g. [mfu])"),
    ("objectives", {"mfu": 1}, "must be an objective or a list of them (e.g. [mfu])"),
])
def test_each_optuna_setting_names_its_rule(setting: str, value: object, rule: str) -> None:
    with pytest.raises(LayoutSearchError, match=re.escape(f"driver.{setting}={value!r}: {rule}")):
        build_driver("optuna", **{setting: value})


def test_a_seed_whose_last_worker_passes_2_to_the_32_is_refused(tmp_path: Path) -> None:
    # Worker 1's sampler refused seed 2**32 as its study opened, named as the storage's fault.
    with pytest.raises(LayoutSearchError, match=re.escape(
            "driver.seed=4294967295: worker i of driver.n_workers=2 samples with seed + i, "
            "which must stay below 2**32; use a seed of at most 4294967294")):
        build_driver("optuna", seed=2**32 - 1, n_workers=2, storage=str(tmp_path / "s.log"))
    assert build_driver("optuna", seed=2**32 - 2, n_workers=2, storage=str(tmp_path / "s.log"))


@pytest.mark.parametrize("n_trials", [2**31, 2**70])
def test_workers_share_a_budget_past_a_c_int_as_no_limit(n_trials: int) -> None:
    # The shared count is a C int: 2**31 wrapped around to -2**31 (2**70 to 0), and the
    # workers priced nothing.
    budget = EvaluationBudget(multiprocessing.get_context(), n_trials)
    assert budget.take() and budget.take()


def test_an_objective_named_twice_is_refused() -> None:
    with pytest.raises(LayoutSearchError, match=re.escape(
            "driver.objectives=['mfu', 'mfu']: names an objective twice")):
        build_driver("optuna", objectives=["mfu", "mfu"])


def test_a_measured_warm_start_is_refused_before_it_launches_anything(
        counting: CountingModel) -> None:
    # Guessing prices every layout that passes the rules: with training runs, the whole grid.
    problem = make_problem(counting)
    with pytest.raises(LayoutSearchError, match=r"driver.warm_start=measured: a warm start "
                       r"prices all \d+ layouts that pass the rules to pick 5; a measured cost "
                       "model would launch each"):
        OptunaDriver(n_trials=3, warm_start="measured", progress=False).run(problem)
    assert counting.priced() == []


@pytest.mark.parametrize("warm_start, message", [
    # Not "cost_models.path=...": that sets the searched model, not the warm start's.
    ("replay", "driver.warm_start=replay: the replay cost model needs 'path', a measurement "
               "file (CSV or Parquet, docs/measurements.md); e.g. a YAML file of its own"),
    ("anlytic", "driver.warm_start=anlytic: unknown cost model 'anlytic'; did you mean "
                "'analytic'?"),
])
def test_a_wrong_warm_start_is_named_by_its_setting(counting: CountingModel, warm_start: str,
                                                    message: str) -> None:
    with pytest.raises(LayoutSearchError, match=re.escape(message)):
        OptunaDriver(n_trials=3, warm_start=warm_start, progress=False).run(
            make_problem(counting))
    assert counting.priced() == []


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
@pytest.mark.parametrize("storage", ["sqlite:///{dir}/study.db", "{dir}/study.log"])
def test_workers_share_a_study_and_its_budget_without_pricing_a_layout_twice(
        tmp_path: Path, storage: str) -> None:
    model = CountingModel(tmp_path / "priced.txt", delay_s=0.01)
    driver = OptunaDriver(n_trials=30, n_workers=3, storage=storage.format(dir=tmp_path),
                          progress=False)
    ranked = driver.run(make_problem(model))
    priced = model.priced()
    assert len(priced) == len(set(priced))  # no layout priced twice, across processes
    assert len(priced) == 30  # the workers share the budget: neither starts a 31st
    assert len(ranked) == len(priced)


KILLABLE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_optuna import CountingModel, make_problem
    from pathlib import Path
    from layoutsearch.drivers.optuna import OptunaDriver
    model = CountingModel(Path({log!r}), delay_s=0.05)
    OptunaDriver(n_trials=40, storage={url!r}, progress=False).run(make_problem(model))
""")


def test_a_study_killed_with_sigkill_resumes_and_loses_nothing(tmp_path: Path) -> None:
    url, log = f"sqlite:///{tmp_path}/study.db", tmp_path / "priced.txt"
    script = KILLABLE.format(tests=str(Path(__file__).parent), log=str(log), url=url)
    process = subprocess.Popen([sys.executable, "-c", script])

    def finished() -> list[tuple[int, str]]:
        if not (tmp_path / "study.db").exists():
            return []
        try:
            with sqlite3.connect(tmp_path / "study.db") as db:
                return db.execute("SELECT number, state FROM trials").fetchall()
        except sqlite3.OperationalError:
            return []  # the tables are being created

    deadline = time.monotonic() + 60
    while sum(state == "COMPLETE" for _, state in finished()) < 8:
        assert process.poll() is None, "the search ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    before = {n for n, state in finished() if state == "COMPLETE"}
    model = CountingModel(log)
    ranked = OptunaDriver(n_trials=40, storage=url, progress=False).run(make_problem(model))
    after = dict(finished())
    assert all(after[n] == "COMPLETE" for n in before)  # every finished trial is still there
    assert len(ranked) == 40  # the study completed its budget
    # The killed worker's trial was failed (unless the kill came before it claimed one,
    # between creating the trial and naming its worker: then it holds no layout).
    with sqlite3.connect(tmp_path / "study.db") as db:
        held = db.execute(
            "SELECT COUNT(*) FROM trials JOIN trial_user_attributes USING (trial_id) "
            "WHERE state = 'RUNNING' AND key = 'layout'").fetchone()[0]
    assert held == 0
    priced = model.priced()
    # Only the layout being priced when the process died can appear twice.
    assert len(priced) - len(set(priced)) <= 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_end_with_a_search_killed_with_sigkill(tmp_path: Path) -> None:
    # Left running, they would go on pricing (with a measured model: launching trials).
    url, log = f"sqlite:///{tmp_path}/study.db", tmp_path / "priced.txt"
    script = KILLABLE.format(tests=str(Path(__file__).parent), log=str(log), url=url).replace(
        "n_trials=40,", "n_trials=400, n_workers=2,")
    process = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while len(log.read_text().splitlines() if log.exists() else []) < 6:
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    time.sleep(1.5)  # a worker in the middle of a trial finishes its write, then ends
    settled = len(log.read_text().splitlines())
    time.sleep(1.5)
    assert len(log.read_text().splitlines()) == settled < 400


def _held_by_another_machine(study: optuna.Study, layout: str, beat_age_s: float) -> int:
    """A running trial of `layout` claimed by a worker elsewhere, last stamped beat_age_s ago."""
    trial = study.ask()
    trial.set_user_attr("worker", "gpu-node-17:4242")
    trial.set_user_attr("layout", layout)
    trial.set_user_attr("heartbeat", time.time() - beat_age_s)
    return trial.number


def _searched_study(tmp_path: Path, counting: CountingModel) -> tuple[
        SearchProblem, OptunaDriver, optuna.storages.BaseStorage, optuna.Study]:
    """A study in a SQLite file after a search of 3 trials, opened again as a resumed
    search opens it: the problem, the driver, the storage and the study."""
    url = f"sqlite:///{tmp_path}/study.db"
    problem = make_problem(counting)
    driver = OptunaDriver(n_trials=3, storage=url, study_name="s", progress=False)
    driver.run(problem)
    storage = open_storage(url)
    return problem, driver, storage, driver.open_study(problem, storage)


def _open_unpriced(study: optuna.Study, problem: SearchProblem, count: int) -> list[str]:
    index = LayoutIndex.of(problem)
    taken = {t.user_attrs.get("layout") for t in study.get_trials(deepcopy=False)}
    return [index.labels[i] for i in index.open if index.labels[i] not in taken][:count]


def test_a_trial_of_a_machine_that_died_is_failed_by_a_search_elsewhere(
        tmp_path: Path, counting: CountingModel) -> None:
    url = f"sqlite:///{tmp_path}/study.db"
    problem = make_problem(counting)
    OptunaDriver(n_trials=3, storage=url, study_name="s", progress=False).run(problem)
    study = optuna.load_study(study_name="s", storage=url)
    dead_layout, live_layout = _open_unpriced(study, problem, 2)
    dead = _held_by_another_machine(study, dead_layout, beat_age_s=STALE_S + 60)
    live = _held_by_another_machine(study, live_layout, beat_age_s=5)
    OptunaDriver(n_trials=6, storage=url, study_name="s", progress=False).run(problem)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert trials[dead].state == TrialState.FAIL
    assert trials[dead].user_attrs["reason"] == "worker died"
    assert trials[live].state == TrialState.RUNNING  # its machine stamped it 5 s ago


def test_a_search_prices_a_layout_whose_worker_died_while_it_ran(
        tmp_path: Path, counting: CountingModel) -> None:
    # The machine dies after this search started: the search meets the stale trial when it
    # samples that layout, fails it and prices the layout itself.
    problem, driver, storage, study = _searched_study(tmp_path, counting)
    (layout,) = _open_unpriced(study, problem, 1)
    dead = _held_by_another_machine(study, layout, beat_age_s=STALE_S + 60)
    index = LayoutIndex.of(problem)
    study.enqueue_trial(encode(index, index.params_of(index.rows[layout])))
    Worker(dataclasses.replace(driver, n_trials=4), problem, index, study, storage, 0).run()
    trials = study.get_trials(deepcopy=False)
    assert trials[dead].state == TrialState.FAIL
    priced = [t for t in trials if t.user_attrs.get("layout") == layout and is_evaluation(t)]
    assert len(priced) == 1 and priced[0].number > dead


def test_a_layout_whose_trial_was_stopped_is_queued_as_the_nearest_one(
        tmp_path: Path, counting: CountingModel) -> None:
    # A trial stopped by Ctrl-C or failed as its worker died keeps its layout's parameters,
    # and optuna's skip_if_exists took it for that layout queued already: next to a
    # duplicate or a rule's rejection the layout was never queued, and a resumed search
    # of every layout took 77 trials, not 2, to price the one layout stopped midway.
    problem, driver, storage, study = _searched_study(tmp_path, counting)
    index = LayoutIndex.of(problem)
    (layout,) = _open_unpriced(study, problem, 1)
    params = index.params_of(index.rows[layout])
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.FAIL, params=encode(index, params),
        distributions=study.trials[0].distributions,
        user_attrs={"layout": layout, "reason": "worker died"}))
    Worker(driver, problem, index, study, storage, 0).queue_nearest(
        params, study.get_trials(deepcopy=False))
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.user_attrs["layout"] for t in waiting] == [layout]


def test_a_trial_in_flight_is_stamped_until_it_ends(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db")
    trial = study.ask()
    with Heartbeat(trial, interval_s=0.05):
        first = study.get_trials(deepcopy=False)[0].user_attrs["heartbeat"]
        time.sleep(0.4)
        later = study.get_trials(deepcopy=False)[0].user_attrs["heartbeat"]
    study.tell(trial, 1.0)
    assert later - first >= 0.2  # stamped again while the evaluation ran


@pytest.mark.parametrize(("attrs", "expected"), [
    ({"worker": "gpu-node-17:4242", "heartbeat": 1000.0}, True),  # stamped 500 s ago
    ({"worker": "gpu-node-17:4242", "heartbeat": 1500.0 - STALE_S - 1}, False),
    ({"worker": "gpu-node-17:4242"}, True),  # no heartbeat to judge by: assumed alive
    ({"worker": f"{socket.gethostname()}:{2**22 + 7}", "heartbeat": 1500.0}, False),  # no pid
    ({"worker": f"{socket.gethostname()}:{os.getpid()}", "heartbeat": 0.0}, True),
])
def test_a_worker_is_alive_by_its_pid_here_and_its_heartbeat_elsewhere(
        attrs: dict[str, Any], expected: bool) -> None:
    trial = optuna.trial.create_trial(state=TrialState.RUNNING, user_attrs=attrs)
    assert alive(trial, now=1500.0) is expected


def test_the_command_line_runs_an_optuna_search_over_replayed_runs(
        tmp_path: Path, measurement_row: dict[str, Any], run_layoutsearch: Command) -> None:
    runs = tmp_path / "runs.csv"
    pd.DataFrame([{**measurement_row, "distributed_optimizer": True}]).to_csv(runs, index=False)
    done = run_layoutsearch("driver=optuna", "driver.n_trials=4", "driver.progress=false",
                            "cost_models=replay", f"cost_models.path={runs}",
                            "search_spaces.tp=[1,2]", f"hydra.run.dir={tmp_path / 'run'}",
                            cwd=tmp_path)
    ranked = pd.read_csv(tmp_path / "run" / "ranked.csv")
    # The file measured one layout: the study prices it, and spends nothing on the others.
    assert done.returncode == 0, done.stderr
    assert len(ranked) == 1 and ranked["trial"].is_unique
    assert {*LAYOUT_COLUMNS, *PREDICTION_COLUMNS[:-1], "reason"} <= set(ranked.columns)
    best = ranked.iloc[0]
    assert bool(best["fits"]) and best["mfu"] == pytest.approx(measurement_row["mfu"])
    assert (best["tp"], best["attention"]) == (measurement_row["tp"], measurement_row["attention"])


def test_a_sample_with_no_fit_says_it_saw_only_part_of_the_space() -> None:
    # A 65B job on 16 GPUs: 192 of its layouts fit, but 3 sampled ones may all miss them.
    job = dict(model="llama_65b", num_gpus=16, seq_length=2048, global_batch_size=2048)
    for seed in range(10):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ranked = search(**job, driver={"name": "optuna", "n_trials": 3, "seed": seed,
                                           "progress": False})
        if not ranked["fits"].any():
            break
    assert not ranked["fits"].any(), "every seed's 3 trials found a layout that fits"
    assert ranked.attrs["message"].startswith(
        "none of the 3 layouts the optuna driver evaluated (of 2240 in the space) fits; raise "
        "its n_trials, or price every layout with driver=grid")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_a_finalizer_swallowed_still_stops_the_search(counting: CountingModel) -> None:
    # One Ctrl-C in ten landed in a weakref callback of a search over the default space and
    # was lost: the search ran on to its n_trials (100,000) as if nothing had been pressed.
    class SwallowsCtrlC(CountingModel):
        def score(self, candidates: pd.DataFrame,
                  clusters: Mapping[str, ClusterSpec]) -> pd.DataFrame:
            if len(self.priced()) == 2:
                finalized = PressesCtrlCWhileFinalized()
                del finalized
            return super().score(candidates, clusters)

    model = SwallowsCtrlC(counting.log)
    with pytest.raises(KeyboardInterrupt):
        OptunaDriver(n_trials=12, progress=False).run(make_problem(model))
    assert len(model.priced()) == 3  # the trial the press landed in, then no other


@pytest.mark.parametrize("url", ["sqlite:///{}/study.db", "{}/study.log"])
def test_a_ctrl_c_inside_a_storage_write_is_raised_once_the_write_is_made(
        tmp_path, monkeypatch, url):
    # Raised midway (between SQLite's BEGIN IMMEDIATE and its COMMIT), it left a connection
    # holding the write lock: failing the trial in flight then waited 60 s for it and
    # stopped the search with "database is locked" instead of the Ctrl-C.
    url = url.format(tmp_path)
    study = optuna.create_study(storage=open_storage(url), study_name="s")
    trial = study.ask()
    if url.startswith("sqlite"):
        real = optuna.storages._rdb.storage._create_scoped_session

        @contextlib.contextmanager
        def pressed_before_the_commit(scoped, ignore_integrity_error=False):
            with real(scoped, ignore_integrity_error) as session:
                yield session
                signal.raise_signal(signal.SIGINT)  # the rows written, not committed yet

        monkeypatch.setattr(optuna.storages._rdb.storage, "_create_scoped_session",
                            pressed_before_the_commit)
    else:
        append_logs = JournalFileBackend.append_logs

        def pressed_while_appending(self, logs):
            signal.raise_signal(signal.SIGINT)  # as the journal's lock file is held
            return append_logs(self, logs)

        monkeypatch.setattr(JournalFileBackend, "append_logs", pressed_while_appending)
    with pytest.raises(KeyboardInterrupt):
        trial.set_user_attr("layout", "tp1 pp1")
    monkeypatch.undo()
    # The write is whole, and the storage takes the next one at once: failing the trial.
    study.tell(trial, state=TrialState.FAIL)
    (stored,) = optuna.load_study(study_name="s", storage=open_storage(url)).trials
    assert stored.user_attrs == {"layout": "tp1 pp1"} and stored.state == TrialState.FAIL
