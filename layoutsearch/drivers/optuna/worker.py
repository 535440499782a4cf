"""One optuna worker: asks for trials and answers each by rejecting, reusing or pricing it.

A layout that breaks a rule, or that the cost model would return no figures for, is never
sent to the cost model (a violated constraint); one already priced reuses the stored value;
after either, the nearest open layout is queued. Integer knobs are trial parameters as
positions in their ordered values, so TPE sees that tp 4 lies between 2 and 8.

    Worker(driver, problem, LayoutIndex.of(problem), study, storage, number=0).run()
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import optuna
from optuna.storages import BaseStorage, InMemoryStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from layoutsearch.drivers.layout_index import LayoutIndex
from layoutsearch.drivers.optuna.storage import (
    Heartbeat,
    alive,
    fail_dead_workers,
    open_storage,
)
from layoutsearch.errors import LayoutSearchError
from layoutsearch.interrupts import noticing_interrupts, raise_if_interrupted
from layoutsearch.layout import Layout
from layoutsearch.lifetime import end_with_parent
from layoutsearch.liveness import HOST
from layoutsearch.problem import SearchProblem
from layoutsearch.progress import Progress
from layoutsearch.space import INTEGER_KNOBS

if TYPE_CHECKING:
    from layoutsearch.drivers.optuna.driver import OptunaDriver

Outcome = tuple[TrialState, tuple[float, ...] | None]
UNPRICED: dict[str, Any] = {
    "mfu": None, "step_time_s": None, "tokens_per_s": None, "peak_memory_gib": None,
    "fits": False, "reason": "",
}
"""Cost columns of an evaluation that returned nothing (the cost model raised)."""
BUDGET_WAIT_S = 0.05
"""How long a worker without a share of the budget waits for one to be handed back (s)."""
LARGEST_BUDGET = 2**31 - 1
"""The most evaluations local workers keep count of (a C int): a larger n_trials is as good
as no limit, as no space has that many layouts to price."""


class EvaluationBudget:
    """The evaluations local workers may still start, shared between their processes.

    A worker takes a share before it asks for a trial and hands it back unless it priced
    that trial, so together the workers start exactly the study's `n_trials` evaluations
    (a worker that only counted finished evaluations would start one more while the last
    ones are in flight: with a measured cost model, a training run nobody asked for).
    """

    def __init__(self, context: Any, remaining: int) -> None:
        # A C int wraps around past its range: n_trials=2**31 left a negative budget, and
        # the workers priced nothing.
        self._left = context.Value("i", min(max(remaining, 0), LARGEST_BUDGET))

    def take(self) -> bool:
        with self._left.get_lock():
            if self._left.value <= 0:
                return False
            self._left.value -= 1
            return True

    def give_back(self) -> None:
        with self._left.get_lock():
            self._left.value += 1


def plain(value: Any) -> Any:
    """A JSON-storable Python value (optuna keeps user attributes as JSON)."""
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and math.isnan(value) else value


def is_evaluation(trial: FrozenTrial) -> bool:
    """A finished call of the cost model (the trials a budget counts)."""
    if "duplicate_of" in trial.user_attrs or not trial.user_attrs.get("evaluated"):
        return False
    return trial.state == TrialState.COMPLETE or "error" in trial.user_attrs


def standing(trials: list[FrozenTrial], stale: Collection[int],
             index: LayoutIndex) -> dict[str, FrozenTrial]:
    """The evaluation that stands for each layout (by `index`'s label): its latest, unless
    that one is to be priced again (`stale`: trial numbers the search found so when it
    started). The label is made again from the trial's parameters, not taken as stored: a
    study stored before the candidates folded some twins into one row (dp·cp = 1's optimizer
    settings) names a twin no row has, and resumes with the twins as that row."""
    latest = {index.label(decode(index, t.params)): t for t in trials if is_evaluation(t)}
    return {label: t for label, t in latest.items() if t.number not in stale}


def feasible(trial: FrozenTrial) -> bool:
    return trial.state == TrialState.COMPLETE and all(
        v <= 0 for v in trial.constraints.values())


def work(driver: OptunaDriver, problem: SearchProblem, number: int, errors: Any,
         budget: EvaluationBudget | None = None, parent_pid: int | None = None,
         stale: frozenset[int] = frozenset()) -> None:
    """One worker process of a study; it ends when the search that started it dies (a
    `kill -9` of the search must not leave workers launching trials)."""
    if parent_pid is not None:
        end_with_parent(parent_pid)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = open_storage(driver.storage)
        study = driver.open_study(problem, storage, worker=number)
        Worker(driver, problem, LayoutIndex.of(problem), study, storage, number, budget,
               stale).run()
    except BaseException as error:
        errors.put(f"worker {number}: {type(error).__name__}: {error}")
        raise SystemExit(1) from None


class Worker:
    """Asks for trials and answers each: reject, reuse or evaluate its layout."""

    def __init__(self, driver: OptunaDriver, problem: SearchProblem, index: LayoutIndex,
                 study: optuna.Study, storage: BaseStorage, number: int,
                 budget: EvaluationBudget | None = None,
                 stale: frozenset[int] = frozenset()) -> None:
        self.driver, self.problem, self.index, self.study = driver, problem, index, study
        self.storage = storage
        self.budget = budget
        """Shared with the other local workers; None: `done()` alone keeps the count."""
        self.stale = stale
        """Evaluations of earlier searches the cost model prices again (`reprices`): not
        reused, not counted. Fixed when the search starts, so that a retry that fails
        again in this search stands."""
        self.evaluations = 0
        self.worker = f"{HOST}:{os.getpid()}"
        self.worst = tuple(0.0 if d == "maximize" else math.inf for d in driver.directions)
        self.rng = np.random.default_rng(None if driver.seed is None else driver.seed + number)
        label = "optuna" if driver.n_workers == 1 else f"optuna worker {number}"
        # The search ends when every open layout is priced, within n_trials or without it.
        total = min(driver.n_trials or len(index.open), len(index.open))
        self.progress = Progress(total=total, label=label, enabled=driver.progress)

    def run(self) -> None:
        deadline = time.monotonic() + (self.driver.timeout or math.inf)
        with self.progress, noticing_interrupts():
            earlier = self.driver.results(self.study, self.problem, self.index)
            if len(earlier):  # a resumed study: its best so far, and the count from there
                self.progress.update(earlier)
            while not self.done() and time.monotonic() < deadline:
                raise_if_interrupted()
                if self.budget is not None and not self.budget.take():
                    if not self.others_running():
                        return  # no share can come back: the budget is spent
                    time.sleep(BUDGET_WAIT_S)
                    continue
                started = self.evaluations
                try:
                    trial = self.study.ask()
                    try:
                        trial.set_user_attr("worker", self.worker)
                        with self.heartbeat(trial):
                            state, values = self.answer(trial)
                        self.study.tell(trial, values, state=state)
                    except BaseException:
                        # Stopped anywhere between ask and tell (a setup mistake, Ctrl-C,
                        # even while the price is stored): failed without an "error", the
                        # trial is no evaluation, so a rerun prices the layout. Left
                        # running, it would hold the layout "being evaluated" for as long as
                        # its worker lives: in a notebook, every later search of the kernel.
                        self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                        raise
                finally:
                    if self.budget is not None and self.evaluations == started:
                        self.budget.give_back()

    def heartbeat(self, trial: Trial) -> contextlib.AbstractContextManager[object]:
        """Stamps for a trial other processes could see; an in-memory study has none."""
        if isinstance(self.storage, InMemoryStorage):
            return contextlib.nullcontext()
        return Heartbeat(trial)

    def others_running(self) -> bool:
        """Whether a live worker has a trial in flight (which may hand back its share)."""
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        return any(alive(t) for t in running)

    def done(self) -> bool:
        evaluations = standing(self.study.get_trials(deepcopy=False), self.stale, self.index)
        self.progress.done = len(evaluations)  # the study's, by every worker, not this one's
        budget = self.driver.n_trials
        if budget is not None and len(evaluations) >= budget:
            return True
        if len(evaluations) >= len(self.index.open):
            return True  # every layout that passes the rules has been priced
        target = self.driver.target
        if target is None:
            return False
        sign = 1.0 if self.driver.directions[0] == "maximize" else -1.0
        return any(feasible(t) and sign * (t.values[0] - target) >= 0
                   for t in evaluations.values())

    def answer(self, trial: Trial) -> Outcome:
        params = {
            k: (v[trial.suggest_int(k, 0, len(v) - 1)] if k in INTEGER_KNOBS
                else trial.suggest_categorical(k, v))
            for k, v in self.index.params.items()
        }
        label = self.index.label(params)
        trial.set_user_attr("layout", label)
        position = self.index.rows.get(label)
        rule = ("not a candidate of this search" if position is None
                else str(self.problem.candidates["rule_reason"].iat[position]))
        unpriced = "" if position is None else self.index.unpriced.get(position, "")
        trials = self.study.get_trials(deepcopy=False)
        if rule or unpriced:
            # Like a rule, a layout the cost model has no figures for (a replay's unmeasured
            # one) would cost an evaluation and teach the sampler nothing about its value.
            trial.set_user_attr("reason", rule or unpriced)
            trial.set_constraint("rules" if rule else "priced", 1.0)
            self.queue_nearest(params, trials)
            return TrialState.COMPLETE, self.worst
        for other in trials:
            if other.number == trial.number or other.user_attrs.get("layout") != label:
                continue
            if other.state == TrialState.RUNNING and not alive(other):
                # Its worker died (here, or on a machine whose heartbeat stopped): reopen it.
                fail_dead_workers(self.study, self.storage)
            elif other.state == TrialState.RUNNING:
                # Another worker is pricing it; if both back off, neither evaluates twice.
                trial.set_user_attr("reason", f"being evaluated in trial {other.number}")
                self.queue_nearest(params, trials)
                return TrialState.PRUNED, None
        priced = standing(trials, self.stale, self.index).get(label)
        if priced is not None:
            self.queue_nearest(params, trials)
            return self.reuse(trial, priced)
        assert position is not None
        return self.evaluate(trial, position)

    def queue_nearest(self, params: Mapping[str, Any], trials: list[FrozenTrial]) -> None:
        """Queue the closest layout nobody has priced, is pricing or has queued."""
        busy = [t.user_attrs.get("layout") for t in trials
                if t.state in (TrialState.RUNNING, TrialState.WAITING)]
        priced = standing(trials, self.stale, self.index)
        taken = {self.index.rows[label] for label in [*priced, *busy] if label in self.index.rows}
        nearest = self.index.nearest(params, taken, self.rng)
        if nearest is not None:
            near = self.index.params_of(nearest)
            # Not optuna's skip_if_exists: it counts a trial of any state with the same
            # parameters, a stopped one too (Ctrl-C, a dead worker), whose layout has no
            # price; `taken` already holds every layout priced, in flight or queued.
            self.study.enqueue_trial(encode(self.index, near),
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
        self.evaluations += 1
        trial.set_user_attr("evaluated", True)
        try:
            scored = self.problem.evaluate(self.problem.candidates.iloc[[position]])
        except LayoutSearchError:
            # A setup mistake the cost model stops on (no Megatron-LM checkout, a measurement
            # file that cannot be written) holds for every layout: the study stops, as a grid
            # search does, instead of storing it as the price of each layout it samples.
            raise
        except Exception as error:
            message = f"cost model error: {type(error).__name__}: {error}"
            trial.set_user_attr("error", message)
            trial.set_user_attr("reason", message)
            return TrialState.FAIL, None
        self.progress.update(scored)
        row = scored.iloc[0]
        trial.set_user_attr("costs", {c: plain(row[c]) for c in scored.columns
                                      if c not in self.problem.candidates.columns})
        trial.set_user_attr("reason", str(row["reason"]))
        values = tuple(float(row[o]) for o in self.driver.objectives)
        unpriced = [o for o, v in zip(self.driver.objectives, values, strict=True)
                    if bool(row["fits"]) and math.isnan(v)]
        if unpriced:
            # Stored as not fitting, every such layout would look alike to the sampler: a
            # random search, and no Pareto front, that says nothing of why.
            layout = Layout.from_row(row).describe()
            raise LayoutSearchError(
                f"driver.objectives={list(self.driver.objectives)}: the cost model gives no "
                f"{unpriced[0]} for {layout}, which it finds to fit (a replay of runs without "
                "that column, say); optimize what it prices, e.g. driver.objectives=[mfu]")
        feasible = bool(row["fits"]) and all(math.isfinite(v) for v in values)
        trial.set_constraint("fits", 0.0 if feasible else 1.0)
        return TrialState.COMPLETE, values if feasible else self.worst


def encode(index: LayoutIndex, params: Mapping[str, Any]) -> dict[str, Any]:
    """Trial parameters of a layout: integer knobs as positions in their ordered values."""
    return {k: index.params[k].index(v) if k in INTEGER_KNOBS else v for k, v in params.items()}


def decode(index: LayoutIndex, params: Mapping[str, Any]) -> dict[str, Any]:
    """The knob values of a trial's parameters (`encode` undone)."""
    return {k: index.params[k][v] if k in INTEGER_KNOBS else v for k, v in params.items()}
