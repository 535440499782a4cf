"""The driver conformance suite passes the built-in drivers and catches broken ones."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from layoutsearch.drivers import build_driver
from layoutsearch.drivers.grid import GridDriver
from layoutsearch.problem import SearchProblem
from layoutsearch.testing import check_driver, conformance_problem


@pytest.fixture(scope="module")
def problem() -> SearchProblem:
    return conformance_problem()


def test_the_built_in_drivers_pass(problem):
    grid = check_driver(build_driver("grid"), problem)
    assert len(grid) == len(problem.candidates)
    # The problem holds layouts that fit, run out of memory and break a rule.
    assert grid["fits"].any() and grid["reason"].str.contains("GiB per GPU").any()
    assert (problem.candidates["rule_reason"] != "").any()
    paper = check_driver(build_driver("paper"), problem)
    assert 0 < len(paper) < len(problem.candidates)
    # A sampler under a budget answers with fewer rows than the space.
    sampled = check_driver(build_driver({"name": "optuna", "n_trials": 6}), problem)
    assert len(sampled) == 6


class Broken:
    """The grid's answer, spoilt by `spoil(answer, problem)`."""

    name = "broken"

    def __init__(self, spoil):
        self.spoil = spoil

    def run(self, problem):
        return self.spoil(GridDriver().run(problem), problem)


def _duplicate_row(answer, problem):
    return pd.concat([answer, answer.iloc[[3]]])


def _sequence_parallel_at_tp1(answer, problem):
    twin = answer[answer["tp"] == 1].head(1).assign(sequence_parallel=True)
    return pd.concat([answer, twin])


def _one_rank_without_the_distributed_optimizer(answer, problem):
    twin = answer[answer["dp"] == 1].head(1).assign(distributed_optimizer=False)
    return pd.concat([answer, twin])


def _outside_the_space(answer, problem):
    return answer.assign(micro_batch_size=answer["micro_batch_size"] * 4)


def _float_tp(answer, problem):
    return answer.assign(tp=answer["tp"].astype(float))


def _invented_price(answer, problem):
    # Rows the rules reject never reach the cost model; this one is given a price anyway.
    answer = answer.copy()
    rejected = answer.index[problem.candidates["rule_reason"] != ""][0]
    answer.loc[rejected, ["mfu", "step_time_s"]] = [0.5, 1.0]
    return answer


def _altered_price(answer, problem):
    return answer.assign(mfu=answer["mfu"] * 1.01)


def _out_of_memory_said_to_fit(answer, problem):
    answer = answer.copy()
    answer.loc[answer["reason"].str.contains("GiB per GPU"), ["fits", "reason"]] = [True, ""]
    return answer


def _dropped_reasons(answer, problem):
    return answer.assign(reason="")


def _fits_as_object(answer, problem):
    return answer.assign(fits=answer["fits"].astype(object).where(answer["mfu"].notna(), None))


def _fitting_rule_breaker(answer, problem):
    answer = answer.copy()
    answer.loc[problem.candidates["rule_reason"] != "", ["fits", "reason"]] = [True, ""]
    return answer


def _priced_twice(answer, problem):
    problem.evaluate(problem.candidates.head(2))
    return answer


def _price_lost(answer, problem):
    return answer.head(10)


def _changed_candidates(answer, problem):
    problem.candidates["rule_reason"] = ""
    return answer


@pytest.mark.parametrize(("spoil", "caught"), [
    (_duplicate_row, "same layout"),
    (_sequence_parallel_at_tp1, "changes nothing"),
    (_one_rank_without_the_distributed_optimizer, "changes nothing"),
    (_outside_the_space, "no layout of the problem's space"),
    (_float_tp, "column 'tp' is float"),
    (_invented_price, "not asked to price"),
    (_altered_price, "where the cost model gave"),
    (_out_of_memory_said_to_fit, "but the problem prices that layout fits=False"),
    (_dropped_reasons, "have no reason"),
    (_fits_as_object, "`fits` is object"),
    (_fitting_rule_breaker, "breaks a rule"),
    (_priced_twice, "priced more than once"),
    (_price_lost, "lost to the ranking"),
    (_changed_candidates, "changed the problem's candidate table"),
])
def test_a_broken_driver_is_caught_with_what_it_broke(spoil, caught):
    with pytest.raises(AssertionError, match=caught):
        check_driver(Broken(spoil), conformance_problem())


class Unrepeatable:
    """Samples afresh each run; `seed` says whether it claims to repeat."""

    name = "unrepeatable"

    def __init__(self, seed):
        self.seed = seed
        self.rng = np.random.default_rng(0)

    def run(self, problem):
        rows = problem.feasible_candidates()
        return problem.evaluate(rows.iloc[self.rng.choice(len(rows), 5, replace=False)])


def test_a_seeded_driver_must_repeat_its_rows_and_one_seeded_none_need_not(problem):
    with pytest.raises(AssertionError, match="second run on the same problem"):
        check_driver(Unrepeatable(seed=0), problem)
    assert len(check_driver(Unrepeatable(seed=None), problem)) == 5
