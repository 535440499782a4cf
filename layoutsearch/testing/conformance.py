"""A conformance suite for cost models and drivers: the contract of `CostModel.score` (and
of `unpriced`, for a model that has it), and of `Driver.run`, checked.

Any cost model or driver (built in or a plug-in) can run it on its own candidates or search
problem; it raises an AssertionError naming the first broken rule.

    check_cost_model(build_cost_model("analytic"))
    check_cost_model(my_model, candidates=my_table, clusters=my_clusters)
    check_driver(build_driver("grid"))
    check_driver(MyDriver(seed=0), problem=my_problem)

`check_driver` runs the driver on a small problem (`conformance_problem`: llama_13b on 8
A100s under the analytic model, 72 layouts, some out of memory, some against a rule) and
checks what `search()` relies on: rows that are layouts of the space as the candidate
table has them, none twice (nor as a no-op twin: sequence parallelism at tp = 1); the
cost model's columns on every row, the figures of a priced row exactly the cost model's
(the driver's figures are compared with what the cost model returned during the run, and a
sample of rows is priced again through the problem), a reason on every row that does not
fit; no layout priced twice, and none priced but left out of the answer (under a measured
cost model each is a training launch); the same rows from a second run, unless the driver
has a `seed` of None; and the problem's candidate table left as it was. A driver may
return fewer rows than the space (a sampler under a budget). Run it on a driver of one
process without a persistent store (no optuna `storage` nor `n_workers`): what the cost
model prices is counted in this process, and a resumed study's prices were not asked of the
cost model in this run.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np
import pandas as pd

from layoutsearch.catalog import clusters_by_gpu, load_cluster, load_model
from layoutsearch.costs import build_cost_model
from layoutsearch.costs.base import PREDICTION_COLUMNS, CostModel
from layoutsearch.drivers import Driver
from layoutsearch.layout import DATA_PARALLEL_NO_OPS
from layoutsearch.problem import SearchProblem
from layoutsearch.rules import violations
from layoutsearch.space import KNOBS, SearchSpace
from layoutsearch.specs import ClusterSpec, Job, ModelSpec

TINY_MODEL = ModelSpec(name="tiny", num_layers=4, hidden_size=256, ffn_hidden_size=688,
                       num_attention_heads=8, vocab_size=32000)


def conformance_candidates(limit: int = 12) -> pd.DataFrame:
    """A small rule-passing candidate table of a tiny model on 8 A100s, index not 0..n-1."""
    job = Job(model=TINY_MODEL, cluster=load_cluster("a100_80gb"), num_gpus=8,
              seq_length=512, global_batch_size=64)
    space = SearchSpace(tp=(1, 2), pp=(1, 2), micro_batch_size=(1, 2),
                        sequence_parallel=(False,), attention=("flash2",),
                        rmsnorm_kernel=(True,), recompute=("none", "full"))
    table = space.candidates(job)
    table = table[violations(table, clusters_by_gpu()) == ""].head(limit)
    table.index = table.index * 10 + 7  # a cost model must keep the caller's index
    return table


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"cost model conformance: {message}")


def check_cost_model(model: CostModel, candidates: pd.DataFrame | None = None,
                     clusters: Mapping[str, ClusterSpec] | None = None) -> pd.DataFrame:
    """Score `candidates` and check the contract; returns the scored frame."""
    table = conformance_candidates() if candidates is None else candidates
    clusters = clusters_by_gpu() if clusters is None else clusters
    _check(isinstance(getattr(model, "name", None), str), "needs a `name` string")
    # Asked first: for a measured model, scoring makes recorded what was not.
    unpriced = model.unpriced(table, clusters) if hasattr(model, "unpriced") else None
    scored = model.score(table, clusters)
    if unpriced is not None:
        _check(isinstance(unpriced, pd.Series) and unpriced.index.equals(table.index)
               and bool(unpriced.map(lambda r: isinstance(r, str)).all()),
               "unpriced must return a Series of strings on the candidates' index")
        named = (unpriced != "").to_numpy()
        _check(not scored["fits"].to_numpy()[named].any()
               and bool(scored["mfu"].isna().to_numpy()[named].all()),
               "a row `unpriced` names must get no figures from score")
    _check(isinstance(scored, pd.DataFrame), "score must return a DataFrame")
    _check(scored.index.equals(table.index), "the result must keep the candidates' index")
    missing = [c for c in PREDICTION_COLUMNS if c not in scored.columns]
    _check(not missing, f"missing columns {missing}")
    _check(scored["fits"].dtype == bool, "`fits` must be a bool column")
    reasons = scored["cost_reason"]
    _check(bool(reasons.map(lambda r: isinstance(r, str)).all()), "`cost_reason` must hold strings")
    fits = scored["fits"].to_numpy()
    ok = scored[fits]
    _check(bool((ok["step_time_s"] > 0).all()), "a fitting row needs step_time_s > 0")
    _check(bool(((ok["mfu"] > 0) & (ok["mfu"] <= 1)).all()), "a fitting row needs 0 < mfu <= 1")
    _check(bool((scored.loc[~fits, "cost_reason"] != "").all()),
           "a row that does not fit must say why in cost_reason")
    tokens = table["global_batch_size"] * table["seq_length"]
    expected = (tokens / scored["step_time_s"])[fits]
    _check(bool(np.allclose(ok["tokens_per_s"], expected, rtol=1e-6)),
           "tokens_per_s must equal global_batch_size·seq_length / step_time_s")
    memory = scored["peak_memory_gib"].dropna()
    _check(bool((memory >= 0).all()), "peak_memory_gib must be >= 0")
    for prefix, total in (("time_", "step_time_s"), ("memory_", "peak_memory_gib")):
        parts = [c for c in scored.columns if c.startswith(prefix)]
        if parts:
            _check(bool(np.allclose(scored[parts].sum(axis=1), scored[total], rtol=1e-6,
                                    equal_nan=True)),
                   f"the {prefix}* breakdown must sum to {total}")
    # Rows are priced independently: a subset scores as it did inside the whole table.
    half = table.iloc[::2]
    again = model.score(half, clusters)
    for column in ("step_time_s", "mfu", "fits"):
        _check(bool(np.array_equal(again[column].to_numpy(), scored.loc[half.index, column]
                                   .to_numpy(), equal_nan=column != "fits")),
               f"{column} of a row must not depend on the other rows scored with it")
    empty = model.score(table.iloc[:0], clusters)
    _check(len(empty) == 0 and all(c in empty.columns for c in PREDICTION_COLUMNS),
           "an empty table must give an empty result with the prediction columns")
    return scored


FIGURES = ("mfu", "step_time_s", "tokens_per_s", "peak_memory_gib")
"""The figures a priced row carries: the cost model's, unchanged."""
DRIVER_COLUMNS = (*FIGURES, "fits", "reason")
"""The cost model's columns as `SearchProblem.evaluate` gives them to a driver."""
REPRICED_ROWS = 8
"""Rows of a driver's answer priced again through the problem, to compare `fits` and
`reason` (a sample: any cost model, a measured one included, stays cheap to check)."""


def conformance_problem(cost_model: CostModel | None = None) -> SearchProblem:
    """llama_13b on 8 A100s, 72 layouts (the analytic model by default): some fit, some run
    out of memory, 16 break a rule (tp·pp = 16 > 8 GPUs); the space offers sequence
    parallelism and both optimizers, so the table has folded no-op twins (SP at tp = 1,
    the optimizer of one data-parallel rank) that a driver must not bring back."""
    job = Job(model=load_model("llama_13b"), cluster=load_cluster("a100_80gb"), num_gpus=8,
              seq_length=2048, global_batch_size=64)
    space = SearchSpace(tp=(1, 2, 8), pp=(1, 2), micro_batch_size=(1, 2),
                        sequence_parallel=(False, True), attention=("flash2",),
                        rmsnorm_kernel=(True,), recompute=("none", "full"),
                        distributed_optimizer=(False, True), overlap_grad_reduce=(False,))
    model = build_cost_model("analytic") if cost_model is None else cost_model
    return SearchProblem.build(job, space, model, clusters_by_gpu())


def _fail(message: str) -> NoReturn:
    raise AssertionError(f"driver conformance: {message}")


Key = tuple[str, ...]


def _keys(frame: pd.DataFrame) -> list[Key]:
    """Each row's layout, one text per knob (categorical and plain text alike)."""
    return list(zip(*(frame[k].astype(str) for k in KNOBS), strict=True))


def _folded_keys(frame: pd.DataFrame) -> list[Key]:
    """Each row's layout with the knobs that change nothing set as the candidate table keeps
    them: sequence parallelism off at tp = 1, one data-parallel rank's optimizer and overlap
    (`layout.DATA_PARALLEL_NO_OPS`)."""
    folded = frame[[*KNOBS, "dp"]].copy()
    folded["sequence_parallel"] = folded["sequence_parallel"].astype(bool) & (folded["tp"] != 1)
    alone = folded["dp"] * folded["cp"] == 1
    for knob, kept in DATA_PARALLEL_NO_OPS.items():
        folded[knob] = folded[knob].astype(bool).where(~alone, kept)
    return _keys(folded)


def _label(key: Key) -> str:
    return " ".join(f"{knob}={value}" for knob, value in zip(KNOBS, key, strict=True))


def _kind(dtype: Any) -> str:
    """Integer, bool, float or text: what a column must stay for `Layout.from_row` and the
    Megatron-LM arguments ('--tensor-model-parallel-size 2.0' is refused)."""
    if isinstance(dtype, pd.CategoricalDtype) or pd.api.types.is_string_dtype(dtype):
        return "text"
    return {"i": "integer", "u": "integer", "b": "bool", "f": "float"}.get(dtype.kind, str(dtype))


class _CountingCostModel:
    """The problem's cost model, keeping each layout it is asked to price and its figures."""

    def __init__(self, inner: CostModel) -> None:
        self.inner = inner
        self.name = inner.name
        self.priced: list[Key] = []
        self.figures: dict[Key, np.ndarray] = {}

    def score(self, candidates: pd.DataFrame,
              clusters: Mapping[str, ClusterSpec]) -> pd.DataFrame:
        scored = self.inner.score(candidates, clusters)
        keys = _keys(candidates)
        self.priced.extend(keys)
        figures = scored.reindex(columns=list(FIGURES)).to_numpy(dtype=float)
        self.figures.update(zip(keys, figures, strict=True))
        return scored

    def __getattr__(self, name: str) -> Any:
        # fingerprint, unpriced, reprices ...: the driver asks them of the model it was given.
        if name == "inner":  # not set yet (a copy being made): no endless recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def _run_counted(driver: Driver, problem: SearchProblem) -> tuple[pd.DataFrame,
                                                                  _CountingCostModel]:
    counting = _CountingCostModel(problem.cost_model)
    result = driver.run(dataclasses.replace(problem, cost_model=counting))
    if not isinstance(result, pd.DataFrame):
        _fail(f"run must return a DataFrame, got {type(result).__name__}")
    return result, counting


def check_driver(driver: Driver, problem: SearchProblem | None = None) -> pd.DataFrame:
    """Run `driver` on `problem` (`conformance_problem()` by default) and check the
    contract; returns the driver's answer."""
    problem = conformance_problem() if problem is None else problem
    if not isinstance(getattr(driver, "name", None), str):
        _fail("needs a `name` string")
    before = problem.candidates.copy(deep=True)
    result, counting = _run_counted(driver, problem)
    table = problem.candidates.drop(columns="rule_reason")
    missing = [c for c in (*table.columns, *DRIVER_COLUMNS) if c not in result.columns]
    if missing:
        _fail(f"the answer lacks columns {missing}: search() ranks by the cost model's "
              "columns and builds each row's Megatron-LM command from its layout and job "
              "columns")
    if result.empty and not problem.feasible_candidates().empty:
        _fail("returned no rows where layouts pass the rules: search() would say that "
              "nothing fits")
    for column in table.columns:
        got, wanted = _kind(result[column].dtype), _kind(table[column].dtype)
        if got != wanted:
            _fail(f"column {column!r} is {got}, the candidate table's is {wanted}: the layout "
                  "and job columns are to be returned as given (a launch command needs "
                  "'2', not '2.0')")
    _check_rows_are_candidates(result, problem)
    _check_columns(result, problem)
    _check_prices(result, problem, counting)
    # No seed: nothing random, so a second run repeats the first; seed None: afresh.
    if getattr(driver, "seed", 0) is not None:
        again, _ = _run_counted(driver, problem)
        if sorted(_keys(again)) != sorted(_keys(result)):
            new = len(set(_keys(again)) - set(_keys(result)))
            _fail(f"a second run on the same problem returned other layouts ({new} of its "
                  f"{len(again)} rows were not in the first run's {len(result)}): a driver "
                  "with a fixed seed, or with none, is to repeat its search (give it a "
                  "`seed` of None if it samples afresh each run)")
    changed = [c for c in before.columns if c not in problem.candidates.columns
               or not problem.candidates[c].equals(before[c])]
    if changed or not (problem.candidates.index.equals(before.index)
                       and list(problem.candidates.columns) == list(before.columns)):
        what = f"columns {changed}" if changed else "its index or columns"
        _fail(f"the run changed the problem's candidate table ({what}): search() words its "
              "notes and no-fit message from it after the driver runs; copy it before "
              "changing it")
    return result


def _check_rows_are_candidates(result: pd.DataFrame, problem: SearchProblem) -> None:
    """Every row a layout of the space as the candidate table has it, and none twice."""
    keys = _keys(result)
    seen: dict[Key, int] = {}
    for position, key in enumerate(keys):
        if key in seen:
            _fail(f"rows {seen[key]} and {position} are the same layout ({_label(key)}): a "
                  "ranking would list it twice, and a measured search launch it twice")
        seen[key] = position
    twins: dict[Key, int] = {}
    for position, key in enumerate(_folded_keys(result)):
        if key in twins:
            _fail(f"rows {twins[key]} and {position} ({_label(keys[position])}) differ only "
                  "in a knob that changes nothing for that layout (sequence parallelism at "
                  "tp = 1, the optimizer or overlap of one data-parallel rank): the "
                  "candidate table keeps one of such twins, and a ranking would show both")
        twins[key] = position
    rows = {key: i for i, key in enumerate(_keys(problem.candidates))}
    outside = [key for key in keys if key not in rows]
    if outside:
        _fail(f"{len(outside)} rows are no layout of the problem's space, e.g. "
              f"{_label(outside[0])}: a driver returns candidate rows, which the rules have "
              "checked")
    matched = problem.candidates.iloc[[rows[key] for key in keys]]
    for column in problem.candidates.columns.drop(["rule_reason", *KNOBS]):
        wrong = np.flatnonzero(result[column].astype(str).to_numpy()
                               != matched[column].astype(str).to_numpy())
        if len(wrong):
            first = int(wrong[0])
            _fail(f"column {column!r} of row {first} ({_label(keys[first])}) is "
                  f"{result[column].iloc[first]!r}, the candidate table's "
                  f"{matched[column].iloc[first]!r}: the row would describe another job or "
                  "layout")


def _check_columns(result: pd.DataFrame, problem: SearchProblem) -> None:
    """The cost model's columns, typed as search() ranks them, and a reason where a row
    does not fit (the rule's, where it breaks one)."""
    if result["fits"].dtype != bool:
        _fail(f"`fits` is {result['fits'].dtype}, not bool: search() ranks fitting rows "
              "first, and a missing value would read as fitting")
    for column in FIGURES:
        if not pd.api.types.is_float_dtype(result[column]):
            _fail(f"`{column}` is {result[column].dtype}, not float: rows are ranked by it")
    reasons = result["reason"]
    if not reasons.map(lambda r: isinstance(r, str)).all():
        _fail('`reason` must hold strings ("" where the row fits)')
    silent = np.flatnonzero(~result["fits"].to_numpy() & (reasons == "").to_numpy())
    if len(silent):
        _fail(f"{len(silent)} rows that do not fit have no reason, e.g. row {silent[0]}: the "
              "user would be told a layout does not fit without why (out of memory, a rule, "
              "no measurement)")
    rules = dict(zip(_keys(problem.candidates), problem.candidates["rule_reason"], strict=True))
    for position, (key, fits, reason) in enumerate(zip(_keys(result), result["fits"], reasons,
                                                       strict=True)):
        rule = rules[key]
        if rule and (fits or rule not in reason):
            _fail(f"row {position} ({_label(key)}) breaks a rule ({rule}) but has "
                  f"fits={bool(fits)}, reason {reason!r}: a layout that cannot run must say "
                  "the rule it breaks")


def _check_prices(result: pd.DataFrame, problem: SearchProblem,
                  counting: _CountingCostModel) -> None:
    """The cost model's figures on the rows it priced, each layout priced once and kept."""
    asked = Counter(counting.priced)
    twice = [(key, times) for key, times in asked.items() if times > 1]
    if twice:
        _fail(f"{len(twice)} layouts were priced more than once, e.g. {_label(twice[0][0])} "
              f"({twice[0][1]} times): under a measured cost model each is another training "
              "launch")
    keys = _keys(result)
    answered = set(keys)
    lost = [key for key in asked if key not in answered]
    if lost:
        _fail(f"{len(lost)} layouts were priced but are not in the answer, e.g. "
              f"{_label(lost[0])}: their price (a training launch under a measured cost "
              "model) is lost to the ranking")
    figures = result[list(FIGURES)].to_numpy(dtype=float)
    claims = result["fits"].to_numpy() | ~np.isnan(figures).all(axis=1)
    for position in np.flatnonzero(claims):
        key = keys[position]
        if key not in counting.figures:
            _fail(f"row {position} ({_label(key)}) carries figures or fits, but the cost "
                  "model was not asked to price that layout in this run: a price the driver "
                  "made up, or one kept from an earlier run (check a driver without a "
                  "persistent store)")
        given = counting.figures[key]
        # rtol: a figure stored as decimal text and read back (an optuna study) is the same.
        wrong = np.flatnonzero(~np.isclose(figures[position], given, rtol=1e-9, atol=0.0,
                                           equal_nan=True))
        if len(wrong):
            first = int(wrong[0])
            _fail(f"row {position} ({_label(key)}) carries {FIGURES[first]}="
                  f"{float(figures[position][first])!r} where the cost model gave "
                  f"{float(given[first])!r}: a ranking must show the cost model's figures")
    priced = [i for i, key in enumerate(keys) if key in counting.figures]
    if not priced:
        return
    picked = [priced[i] for i in sorted(set(
        np.linspace(0, len(priced) - 1, min(len(priced), REPRICED_ROWS)).round().astype(int)))]
    labels = dict(zip(_keys(problem.candidates), problem.candidates.index, strict=True))
    again = problem.evaluate(problem.candidates.loc[[labels[keys[i]] for i in picked]])
    for position, (_, fresh) in zip(picked, again.iterrows(), strict=True):
        row = result.iloc[position]
        for column in ("fits", "reason"):
            if row[column] != fresh[column]:
                _fail(f"row {position} ({_label(keys[position])}) has {column}="
                      f"{row[column]!r}, but the problem prices that layout "
                      f"{column}={fresh[column]!r}: a driver returns the rows "
                      "problem.evaluate gives it")
