"""The optuna driver: Bayesian search (TPE) for layouts under a budget of evaluations.

Each trial samples the space's knobs (ask/tell). A layout that breaks a rule is never sent
to the cost model: the trial is recorded with the rule's reason and a violated constraint
(`trial.set_constraint`), which TPE and NSGA-II learn from. So is a layout the cost model
says it has no figures for (`unpriced` in costs/base.py: a replay's unmeasured layouts, a
measured model's flash1 ones), so that `n_trials` counts layouts that get a price. A layout
already evaluated — by this process, another worker or an earlier run of the study — is not
evaluated again: the trial reuses the stored value, unless the cost model says that price is
to be asked again (`reprices`: a measured model's `retry` statuses), in which case the
layout is queued first when the search starts. Either way the nearest layout that can
still be evaluated is queued next (`layout_index.py`), so few-feasible spaces do not stall
the search. A cost model that raises fails that trial (the error is kept in its user
attributes) and the search goes on; a later search asks that layout again if the cost model
reprices what recorded nothing (a measured model). Studies live in any optuna storage
(`sqlite:///...`, a journal file, `postgresql://...`): a killed search resumes where it
stopped and workers share a study. The package `drivers/optuna/` is the only code that
imports optuna.

    ranked = search(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048,
                    driver={"name": "optuna", "n_trials": 40, "warm_start": "analytic"})
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
import pandas as pd
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import TrialState

from layoutsearch.costs import build_cost_model
from layoutsearch.costs.base import (
    cost_model_fingerprint,
    fingerprint_covers,
    recorded_rows,
    reprices,
)
from layoutsearch.costs.measured import MeasuredCostModel
from layoutsearch.drivers.layout_index import LayoutIndex
from layoutsearch.drivers.optuna.storage import fail_dead_workers, open_storage, release
from layoutsearch.drivers.optuna.worker import (
    UNPRICED,
    EvaluationBudget,
    Worker,
    encode,
    plain,
    standing,
    work,
)
from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.interrupts import noticing_interrupts
from layoutsearch.problem import SearchProblem
from layoutsearch.results import rank
from layoutsearch.specs import ClusterSpec

DIRECTIONS = {
    "mfu": "maximize", "tokens_per_s": "maximize",
    "step_time_s": "minimize", "peak_memory_gib": "minimize", "num_gpus": "minimize",
}
"""The objectives a study may optimize, each with its direction."""
SAMPLERS = ("tpe", "nsga2", "random")
FINGERPRINT_ATTR = "layoutsearch"
"""Study user attribute holding the job, space, objectives and cost model it was made for."""
SAMPLING_ATTR = "layoutsearch_sampling"
"""Study user attribute of a study under the earlier default name: the sampler settings of
the first search that resumed it, which later searches with other settings leave alone."""


def _study_name_of(made_for: Mapping[str, Any]) -> str:
    """`layoutsearch-<digest>`: the first 12 hex digits of the sha1 of `made_for` as JSON."""
    digest = hashlib.sha1(json.dumps(made_for, sort_keys=True).encode()).hexdigest()
    return f"layoutsearch-{digest[:12]}"


def _finite(value: float) -> bool:
    """A number a float can hold that is not NaN or infinite (an int past 1.8e308 is not:
    math.isfinite raises OverflowError on it, and so would a deadline computed from it)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


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
    """Defaults to a name derived from the job, space, objectives, cost model and sampler
    settings (`default_study_name`), so rerunning the same command against the same storage
    resumes the study."""
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
        # A scalar (false, 1, null) is no list of names, and a mapping would pass as its keys.
        if isinstance(objectives, Mapping) or not isinstance(objectives, Sequence):
            raise LayoutSearchError(
                f"driver.objectives={self.objectives!r}: must be an objective or a list of "
                f"them (e.g. [mfu]), of {', '.join(DIRECTIONS)}")
        self.objectives = tuple(str(o) for o in objectives)
        if not self.objectives:
            raise LayoutSearchError("driver.objectives: needs at least one objective")
        for objective in self.objectives:
            if objective not in DIRECTIONS:
                raise LayoutSearchError(unknown_name_message("objective", objective, DIRECTIONS))
        if len(set(self.objectives)) < len(self.objectives):
            raise LayoutSearchError(
                f"driver.objectives={list(self.objectives)}: names an objective twice")
        if self.sampler not in SAMPLERS:
            raise LayoutSearchError(unknown_name_message("sampler", self.sampler, SAMPLERS))
        for name in ("timeout", "target"):
            value = getattr(self, name)
            # NaN and inf never compare as reached: a search told to stop there never stops
            # by it, and a NaN timeout stops it before its first trial.
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not _finite(value)
                                      or (name == "timeout" and value <= 0)):
                rule = ("a finite positive number of seconds (null: no limit)"
                        if name == "timeout" else "a finite number")
                raise LayoutSearchError(f"driver.{name}={value!r}: must be {rule}")
        for name in ("n_trials", "n_workers", "warm_start_top_k"):
            value = getattr(self, name)
            # Only n_trials has a meaning for null (no limit).
            if (value is not None or name != "n_trials") and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise LayoutSearchError(f"driver.{name}={value!r}: must be a positive integer")
        # The seed offsets per worker and numpy's RNG wants 0 .. 2**32 - 1.
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(
                self.seed, int) or not 0 <= self.seed < 2**32):
            raise LayoutSearchError(
                f"driver.seed={self.seed!r}: must be null or an integer in 0 .. 2**32 - 1")
        if self.seed is not None and self.seed + self.n_workers > 2**32:
            # The last worker's seed would be refused as its study opens, after the others ran.
            raise LayoutSearchError(
                f"driver.seed={self.seed}: worker i of driver.n_workers={self.n_workers} samples "
                f"with seed + i, which must stay below 2**32; use a seed of at most "
                f"{2**32 - self.n_workers}")
        if isinstance(self.n_startup_trials, bool) or not isinstance(
                self.n_startup_trials, int) or self.n_startup_trials < 0:
            raise LayoutSearchError(
                f"driver.n_startup_trials={self.n_startup_trials!r}: must be an integer >= 0")
        for name in ("multivariate", "progress"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "progress" and value is None):
                allowed = "true, false or null" if name == "progress" else "true or false"
                raise LayoutSearchError(f"driver.{name}={value!r}: must be {allowed}")
        for name in ("storage", "study_name", "warm_start"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise LayoutSearchError(
                    f"driver.{name}={value!r}: must be null or a non-empty string")
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
            # The GPU's and fabric's figures price every layout; the job names only the kind.
            "cluster": _cluster_fields(problem.job.cluster),
            "space": {k: list(v) for k, v in problem.space.axes().items()},
            "objectives": list(self.objectives),
            "cost_model": cost_model_fingerprint(problem.cost_model),
        }
        return dict(json.loads(json.dumps(made_for, default=plain)))

    def open_study(self, problem: SearchProblem, storage: BaseStorage,
                   worker: int = 0) -> optuna.Study:
        """Create the study in `storage`, or load it and check it was made for this search."""
        fingerprint = self.fingerprint(problem)
        name = self.study_name or self._default_or_earlier_name(fingerprint, storage)
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
        wanted = [StudyDirection[d.upper()] for d in self.directions]
        if stored is None and (study.trials or list(study.directions) != wanted):
            # A study of that name made by someone else: its trials are not layouts, and an
            # MFU maximized in a minimize study would take the worst layout for the best.
            directions = ", ".join(d.name.lower() for d in study.directions)
            raise LayoutSearchError(
                f"study {name!r} in {self.storage!r} was not made by layoutsearch ("
                f"{len(study.trials)} trials, direction {directions}, no layoutsearch "
                "fingerprint); use another driver.study_name or driver.storage")
        if stored is None:
            study.set_user_attr(FINGERPRINT_ATTR, fingerprint)
        elif stored != fingerprint:
            covers = fingerprint_covers(problem.cost_model)
            why = {"cost_model": f"a cost model's fingerprint covers {covers}"}
            raise LayoutSearchError(
                f"study {name!r} in {self.storage!r} was made for another search: "
                + "; ".join(_differences(stored, fingerprint, why))
                + f"; use another driver.study_name or driver.storage, or delete study "
                f"{name!r} (optuna.delete_study) to start over"
            )
        return study

    def default_study_name(self, fingerprint: Mapping[str, Any]) -> str:
        """`layoutsearch-<digest>` of what the study is made for and how it samples: the
        same command resumes its study, and a sweep over the sampler's settings
        (`-m driver.sampler=tpe,random`, `driver.seed=0,1,2`) gets a study per job instead
        of the first job's trials. The sampler is no part of the fingerprint, so a study
        named with `study_name` may be resumed with other sampler settings."""
        return _study_name_of({**fingerprint, "sampling": self.sampling()})

    def sampling(self) -> dict[str, Any]:
        """The sampler settings a default study name includes."""
        return {"sampler": self.sampler, "seed": self.seed,
                "n_startup_trials": self.n_startup_trials, "multivariate": self.multivariate}

    def _default_or_earlier_name(self, fingerprint: Mapping[str, Any],
                                 storage: BaseStorage) -> str:
        """The default study name; or, where `storage` holds no study of that name but one
        of the name layoutsearch gave this search before the sampler settings were part of
        it (the fingerprint's digest alone), that study, said on stderr, so a search begun
        before the change resumes instead of starting over. The first search to resume it
        stamps it with its sampler settings: in a sweep over them (`driver.seed=0,1,2`) one
        job resumes it and the others start studies of their own."""
        name = self.default_study_name(fingerprint)
        earlier = _study_name_of(fingerprint)
        names = {study.study_name for study in storage.get_all_studies()}
        if name in names or earlier not in names:
            return name
        study_id = storage.get_study_id_from_name(earlier)
        resumed_by = storage.get_study_user_attrs(study_id).get(SAMPLING_ATTR)
        if resumed_by is None:
            storage.set_study_user_attr(study_id, SAMPLING_ATTR, self.sampling())
        elif resumed_by != self.sampling():
            return name
        print(f"resuming study {earlier!r}, named before the default study name included "
              f"the sampler settings (driver.study_name={earlier} names it explicitly)",
              file=sys.stderr)
        return earlier

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
        # From the study's opening on, a Ctrl-C that a finalizer swallows is raised by the
        # worker's loop (a spawned worker notices its own; a forked one inherits this).
        with noticing_interrupts():
            return self._search(problem)

    def _search(self, problem: SearchProblem) -> pd.DataFrame:
        self._refuse_workers_sharing_gpus(problem)
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # our progress line replaces it
        try:
            index = LayoutIndex.of(problem)
            storage = open_storage(self.storage)
            study = self.open_study(problem, storage)
            fail_dead_workers(study, storage)
            if not len(index.open):
                return self.nothing_to_sample(problem, index)
            stale = self._price_again(study, problem, index)
            done = len(standing(study.get_trials(deepcopy=False), stale, index))
            if self.n_trials is not None and done >= self.n_trials:
                # A resumed study whose budget is spent prices nothing: say so, not "60/10".
                print(f"optuna: the study already holds {done} evaluations, driver.n_trials="
                      f"{self.n_trials}: nothing more is priced; these are its results (raise "
                      "driver.n_trials to search further)", file=sys.stderr)
            self._warm_start(study, problem, index)
            if self.n_workers == 1:
                Worker(self, problem, index, study, storage, 0, stale=stale).run()
            else:
                release(storage)
                self._run_workers(problem, done, stale)
            return self.answer(study, problem, index)
        except KeyboardInterrupt:
            if self.storage:
                print(f"\noptuna: interrupted; driver.storage={self.storage} keeps every "
                      "finished trial, and the same command resumes the study", file=sys.stderr)
            raise
        finally:
            optuna.logging.set_verbosity(verbosity)

    def _refuse_workers_sharing_gpus(self, problem: SearchProblem) -> None:
        """Local workers each launch a trial at once; on the one-node local launcher their
        trials take turns on its GPUs (gpu_lock.py), so more workers would only hold trials
        of the study open while they wait."""
        model = problem.cost_model
        if (self.n_workers > 1 and isinstance(model, MeasuredCostModel)
                and model.launcher.name == "local"):
            raise LayoutSearchError(
                f"driver.n_workers={self.n_workers}: with cost_models=measured and the local "
                f"launcher, the workers would train {self.n_workers} layouts at once on this "
                "node's GPUs, which one local trial holds at a time, so they would take "
                "turns, no faster than one worker; use driver.n_workers=1, or "
                "cost_models.launcher=slurm (a job per trial)")

    def _price_again(self, study: optuna.Study, problem: SearchProblem,
                     index: LayoutIndex) -> frozenset[int]:
        """The stored evaluations the cost model prices again (`reprices`: a measured
        model's failures it is told to retry, its launches that recorded nothing), each
        layout queued first so that they are asked before the sampler's own proposals."""
        trials = study.get_trials(deepcopy=False)
        stale = {label: t for label, t in standing(trials, (), index).items()
                 if reprices(problem.cost_model, t.user_attrs.get("costs") or {})}
        waiting = {t.user_attrs.get("layout") for t in trials if t.state == TrialState.WAITING}
        for label, trial in stale.items():
            position = index.rows.get(label)
            if label in waiting or position is None or position not in index.open:
                continue
            study.enqueue_trial(encode(index, index.params_of(position)),
                                user_attrs={"layout": label, "prices_again": trial.number})
        return frozenset(t.number for t in stale.values())

    def _warm_start(self, study: optuna.Study, problem: SearchProblem,
                    index: LayoutIndex) -> None:
        """Queue the best feasible layouts by the `warm_start` cost model (once per study)."""
        if not self.warm_start:
            return
        model = build_cost_model(self.warm_start, setting="driver.warm_start")
        if isinstance(model, MeasuredCostModel):
            # Guessing prices every layout that passes the rules: as training runs, that is
            # the whole grid, not warm_start_top_k launches.
            raise LayoutSearchError(
                f"driver.warm_start={self.warm_start}: a warm start prices all "
                f"{len(problem.feasible_candidates())} layouts that pass the rules to pick "
                f"{self.warm_start_top_k}; a measured cost model would launch each. Use "
                "analytic, a calibrated analytic file or a replay of measurements")
        guess = SearchProblem(problem.job, problem.space, problem.candidates, model,
                              problem.clusters)
        open_rows = problem.candidates.index[index.open]
        ranked = rank(guess.evaluate(problem.candidates.loc[open_rows]))
        for _, row in ranked.head(self.warm_start_top_k).iterrows():
            params = {k: plain(row[k]) for k in index.params}
            study.enqueue_trial(encode(index, params), skip_if_exists=True, user_attrs={
                "warm_start": self.warm_start, "layout": index.label(params)})

    def _run_workers(self, problem: SearchProblem, evaluations_done: int,
                     stale: frozenset[int]) -> None:
        # fork shares the problem with the workers without pickling it; spawn elsewhere.
        context = (multiprocessing.get_context("fork")
                   if "fork" in multiprocessing.get_all_start_methods()
                   else multiprocessing.get_context("spawn"))
        errors = context.SimpleQueue()
        budget = (EvaluationBudget(context, self.n_trials - evaluations_done)
                  if self.n_trials is not None else None)
        workers = [context.Process(target=work, args=(self, problem, i, errors, budget,
                                                      os.getpid(), stale))
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

    def nothing_to_sample(self, problem: SearchProblem, index: LayoutIndex) -> pd.DataFrame:
        """Every layout with why it cannot be evaluated (a rule, or no price), when none can:
        the reasons are the answer, as the grid driver would give them (no trial runs)."""
        reasons = problem.candidates["rule_reason"].to_numpy(dtype=object).copy()
        reasons[list(index.unpriced)] = list(index.unpriced.values())
        out = problem.candidates.drop(columns="rule_reason").assign(
            **{**UNPRICED, "reason": reasons})
        for column in ("mfu", "step_time_s", "tokens_per_s", "peak_memory_gib"):
            out[column] = out[column].astype(float)
        return out.reset_index(drop=True)

    def results(self, study: optuna.Study, problem: SearchProblem,
                index: LayoutIndex) -> pd.DataFrame:
        """One row per evaluated layout: the candidate, its costs, the trial that priced it
        last."""
        by_label = standing(study.get_trials(deepcopy=False), (), index)
        labels = sorted(by_label, key=lambda label: by_label[label].number)
        evaluated = [by_label[label] for label in labels]
        rows = problem.candidates.iloc[[index.rows[label] for label in labels]]
        records = [{**UNPRICED, **(t.user_attrs.get("costs")
                                   or {"reason": t.user_attrs.get("error", "")})}
                   for t in evaluated]
        costs = pd.DataFrame(records, index=rows.index, columns=list(UNPRICED) if not records
                             else None)
        for column in ("mfu", "step_time_s", "tokens_per_s", "peak_memory_gib"):
            costs[column] = pd.to_numeric(costs[column], errors="coerce")
        costs["fits"] = costs["fits"].fillna(False).astype(bool)
        costs["reason"] = costs["reason"].fillna("").astype(str)
        # Stored prices may predate the settings' extra flags (a study resumed with them).
        out = problem.unlaunchable_refused(rows.drop(columns="rule_reason").join(costs))
        out["trial"] = np.array([t.number for t in evaluated], dtype=np.int64)
        if len(self.objectives) > 1:
            out["pareto"] = self.pareto(out)
        out = out.reset_index(drop=True)
        out.attrs["study_name"] = study.study_name
        out.attrs["trials"] = len(study.get_trials(deepcopy=False))
        return out

    def answer(self, study: optuna.Study, problem: SearchProblem,
               index: LayoutIndex) -> pd.DataFrame:
        """The search's answer: `results`, then the layouts the study did not evaluate that
        the cost model prices from runs recorded before (a measured model's measurement
        file), priced so, launching nothing, with an empty `trial`. A run of the job that
        the sampler never proposed is ranked, as a grid search ranks it, instead of a worse
        layout being recommended over it."""
        found = self.results(study, problem, index)
        evaluated = {index.rows[label]
                     for label in standing(study.get_trials(deepcopy=False), (), index)}
        rest = problem.candidates.iloc[[i for i in index.open if i not in evaluated]]
        held = recorded_rows(problem.cost_model, rest.drop(columns="rule_reason"),
                             problem.clusters)
        if not held.any():
            return found
        recorded = problem.evaluate(rest[held.to_numpy()])
        out = pd.concat([found, recorded], ignore_index=True)
        out["trial"] = pd.array([*found["trial"], *[pd.NA] * len(recorded)], dtype="Int64")
        if len(self.objectives) > 1:
            out["pareto"] = self.pareto(out)
        out.attrs = found.attrs
        return out

    def pareto(self, priced: pd.DataFrame) -> np.ndarray:
        """Whether each row of `priced` is on the Pareto front of the objectives: it fits,
        and no row that fits is at least as good in every objective and better in one."""
        sign = np.array([-1.0 if d == "maximize" else 1.0 for d in self.directions])
        values = priced[list(self.objectives)].to_numpy(dtype=float) * sign  # all minimized
        candidates = np.flatnonzero(priced["fits"].to_numpy(dtype=bool)
                                    & np.isfinite(values).all(axis=1))
        # In lexicographic order a row comes after every row that dominates it, and one of
        # those is on the front: comparing each row with the front so far is enough.
        order = candidates[np.lexsort(values[candidates].T[::-1])]
        on_front = np.zeros(len(priced), dtype=bool)
        front: list[int] = []
        for row in order:
            better = values[front] <= values[row]
            if not (better.all(axis=1) & (values[front] < values[row]).any(axis=1)).any():
                front.append(int(row))
                on_front[row] = True
        return on_front


class _Absent:
    """A key one fingerprint has and the other lacks (not the same as a stored None)."""

    def __repr__(self) -> str:
        return "(absent)"


ABSENT = _Absent()


def _cluster_fields(cluster: ClusterSpec) -> dict[str, Any]:
    """The cluster's fields, the GPU's flattened ("gpu.memory_gib"), so that a difference
    names the field that changed."""
    fields = dataclasses.asdict(cluster)
    gpu = fields.pop("gpu")
    return {**fields, **{f"gpu.{name}": value for name, value in gpu.items()}}


def _differences(stored: Mapping[str, Any], wanted: Mapping[str, Any],
                 why: Mapping[str, str] | None = None) -> list[str]:
    """Each part that differs: "part key: study OLD, this search NEW", and `why` the part
    may change, in parentheses, where it says."""
    out = []
    for part in sorted(set(stored) | set(wanted)):
        old, new = stored.get(part, ABSENT), wanted.get(part, ABSENT)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            out += [f"{part} {key}: study {old.get(key, ABSENT)!r}, this search "
                    f"{new.get(key, ABSENT)!r}" for key in sorted(set(old) | set(new))
                    if old.get(key, ABSENT) != new.get(key, ABSENT)]
        elif old != new:
            reason = (why or {}).get(part)
            out.append(f"{part}: study {old!r}, this search {new!r}"
                       + (f" ({reason})" if reason else ""))
    return out
