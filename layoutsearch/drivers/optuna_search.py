"""The optuna driver: Bayesian search (TPE) for layouts under a budget of evaluations.

Each trial samples the space's knobs. A layout that breaks a rule is never sent to the cost
model: the trial is recorded with the rule's reason and a violated constraint
(`trial.set_constraint`), which TPE and NSGA-II learn from. A layout already evaluated —
by this process, another worker or an earlier run of the study — is not evaluated again:
the trial reuses the stored value. A cost model that raises fails that trial (the error is
kept in its user attributes) and the search goes on. Studies live in any optuna storage
(`sqlite:///...`, a journal file, `postgresql://...`), so a killed search resumes where it
stopped and several workers share one study. This is the only module that imports optuna.

    ranked = search(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048,
                    driver={"name": "optuna", "n_trials": 40, "warm_start": "analytic"})
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import socket
import warnings
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
from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.problem import SearchProblem
from layoutsearch.progress import Progress
from layoutsearch.results import rank
from layoutsearch.space import KNOBS

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
RDB_HEARTBEAT_S = 60
"""A worker that stops beating this long (on another machine) has its trial failed."""


class _EvaluationFailed(Exception):
    """The cost model raised for one layout; optuna records the trial as FAIL."""


def open_storage(url: str | None) -> BaseStorage:
    """An optuna storage from a URL: none (in memory), RDB URL, or a journal file.

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
        return RDBStorage(url, heartbeat_interval=RDB_HEARTBEAT_S,
                          engine_kwargs={"connect_args": {"timeout": 60}}
                          if url.startswith("sqlite") else None)
    except Exception as error:
        raise LayoutSearchError(
            f"driver.storage={url!r}: cannot open it ({type(error).__name__}: {error}); use "
            "sqlite:///study.db, postgresql://user:password@host/db, a journal file ending "
            f"in {' or '.join(JOURNAL_SUFFIXES)}, or {JOURNAL_SCHEME}PATH"
        ) from None


def _plain(value: Any) -> Any:
    """A JSON-storable Python value (optuna keeps user attributes as JSON)."""
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and math.isnan(value) else value


@dataclass(frozen=True, slots=True)
class _Encoding:
    """The knobs a trial samples, and where each sampled layout sits in the candidates."""

    params: dict[str, tuple[Any, ...]]
    fixed: dict[str, Any]
    positions: dict[tuple[Any, ...], int]

    @classmethod
    def of(cls, problem: SearchProblem) -> _Encoding:
        axes = problem.space.axes()
        table = problem.candidates
        keys = zip(*(table[k].tolist() for k in KNOBS), strict=True)
        return cls(
            params={k: v for k, v in axes.items() if len(v) > 1},
            fixed={k: v[0] for k, v in axes.items() if len(v) == 1},
            positions={key: i for i, key in enumerate(keys)},
        )

    def layout(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        values = {**self.fixed, **params}
        # Sequence parallelism at tp = 1 is a no-op; the candidates keep only the "off" twin.
        values["sequence_parallel"] = bool(values["sequence_parallel"]) and values["tp"] > 1
        return tuple(values[k] for k in KNOBS)

    @staticmethod
    def label(layout: tuple[Any, ...]) -> str:
        return " ".join(f"{k}={v}" for k, v in zip(KNOBS, layout, strict=True))


def _is_evaluation(trial: FrozenTrial) -> bool:
    """A finished call of the cost model (the trials a budget counts)."""
    if "duplicate_of" in trial.user_attrs or not trial.user_attrs.get("evaluated"):
        return False
    return trial.state == TrialState.COMPLETE or "error" in trial.user_attrs


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
    n_startup_trials: int = 10
    """Random trials before TPE models the space."""
    multivariate: bool = True
    """TPE over the joint distribution of the knobs (they interact: tp·pp·dp = GPUs)."""
    storage: str | None = None
    """optuna storage URL or journal file; None keeps the study in memory."""
    study_name: str | None = None
    """Defaults to a name derived from the job, space and objectives, so rerunning the same
    command with the same storage resumes the study."""
    n_workers: int = 1
    """Local worker processes sharing the study (needs a storage)."""
    warm_start: str | None = None
    """A cost model (e.g. `analytic`) whose top-ranked feasible layouts are tried first."""
    warm_start_top_k: int = 5
    max_idle_trials: int = 2000
    """Stop after this many trials in a row that evaluated nothing (the sampler keeps
    proposing known or rule-breaking layouts)."""
    progress: bool | None = None
    """Show a progress line on stderr (None: on a terminal or LAYOUTSEARCH_PROGRESS=1)."""
    directions: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        objectives = [self.objectives] if isinstance(self.objectives, str) else self.objectives
        objectives = tuple(str(o) for o in objectives)
        for objective in objectives:
            if objective not in DIRECTIONS:
                raise LayoutSearchError(unknown_name_message("objective", objective, DIRECTIONS))
        if not objectives:
            raise LayoutSearchError("driver.objectives: needs at least one objective")
        if self.sampler not in SAMPLERS:
            raise LayoutSearchError(unknown_name_message("sampler", self.sampler, SAMPLERS))
        for name in ("n_trials", "n_workers", "warm_start_top_k", "max_idle_trials"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or int(value) != value
                                      or value < 1):
                raise LayoutSearchError(f"driver.{name}={value!r}: must be a positive integer")
        if self.n_workers > 1 and not self.storage:
            raise LayoutSearchError(
                f"driver.n_workers={self.n_workers}: workers share a study through a storage; "
                "set driver.storage=sqlite:///study.db or a journal file (study.log)"
            )
        self.objectives = objectives
        self.directions = tuple(DIRECTIONS[o] for o in objectives)

    # -- study ------------------------------------------------------------------------
    def fingerprint(self, problem: SearchProblem) -> dict[str, Any]:
        """What a study was created for; a study made for something else is refused."""
        print_ = {
            "job": problem.job.columns(),
            "space": {k: list(v) for k, v in problem.space.axes().items()},
            "objectives": list(self.objectives),
            "cost_model": problem.cost_model.name,
        }
        return dict(json.loads(json.dumps(print_, default=_plain)))

    def _study_name(self, fingerprint: Mapping[str, Any]) -> str:
        if self.study_name:
            return self.study_name
        digest = hashlib.sha1(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
        return f"layoutsearch-{digest[:12]}"

    def _sampler(self, worker: int) -> optuna.samplers.BaseSampler:
        seed = None if self.seed is None else self.seed + worker
        if self.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if self.sampler == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=self.n_startup_trials, multivariate=self.multivariate,
            constant_liar=True,  # running trials of other workers repel new samples
        )

    def open_study(self, problem: SearchProblem, worker: int = 0) -> optuna.Study:
        """Create the study, or load it and check that it was made for this search."""
        fingerprint = self.fingerprint(problem)
        name = self._study_name(fingerprint)
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
                f"study {name!r} in {self.storage!r} was created for another search: "
                + "; ".join(_differences(stored, fingerprint))
                + "; use another driver.study_name or storage"
            )
        return study

    def _warm_start(self, study: optuna.Study, problem: SearchProblem,
                    encoding: _Encoding) -> None:
        """Enqueue the best feasible layouts by the `warm_start` cost model (once per study)."""
        if not self.warm_start:
            return
        guess = SearchProblem(problem.job, problem.space, problem.candidates,
                              build_cost_model(self.warm_start), problem.clusters)
        ranked = rank(guess.evaluate(guess.feasible_candidates()))
        for _, row in ranked.head(self.warm_start_top_k).iterrows():
            params = {k: _plain(row[k]) for k in encoding.params}
            study.enqueue_trial(params, user_attrs={"warm_start": self.warm_start},
                                skip_if_exists=True)

    # -- search -----------------------------------------------------------------------
    def run(self, problem: SearchProblem) -> pd.DataFrame:
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # our progress line replaces it
        try:
            encoding = _Encoding.of(problem)
            study = self.open_study(problem)
            _fail_dead_workers(study)
            self._warm_start(study, problem, encoding)
            if self.n_workers == 1:
                self._optimize(study, problem, encoding, worker=0)
            else:
                _release(study)
                self._run_workers(problem)
            return self.results(study, problem, encoding)
        finally:
            optuna.logging.set_verbosity(verbosity)

    def _run_workers(self, problem: SearchProblem) -> None:
        # fork shares the problem with the workers without pickling it; spawn elsewhere.
        context = (multiprocessing.get_context("fork")
                   if "fork" in multiprocessing.get_all_start_methods()
                   else multiprocessing.get_context("spawn"))
        errors = context.SimpleQueue()
        workers = [context.Process(target=_worker, args=(self, problem, i, errors))
                   for i in range(self.n_workers)]
        for process in workers:
            process.start()
        for process in workers:
            process.join()
        messages = [errors.get() for _ in range(sum(p.exitcode != 0 for p in workers))
                    if not errors.empty()]
        if any(p.exitcode != 0 for p in workers):
            codes = [p.exitcode for p in workers]
            raise LayoutSearchError(
                f"optuna workers failed (exit codes {codes}): {'; '.join(messages)}"
            )

    def _optimize(self, study: optuna.Study, problem: SearchProblem, encoding: _Encoding,
                  worker: int) -> None:
        objective = _Objective(self, problem, encoding, worker)
        if objective.should_stop(study):
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.optimize(objective, n_trials=None, timeout=self.timeout,
                           catch=(_EvaluationFailed,), callbacks=[objective.after_trial])
        objective.progress.close()

    # -- results ----------------------------------------------------------------------
    def results(self, study: optuna.Study, problem: SearchProblem,
                encoding: _Encoding) -> pd.DataFrame:
        """One row per evaluated layout: the candidate, its costs, the trial that priced it."""
        evaluated = [t for t in study.get_trials(deepcopy=False) if _is_evaluation(t)]
        positions = [encoding.positions[encoding.layout(t.params)] for t in evaluated]
        rows = problem.candidates.iloc[positions].drop(columns="rule_reason")
        costs = pd.DataFrame(
            [t.user_attrs.get("costs") or {"fits": False, "reason": t.user_attrs["error"]}
             for t in evaluated],
            index=rows.index,
        )
        for column in ("mfu", "step_time_s", "tokens_per_s", "peak_memory_gib"):
            costs[column] = (pd.to_numeric(costs[column], errors="coerce")
                             if column in costs.columns else np.nan)
        costs["fits"] = costs["fits"].fillna(False).astype(bool)
        costs["reason"] = costs["reason"].fillna("").astype(str)
        out = rows.join(costs)
        out["trial"] = np.array([t.number for t in evaluated], dtype=np.int64)
        if len(self.objectives) > 1:
            front = {t.number for t in study.best_trials}
            out["pareto"] = out["trial"].isin(front)
        return out.reset_index(drop=True)


def _differences(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    out = []
    for part in wanted:
        old, new = stored.get(part), wanted[part]
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
    """Fail running trials left by a killed worker of this host, so their layouts reopen."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get("worker")
        if worker and not _alive(worker):
            study._storage.set_trial_user_attr(trial._trial_id, "reason", "worker died")
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)


def _worker(driver: OptunaDriver, problem: SearchProblem, index: int, errors: Any) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = driver.open_study(problem, worker=index)
        driver._optimize(study, problem, _Encoding.of(problem), worker=index)
    except BaseException as error:
        errors.put(f"worker {index}: {type(error).__name__}: {error}")
        raise SystemExit(1) from None


class _Objective:
    """One trial: map the sample to a layout, then reject, reuse or evaluate it."""

    def __init__(self, driver: OptunaDriver, problem: SearchProblem, encoding: _Encoding,
                 worker: int) -> None:
        self.driver = driver
        self.problem = problem
        self.encoding = encoding
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.feasible = int((problem.candidates["rule_reason"] == "").sum())
        self.worst = tuple(0.0 if d == "maximize" else math.inf for d in driver.directions)
        self.idle = 0
        label = "optuna" if driver.n_workers == 1 else f"optuna worker {worker}"
        self.progress = Progress(total=driver.n_trials, label=label, enabled=driver.progress)

    def __call__(self, trial: Trial) -> tuple[float, ...]:
        params = {k: trial.suggest_categorical(k, v) for k, v in self.encoding.params.items()}
        layout = self.encoding.layout(params)
        label = self.encoding.label(layout)
        trial.set_user_attr("layout", label)
        trial.set_user_attr("worker", self.worker)
        position = self.encoding.positions.get(layout)
        reason = ("not a candidate of this search" if position is None
                  else str(self.problem.candidates["rule_reason"].iat[position]))
        if reason:
            trial.set_user_attr("reason", reason)
            trial.set_constraint("rules", 1.0)
            return self.worst
        assert position is not None
        for other in trial.study.get_trials(deepcopy=False):
            if other.number == trial.number or other.user_attrs.get("layout") != label:
                continue
            if other.state == TrialState.RUNNING:
                # Another worker is pricing it; both may back off, neither evaluates twice.
                trial.set_user_attr("reason", f"being evaluated in trial {other.number}")
                raise optuna.TrialPruned()
            if _is_evaluation(other):
                return self._reuse(trial, other)
        return self._evaluate(trial, position)

    def _reuse(self, trial: Trial, other: FrozenTrial) -> tuple[float, ...]:
        trial.set_user_attr("duplicate_of", other.number)
        trial.set_user_attr("reason", other.user_attrs.get("reason", ""))
        if other.state != TrialState.COMPLETE:  # the cost model failed on this layout
            trial.set_constraint("fits", 1.0)
            return self.worst
        for key, value in other.constraints.items():
            trial.set_constraint(key, value)
        return tuple(other.values)

    def _evaluate(self, trial: Trial, position: int) -> tuple[float, ...]:
        trial.set_user_attr("evaluated", True)
        try:
            scored = self.problem.evaluate(self.problem.candidates.iloc[[position]])
        except Exception as error:
            message = f"cost model error: {type(error).__name__}: {error}"
            trial.set_user_attr("error", message)
            trial.set_user_attr("reason", message)
            raise _EvaluationFailed(message) from error
        self.progress.update(scored)
        row = scored.iloc[0]
        costs = {c: _plain(row[c]) for c in scored.columns
                 if c not in self.problem.candidates.columns}
        trial.set_user_attr("costs", costs)
        trial.set_user_attr("reason", str(row["reason"]))
        values = tuple(float(row[o]) for o in self.driver.objectives)
        feasible = bool(row["fits"]) and all(math.isfinite(v) for v in values)
        trial.set_constraint("fits", 0.0 if feasible else 1.0)
        return values if feasible else self.worst

    def should_stop(self, study: optuna.Study) -> bool:
        trials = study.get_trials(deepcopy=False)
        evaluations = [t for t in trials if _is_evaluation(t)]
        if self.driver.n_trials is not None and len(evaluations) >= self.driver.n_trials:
            return True
        if len({t.user_attrs["layout"] for t in evaluations}) >= self.feasible:
            return True  # every layout that passes the rules has been priced
        target = self.driver.target
        if target is not None:
            sign = 1.0 if self.driver.directions[0] == "maximize" else -1.0
            return any(t.state == TrialState.COMPLETE and not any(
                v > 0 for v in t.constraints.values()) and sign * (t.values[0] - target) >= 0
                for t in evaluations)
        return False

    def after_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.idle = 0 if _is_evaluation(trial) else self.idle + 1
        if self.idle >= self.driver.max_idle_trials:
            warnings.warn(
                f"optuna search stopped: {self.idle} trials in a row proposed layouts that "
                "were already evaluated or break a rule", stacklevel=1,
            )
            study.stop()
        elif self.should_stop(study):
            study.stop()
