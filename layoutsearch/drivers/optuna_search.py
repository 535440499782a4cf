"""The optuna driver: Bayesian search (TPE) for layouts under a budget of evaluations.

Each trial samples the space's knobs (ask/tell). A layout that breaks a rule is never sent
to the cost model: the trial is recorded with the rule's reason and a violated constraint
(`trial.set_constraint`), which TPE and NSGA-II learn from. A layout already evaluated — by
this process, another worker or an earlier run of the study — is not evaluated again: the
trial reuses the stored value. Either way the nearest layout that can still be evaluated
is queued next (`layout_index.py`), so few-feasible spaces do not stall the search. A cost
model that raises fails that trial (the error is kept in its user attributes) and the
search goes on. Studies live in any optuna storage (`sqlite:///...`, a journal file,
`postgresql://...`): a killed search resumes where it stopped and workers share a study.
This is the only module that imports optuna.

    ranked = search(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048,
                    driver={"name": "optuna", "n_trials": 40, "warm_start": "analytic"})
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import multiprocessing
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
from optuna.storages import BaseStorage, InMemoryStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, Trial, TrialState

from layoutsearch.costs import build_cost_model
from layoutsearch.costs.base import cost_model_fingerprint
from layoutsearch.drivers.layout_index import LayoutIndex
from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.problem import SearchProblem
from layoutsearch.progress import Progress
from layoutsearch.results import rank
from layoutsearch.space import INTEGER_KNOBS

DIRECTIONS = {
    "mfu": "maximize", "tokens_per_s": "maximize",
    "step_time_s": "minimize", "peak_memory_gib": "minimize", "num_gpus": "minimize",
}
"""The objectives a study may optimize, each with its direction."""
SAMPLERS = ("tpe", "nsga2", "random")
JOURNAL_SUFFIXES = (".log", ".journal")
JOURNAL_SCHEME = "journal://"
FINGERPRINT_ATTR = "layoutsearch"
"""Study user attribute holding the job, space, objectives and cost model it was made for."""
Outcome = tuple[TrialState, tuple[float, ...] | None]
UNCLAIMED_S = 30.0
"""A running trial without a worker after this long was orphaned before it was claimed."""
UNPRICED: dict[str, Any] = {
    "mfu": None, "step_time_s": None, "tokens_per_s": None, "peak_memory_gib": None,
    "fits": False, "reason": "",
}
"""Cost columns of an evaluation that returned nothing (the cost model raised)."""


def open_storage(url: str | None) -> BaseStorage:
    """An optuna storage from a URL: none (in memory), an RDB URL, or a journal file.

    A journal file is a path ending in `.log`/`.journal`, or any path as `journal://PATH`.
    """
    if not url:
        return InMemoryStorage()
    journal = url[len(JOURNAL_SCHEME):] if url.startswith(JOURNAL_SCHEME) else None
    if journal is None and "://" not in url and url.endswith(JOURNAL_SUFFIXES):
        journal = url
    try:
        if journal is not None:
            if not Path(journal).parent.is_dir():
                raise FileNotFoundError(f"folder {str(Path(journal).parent)!r} does not exist")
            return JournalStorage(JournalFileBackend(journal))
        if "://" not in url:
            raise ValueError("not a storage URL")
        if not url.startswith("sqlite"):
            return RDBStorage(url)
        # Wait for other workers' writes instead of failing with "database is locked".
        storage = RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
        _serialize_sqlite(storage.engine)
        return storage
    except Exception as error:
        raise LayoutSearchError(
            f"driver.storage={url!r}: cannot open it ({type(error).__name__}: {error}); use "
            "sqlite:///study.db, postgresql://user:password@host/db, a journal file ending "
            f"in {' or '.join(JOURNAL_SUFFIXES)}, or {JOURNAL_SCHEME}PATH"
        ) from None


def _serialize_sqlite(engine: Any) -> None:
    """Make every SQLite transaction take the write lock first (BEGIN IMMEDIATE).

    SQLite ignores SELECT ... FOR UPDATE, so two workers could both read a queued trial as
    WAITING and both start it; taking the lock at BEGIN makes that read-then-write atomic.
    Recipe from SQLAlchemy's pysqlite notes ("Serializable isolation / Savepoints").
    """
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(connection: Any, record: Any) -> None:
        connection.isolation_level = None  # let the "begin" hook below issue BEGIN

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the hooks existed are dropped


def _plain(value: Any) -> Any:
    """A JSON-storable Python value (optuna keeps user attributes as JSON)."""
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and math.isnan(value) else value


def _is_evaluation(trial: FrozenTrial) -> bool:
    """A finished call of the cost model (the trials a budget counts)."""
    if "duplicate_of" in trial.user_attrs or not trial.user_attrs.get("evaluated"):
        return False
    return trial.state == TrialState.COMPLETE or "error" in trial.user_attrs


def _feasible(trial: FrozenTrial) -> bool:
    return trial.state == TrialState.COMPLETE and all(
        v <= 0 for v in trial.constraints.values())


def _alive(worker: str) -> bool:
    """Whether the worker `host:pid` may still run; only this host's processes are checked."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


@dataclass(kw_only=True, slots=True)
class OptunaDriver:
    """Sample layouts with optuna until `n_trials` evaluations, `timeout` or `target`."""

    name: str = field(default="optuna", init=False)
    n_trials: int | None = 50
    """Evaluations (cost-model calls) for the whole study, resumed runs included; rule
    rejections and duplicates are trials too but cost nothing and do not count."""
    timeout: float | None = None
    """Seconds each worker searches (None: no limit)."""
    target: float | None = None
    """Stop once a feasible layout reaches this value of the first objective."""
    objectives: Sequence[str] = ("mfu",)
    """Columns to optimize, directions from DIRECTIONS; two or more give a Pareto front."""
    sampler: str = "tpe"
    seed: int | None = 0
    """Sampler seed; worker i of `n_workers` uses seed + i."""
    n_startup_trials: int = 20
    """Random trials before TPE models the space (rule rejections count: they are trials).
    20 beat 10 and 5 on benchmarks/search_efficiency.py."""
    multivariate: bool = True
    """TPE over the joint distribution of the knobs (they interact: tp·pp·dp = GPUs)."""
    storage: str | None = None
    """optuna storage URL or journal file; None keeps the study in memory."""
    study_name: str | None = None
    """Defaults to a name derived from the job, space, objectives and cost model, so
    rerunning the same command against the same storage resumes the study."""
    n_workers: int = 1
    """Local worker processes sharing the study (needs a storage)."""
    warm_start: str | None = None
    """A cost model (e.g. `analytic`) whose top-ranked feasible layouts are tried first."""
    warm_start_top_k: int = 5
    progress: bool | None = None
    """Show a progress line on stderr (None: on a terminal or LAYOUTSEARCH_PROGRESS=1)."""
    directions: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        objectives = [self.objectives] if isinstance(self.objectives, str) else self.objectives
        self.objectives = tuple(str(o) for o in objectives)
        if not self.objectives:
            raise LayoutSearchError("driver.objectives: needs at least one objective")
        for objective in self.objectives:
            if objective not in DIRECTIONS:
                raise LayoutSearchError(unknown_name_message("objective", objective, DIRECTIONS))
        if self.sampler not in SAMPLERS:
            raise LayoutSearchError(unknown_name_message("sampler", self.sampler, SAMPLERS))
        for name in ("timeout", "target"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or (name == "timeout" and value <= 0)):
                rule = "a positive number of seconds" if name == "timeout" else "a number"
                raise LayoutSearchError(f"driver.{name}={value!r}: must be {rule}")
        for name in ("n_trials", "n_workers", "warm_start_top_k"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise LayoutSearchError(f"driver.{name}={value!r}: must be a positive integer")
        if self.n_workers > 1 and not self.storage:
            raise LayoutSearchError(
                f"driver.n_workers={self.n_workers}: workers share a study through a storage; "
                "set driver.storage=sqlite:///study.db or a journal file (study.log)"
            )
        self.directions = tuple(DIRECTIONS[o] for o in self.objectives)

    def fingerprint(self, problem: SearchProblem) -> dict[str, Any]:
        """What a study was made for; a study made for another search is refused."""
        made_for = {
            "job": problem.job.columns(),
            "space": {k: list(v) for k, v in problem.space.axes().items()},
            "objectives": list(self.objectives),
            "cost_model": cost_model_fingerprint(problem.cost_model),
        }
        return dict(json.loads(json.dumps(made_for, default=_plain)))

    def open_study(self, problem: SearchProblem, worker: int = 0) -> optuna.Study:
        """Create the study, or load it and check that it was made for this search."""
        fingerprint = self.fingerprint(problem)
        digest = hashlib.sha1(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
        name = self.study_name or f"layoutsearch-{digest[:12]}"
        storage = open_storage(self.storage)
        try:
            study = optuna.create_study(
                storage=storage, study_name=name, sampler=self._sampler(worker),
                directions=[StudyDirection[d.upper()] for d in self.directions],
                load_if_exists=True,
            )
        except Exception as error:
            raise LayoutSearchError(
                f"driver.storage={self.storage!r}: cannot open study {name!r} "
                f"({type(error).__name__}: {error})"
            ) from None
        stored = study.user_attrs.get(FINGERPRINT_ATTR)
        if stored is None:
            study.set_user_attr(FINGERPRINT_ATTR, fingerprint)
        elif stored != fingerprint:
            raise LayoutSearchError(
                f"study {name!r} in {self.storage!r} was made for another search: "
                + "; ".join(_differences(stored, fingerprint))
                + "; use another driver.study_name or driver.storage"
            )
        return study

    def _sampler(self, worker: int) -> optuna.samplers.BaseSampler:
        seed = None if self.seed is None else self.seed + worker
        if self.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if self.sampler == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=self.n_startup_trials, multivariate=self.multivariate,
            constant_liar=True,  # other workers' running trials repel new samples
        )

    def run(self, problem: SearchProblem) -> pd.DataFrame:
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # our progress line replaces it
        try:
            index = LayoutIndex.of(problem)
            study = self.open_study(problem)
            _fail_dead_workers(study)
            self._warm_start(study, problem, index)
            if self.n_workers == 1:
                _Worker(self, problem, index, study, 0).run()
            else:
                _release(study)
                self._run_workers(problem)
            return self.results(study, problem, index)
        finally:
            optuna.logging.set_verbosity(verbosity)

    def _warm_start(self, study: optuna.Study, problem: SearchProblem,
                    index: LayoutIndex) -> None:
        """Queue the best feasible layouts by the `warm_start` cost model (once per study)."""
        if not self.warm_start:
            return
        guess = SearchProblem(problem.job, problem.space, problem.candidates,
                              build_cost_model(self.warm_start), problem.clusters)
        ranked = rank(guess.evaluate(guess.feasible_candidates()))
        for _, row in ranked.head(self.warm_start_top_k).iterrows():
            params = {k: _plain(row[k]) for k in index.params}
            study.enqueue_trial(_encode(index, params), skip_if_exists=True, user_attrs={
                "warm_start": self.warm_start, "layout": index.label(params)})

    def _run_workers(self, problem: SearchProblem) -> None:
        # fork shares the problem with the workers without pickling it; spawn elsewhere.
        context = (multiprocessing.get_context("fork")
                   if "fork" in multiprocessing.get_all_start_methods()
                   else multiprocessing.get_context("spawn"))
        errors = context.SimpleQueue()
        workers = [context.Process(target=_work, args=(self, problem, i, errors))
                   for i in range(self.n_workers)]
        for process in workers:
            process.start()
        for process in workers:
            process.join()
        if any(p.exitcode != 0 for p in workers):
            messages = []
            while not errors.empty():
                messages.append(errors.get())
            raise LayoutSearchError(
                f"optuna workers failed (exit codes {[p.exitcode for p in workers]}): "
                + "; ".join(messages)
            )

    def results(self, study: optuna.Study, problem: SearchProblem,
                index: LayoutIndex) -> pd.DataFrame:
        """One row per evaluated layout: the candidate, its costs, the trial that priced it."""
        evaluated = [t for t in study.get_trials(deepcopy=False) if _is_evaluation(t)]
        rows = problem.candidates.iloc[[index.rows[t.user_attrs["layout"]] for t in evaluated]]
        records = [{**UNPRICED, **(t.user_attrs.get("costs")
                                   or {"reason": t.user_attrs.get("error", "")})}
                   for t in evaluated]
        costs = pd.DataFrame(records, index=rows.index, columns=list(UNPRICED) if not records
                             else None)
        for column in ("mfu", "step_time_s", "tokens_per_s", "peak_memory_gib"):
            costs[column] = pd.to_numeric(costs[column], errors="coerce")
        costs["fits"] = costs["fits"].fillna(False).astype(bool)
        costs["reason"] = costs["reason"].fillna("").astype(str)
        out = rows.drop(columns="rule_reason").join(costs)
        out["trial"] = np.array([t.number for t in evaluated], dtype=np.int64)
        if len(self.objectives) > 1:
            out["pareto"] = out["trial"].isin({t.number for t in study.best_trials})
        out = out.reset_index(drop=True)
        out.attrs["study_name"] = study.study_name
        out.attrs["trials"] = len(study.get_trials(deepcopy=False))
        return out


def _differences(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    out = []
    for part, new in wanted.items():
        old = stored.get(part)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            out += [f"{part} {key}: study {old.get(key)!r}, this search {new.get(key)!r}"
                    for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
        elif old != new:
            out.append(f"{part}: study {old!r}, this search {new!r}")
    return out


def _release(study: optuna.Study) -> None:
    """Close the parent's database connections before forking workers that open their own."""
    engine = getattr(getattr(study._storage, "_backend", study._storage), "engine", None)
    if engine is not None:
        engine.dispose()


def _fail_dead_workers(study: optuna.Study) -> None:
    """Fail running trials left by a killed worker of this host, so their layouts reopen.

    A trial is claimed (its `worker` attribute set) right after it is created; one still
    unclaimed after UNCLAIMED_S lost its worker in between, wherever it ran.
    """
    now = datetime.datetime.now()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get("worker")
        started = trial.datetime_start or now
        if (not _alive(worker) if worker
                else (now - started).total_seconds() > UNCLAIMED_S):
            study._storage.set_trial_user_attr(trial._trial_id, "reason", "worker died")
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)


def _work(driver: OptunaDriver, problem: SearchProblem, number: int, errors: Any) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = driver.open_study(problem, worker=number)
        _Worker(driver, problem, LayoutIndex.of(problem), study, number).run()
    except BaseException as error:
        errors.put(f"worker {number}: {type(error).__name__}: {error}")
        raise SystemExit(1) from None


class _Worker:
    """Asks for trials and answers each: reject, reuse or evaluate its layout."""

    def __init__(self, driver: OptunaDriver, problem: SearchProblem, index: LayoutIndex,
                 study: optuna.Study, number: int) -> None:
        self.driver, self.problem, self.index, self.study = driver, problem, index, study
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.worst = tuple(0.0 if d == "maximize" else math.inf for d in driver.directions)
        self.rng = np.random.default_rng(None if driver.seed is None else driver.seed + number)
        label = "optuna" if driver.n_workers == 1 else f"optuna worker {number}"
        self.progress = Progress(total=driver.n_trials, label=label, enabled=driver.progress)

    def run(self) -> None:
        deadline = time.monotonic() + (self.driver.timeout or math.inf)
        with self.progress:
            while not self.done() and time.monotonic() < deadline:
                trial = self.study.ask()
                trial.set_user_attr("worker", self.worker)
                state, values = self.answer(trial)
                self.study.tell(trial, values, state=state)

    def done(self) -> bool:
        trials = self.study.get_trials(deepcopy=False)
        evaluations = [t for t in trials if _is_evaluation(t)]
        budget = self.driver.n_trials
        if budget is not None and len(evaluations) >= budget:
            return True
        if len(evaluations) >= len(self.index.open):
            return True  # every layout that passes the rules has been priced
        target = self.driver.target
        if target is None:
            return False
        sign = 1.0 if self.driver.directions[0] == "maximize" else -1.0
        return any(_feasible(t) and sign * (t.values[0] - target) >= 0 for t in evaluations)

    def answer(self, trial: Trial) -> Outcome:
        params = {
            k: (v[trial.suggest_int(k, 0, len(v) - 1)] if k in INTEGER_KNOBS
                else trial.suggest_categorical(k, v))
            for k, v in self.index.params.items()
        }
        label = self.index.label(params)
        trial.set_user_attr("layout", label)
        position = self.index.rows.get(label)
        reason = ("not a candidate of this search" if position is None
                  else str(self.problem.candidates["rule_reason"].iat[position]))
        trials = self.study.get_trials(deepcopy=False)
        if reason:
            trial.set_user_attr("reason", reason)
            trial.set_constraint("rules", 1.0)
            self.queue_nearest(params, trials)
            return TrialState.COMPLETE, self.worst
        for other in trials:
            if other.number == trial.number or other.user_attrs.get("layout") != label:
                continue
            if other.state == TrialState.RUNNING:
                # Another worker is pricing it; if both back off, neither evaluates twice.
                trial.set_user_attr("reason", f"being evaluated in trial {other.number}")
                self.queue_nearest(params, trials)
                return TrialState.PRUNED, None
            if _is_evaluation(other):
                self.queue_nearest(params, trials)
                return self.reuse(trial, other)
        assert position is not None
        return self.evaluate(trial, position)

    def queue_nearest(self, params: Mapping[str, Any], trials: list[FrozenTrial]) -> None:
        """Queue the closest layout nobody has priced, is pricing or has queued."""
        taken = {self.index.rows[t.user_attrs["layout"]] for t in trials
                 if t.user_attrs.get("layout") in self.index.rows
                 and (_is_evaluation(t) or t.state in (TrialState.RUNNING, TrialState.WAITING))}
        nearest = self.index.nearest(params, taken, self.rng)
        if nearest is not None:
            near = self.index.params_of(nearest)
            self.study.enqueue_trial(_encode(self.index, near), skip_if_exists=True,
                                     user_attrs={"layout": self.index.labels[nearest]})

    def reuse(self, trial: Trial, other: FrozenTrial) -> Outcome:
        trial.set_user_attr("duplicate_of", other.number)
        trial.set_user_attr("reason", other.user_attrs.get("reason", ""))
        if other.state != TrialState.COMPLETE:  # the cost model failed on this layout
            trial.set_constraint("fits", 1.0)
            return TrialState.COMPLETE, self.worst
        for key, value in other.constraints.items():
            trial.set_constraint(key, value)
        return TrialState.COMPLETE, tuple(other.values)

    def evaluate(self, trial: Trial, position: int) -> Outcome:
        trial.set_user_attr("evaluated", True)
        try:
            scored = self.problem.evaluate(self.problem.candidates.iloc[[position]])
        except Exception as error:
            message = f"cost model error: {type(error).__name__}: {error}"
            trial.set_user_attr("error", message)
            trial.set_user_attr("reason", message)
            return TrialState.FAIL, None
        self.progress.update(scored)
        row = scored.iloc[0]
        trial.set_user_attr("costs", {c: _plain(row[c]) for c in scored.columns
                                      if c not in self.problem.candidates.columns})
        trial.set_user_attr("reason", str(row["reason"]))
        values = tuple(float(row[o]) for o in self.driver.objectives)
        feasible = bool(row["fits"]) and all(math.isfinite(v) for v in values)
        trial.set_constraint("fits", 0.0 if feasible else 1.0)
        return TrialState.COMPLETE, values if feasible else self.worst


def _encode(index: LayoutIndex, params: Mapping[str, Any]) -> dict[str, Any]:
    """Trial parameters of a layout: integer knobs as positions in their ordered values."""
    return {k: index.params[k].index(v) if k in INTEGER_KNOBS else v for k, v in params.items()}
