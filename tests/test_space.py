"""SearchSpace: the study's grid, the candidate table it spans, pinning, bad values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.errors import LayoutSearchError
from layoutsearch.space import KNOBS, SearchSpace, space_names
from layoutsearch.specs import Job


@pytest.fixture
def job() -> Job:
    return Job(model=load_model("llama_13b"), cluster=load_cluster("a100_80gb"), num_gpus=64,
               seq_length=2048, global_batch_size=2048)


def test_paper_space_is_the_study_grid() -> None:
    # Hagemann et al. 2023, section 3.
    space = SearchSpace.load("paper")
    assert space.axes() == {
        "tp": (1, 2, 4, 8),
        "pp": (1, 2, 4, 8, 16),
        "cp": (1,),
        "vp": (1,),
        "micro_batch_size": (1, 2, 4, 8),
        "sequence_parallel": (False, True),
        "rmsnorm_kernel": (False, True),
        "distributed_optimizer": (True,),
        "overlap_grad_reduce": (False,),
        "attention": ("torch", "fused", "flash1", "flash2"),
        "recompute": ("none", "full"),
    }
    assert {"paper", "default"} <= set(space_names())


def test_candidates_are_the_product_minus_sp_twins_at_tp1(job: Job) -> None:
    space = SearchSpace.load("paper")
    product = 4 * 5 * 4 * 2 * 4 * 2 * 2  # tp, pp, mb, sp, attention, rmsnorm, recompute
    assert space.size() == product == 2560
    twins = 1 * 5 * 4 * 1 * 4 * 2 * 2   # tp=1 with sequence_parallel=True
    table = space.candidates(job)
    assert len(table) == product - twins == 2240
    assert not (table["sequence_parallel"] & (table["tp"] == 1)).any()
    assert not table.duplicated(subset=list(KNOBS)).any()


def test_a_space_with_sequence_parallel_on_alone_keeps_its_tp1_layouts(job: Job) -> None:
    # There is no "off" twin to keep: tp = 1 runs without it, as Megatron-LM does.
    table = SearchSpace.load("paper").pin(sequence_parallel=[True], tp=[1, 2]).candidates(job)
    assert len(table) == 2 * 5 * 4 * 4 * 2 * 2
    assert (table["sequence_parallel"] == (table["tp"] > 1)).all()


def test_a_single_data_parallel_rank_keeps_one_optimizer_and_overlap_setting() -> None:
    # Megatron-LM's DistributedOptimizer shards over the dp·cp ranks and --overlap-grad-reduce
    # hides the reduce among them: at dp·cp = 1 both change nothing, and the default space's
    # top rows came in identical pairs (llama_30b on 8 GPUs: tp4 pp2 twice, then again).
    job = Job(model=load_model("llama_13b"), cluster=load_cluster("a100_80gb"), num_gpus=8,
              seq_length=2048, global_batch_size=256)
    space = SearchSpace.load("default").pin(
        tp=[2, 4], pp=[2], cp=[1, 2], vp=[1], micro_batch_size=[1], sequence_parallel=[True],
        attention=["flash2"], rmsnorm_kernel=[True], recompute=["none"],
        distributed_optimizer=[False, True], overlap_grad_reduce=[True, False])
    table = space.candidates(job)
    layouts = list(zip(table["tp"], table["cp"], table["dp"], strict=True))
    # tp2 cp1 dp2, tp2 cp2 dp1 (dp·cp = 2) and tp4 cp2 (dp 0: the rules reject it) keep all
    # 2 x 2 settings; tp4 cp1 dp1 keeps one: the study's sharded optimizer without overlap.
    assert len(table) == 3 * 4 + 1
    assert layouts.count((2, 2, 1)) == 4 and layouts.count((4, 2, 0)) == 4
    alone = table[(table["tp"] == 4) & (table["cp"] == 1)]
    assert alone[["dp", "distributed_optimizer", "overlap_grad_reduce"]].values.tolist() == [
        [1, True, False]]
    # The default space on 8 GPUs: 138,240 knob combinations, less the 17,280 sequence-
    # parallel twins at tp = 1 and the 3,360 rows of tp·pp = 8, cp 1 with the plain optimizer
    # (tp1 pp8: 3 vp x 4 mb x 5 attention x 2 rmsnorm x 4 recompute = 480; tp 2, 4, 8 with
    # both SP values: 960 each).
    everything = SearchSpace.load("default").candidates(job)
    assert len(everything) == 138_240 - 17_280 - 3_360 == 117_600
    assert not everything.duplicated(subset=list(KNOBS)).any()


def test_dp_is_derived_and_job_columns_are_broadcast(job: Job) -> None:
    table = SearchSpace.load("paper").candidates(job)
    divides = 64 % (table["tp"] * table["pp"]) == 0
    assert (table.loc[divides, "dp"] * table.loc[divides, "tp"] * table.loc[divides, "pp"]
            == 64).all()
    assert (table.loc[~divides, "dp"] == 0).all()  # tp8 pp16 = 128 > 64 GPUs: the rules say so
    assert set(table.loc[(table["tp"] == 2) & (table["pp"] == 4), "dp"]) == {8}
    assert (table["num_layers"] == 40).all() and (table["gpu"] == "a100_80gb").all()
    assert (table["global_batch_size"] == 2048).all()
    assert table["attention"].map(type).eq(str).all()


def test_pin_restricts_knobs(job: Job) -> None:
    space = SearchSpace.load("paper").pin(tp=2, attention=["flash2", "fused"])
    assert space.tp == (2,) and space.attention == ("flash2", "fused")
    table = space.candidates(job)
    assert set(table["tp"]) == {2} and set(table["attention"]) == {"flash2", "fused"}
    assert len(table) == 5 * 4 * 2 * 2 * 2 * 2
    with pytest.raises(LayoutSearchError, match=r"cannot pin 'dp'.*knobs: tp, pp"):
        space.pin(dp=2)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"tp": [1, 0]}, r"search space tp=0: must be a positive integer"),
        ({"micro_batch_size": [2.5]}, r"micro_batch_size=2\.5: must be a positive integer"),
        ({"attention": ["flash2", "flash9"]},
         r"unknown attention 'flash9'; did you mean one of 'flash1', 'flash2', 'flash3'\? "
         r"valid attention names: "),
        ({"recompute": "sometimes"}, r"unknown recompute 'sometimes'"),
        ({"sequence_parallel": ["yes"]}, r"sequence_parallel='yes': must be true or false"),
        ({"dp": [1, 2]}, r"unknown knob 'dp'.*dp follows from num_gpus / \(tp·pp·cp\)"),
        ({"pp": []}, r"search space pp: needs at least one value"),
        ({"tp": 2.5}, r"search space tp=2\.5: must be a positive integer"),
        ({"rmsnorm_kernel": 1.0}, r"rmsnorm_kernel=1\.0: must be true or false"),
        ({"recompute": b"full"}, r"recompute=b'full': must be one of none, selective"),
        ({"attention": 2}, r"attention=2: must be one of torch, fused"),
        # Past 2**53 the table's columns were float or object: optuna's sampler never returned.
        ({"tp": [1, 2**63]},
         r"search space tp=9223372036854775808: must be a positive integer of at most 2\*\*53"),
        ({"micro_batch_size": 2**70}, r"micro_batch_size=1180591620717411303424: must be a "
                                      r"positive integer of at most 2\*\*53"),
        # A mapping passed as its keys: tp [1, 2].
        ({"tp": {1: "a", 2: "b"}},
         r"search space tp=\{1: 'a', 2: 'b'\}: must be a value or a list of values \(e\.g\. "
         r"\[1, 2\]\), not a mapping"),
        ({"name": None, "tp": [1]}, r"search space name=None: must be a non-empty string"),
        ({"name": "", "tp": [1]}, r"search space name='': must be a non-empty string"),
        ({"name": [1], "tp": [1]}, r"search space name=\[1\]: must be a non-empty string"),
    ],
)
def test_bad_space_values_are_named(fields: dict[str, object], expected: str) -> None:
    with pytest.raises(LayoutSearchError, match=expected):
        SearchSpace.from_dict(fields)


@pytest.mark.parametrize(("fields", "message"), [
    ({}, r"search space 'custom' sets no knob; name a space \(default, paper\)"),
    ({"name": "mine"}, r"search space 'mine' sets no knob"),
    (None, r"search space 'custom' is None: it must map knobs to their values"),
])
def test_a_space_that_sets_no_knob_is_refused(fields: Any, message: str) -> None:
    # {} ran every default value as a space named 'custom'; None failed on a missing .get.
    with pytest.raises(LayoutSearchError, match=message):
        SearchSpace.from_dict(fields)


def test_unknown_space_name() -> None:
    with pytest.raises(LayoutSearchError, match=r"search space 'papr'; did you mean 'paper'"):
        SearchSpace.load("papr")
    # None failed inside the name matcher; a path reached a file outside the group.
    for name in (None, "../cost_models/analytic"):
        with pytest.raises(LayoutSearchError, match=r"valid search space names: default, paper"):
            SearchSpace.load(name)  # type: ignore[arg-type]


def test_single_values_and_repeats() -> None:
    space = SearchSpace.from_dict({"tp": 2, "pp": [1, 1, 2], "attention": "flash2"})
    assert space.tp == (2,) and space.pp == (1, 2) and space.attention == ("flash2",)


def test_numpy_values_are_the_python_ones() -> None:
    space = SearchSpace.from_dict({"tp": np.int64(2), "pp": np.array([1, 2]),
                                   "sequence_parallel": np.bool_(True)})
    assert space.tp == (2,) and space.pp == (1, 2) and space.sequence_parallel == (True,)
    assert type(space.pp[0]) is int and type(space.sequence_parallel[0]) is bool


def test_a_space_built_in_python_is_validated() -> None:
    assert SearchSpace(tp=[1, 2]).tp == (1, 2)
    with pytest.raises(LayoutSearchError, match=r"search space pp=-1: must be a positive integer"):
        SearchSpace(pp=(1, -1))
