"""The search problem: candidates with rule verdicts, and the tp×pp it suggests."""

from __future__ import annotations

from layoutsearch.catalog import clusters_by_gpu, load_cluster, load_model
from layoutsearch.costs import build_cost_model
from layoutsearch.problem import SearchProblem
from layoutsearch.space import SearchSpace
from layoutsearch.specs import Job

JOB = Job(model=load_model("llama_13b"), cluster=load_cluster("a100_80gb"), num_gpus=8,
          seq_length=2048, global_batch_size=64)


def problem(space: SearchSpace) -> SearchProblem:
    return SearchProblem.build(JOB, space, build_cost_model("analytic"), clusters_by_gpu())


def test_tp_pp_are_suggested_only_when_no_layout_passes_the_rules() -> None:
    paper = SearchSpace.load("paper")
    assert problem(paper).passing_tp_pp() == []  # the rules are not what stands in the way
    # tp=16 on 8 GPUs: the pairs whose product divides 8, smallest product first.
    assert problem(paper.pin(tp=[16])).passing_tp_pp() == [
        (1, 1), (1, 2), (2, 1), (1, 4), (2, 2), (4, 1), (1, 8), (2, 4), (4, 2), (8, 1)]


def test_a_launch_check_marks_fitting_layouts_it_refuses_as_not_fitting() -> None:
    space = SearchSpace.load("paper").pin(tp=[1, 2], pp=[1], attention=["flash2"])

    def refuse_tp2(rows):
        return (rows["tp"] == 2).map({True: "cannot be launched: tp 2", False: ""})

    checked = SearchProblem.build(JOB, space, build_cost_model("analytic"), clusters_by_gpu(),
                                  launch_check=refuse_tp2)
    plain = problem(space).evaluate(problem(space).feasible_candidates())
    scored = checked.evaluate(checked.feasible_candidates())
    tp2 = scored["tp"] == 2
    assert plain.loc[tp2, "fits"].any()  # the cost model finds some to fit ...
    assert not scored.loc[tp2, "fits"].any()  # ... which the check refuses, with why
    assert set(scored.loc[tp2 & plain["fits"], "reason"]) == {"cannot be launched: tp 2"}
    assert scored.loc[~tp2, "fits"].tolist() == plain.loc[~tp2, "fits"].tolist()
