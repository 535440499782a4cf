"""The search space: the values of each knob, and the candidate table they span.

A space is a YAML file of the Hydra group `search_spaces/` (one list per knob of
`layout.LAYOUT_COLUMNS`, dp excepted: it follows from the GPU count). Enumeration is one
vectorized cartesian product; the job's columns are broadcast onto every row so that a
cost model prices a table that carries everything it needs.

    space = SearchSpace.load("paper").pin(tp=2)
    table = space.candidates(job)  # one row per layout, job columns included
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.layout import (
    ATTENTION_KERNELS,
    DATA_PARALLEL_NO_OPS,
    RECOMPUTE_KINDS,
    plain_cell,
)
from layoutsearch.paths import option_files, read_yaml_mapping
from layoutsearch.specs import LARGEST_SIZE, Job

INTEGER_KNOBS = ("tp", "pp", "cp", "vp", "micro_batch_size")
BOOLEAN_KNOBS = (
    "sequence_parallel", "rmsnorm_kernel", "distributed_optimizer", "overlap_grad_reduce",
)
CHOICE_KNOBS: dict[str, tuple[str, ...]] = {
    "attention": ATTENTION_KERNELS,
    "recompute": RECOMPUTE_KINDS,
}
KNOBS = INTEGER_KNOBS + BOOLEAN_KNOBS + tuple(CHOICE_KNOBS)


def space_names() -> list[str]:
    return list(option_files("search_spaces"))


def _plain(value: Any) -> Any:
    """A numpy integer or bool as the Python one (tp=np.int64(2) is tp=2); any other value
    as given (a rejected np.float64(2.0) is named as such)."""
    return plain_cell(value) if isinstance(value, np.bool_ | np.integer) else value


def _as_list(knob: str, values: Any) -> list[Any]:
    if isinstance(values, Mapping):
        # Iterated, a mapping would give its keys: {1: a, 2: b} would pass as tp [1, 2].
        raise LayoutSearchError(f"search space {knob}={values!r}: must be a value or a list "
                                "of values (e.g. [1, 2]), not a mapping")
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        values = [values]  # one value: a name, a number, a flag (or something wrong)
    values = [_plain(v) for v in values]
    if not values:
        raise LayoutSearchError(f"search space {knob}: needs at least one value")
    if knob in INTEGER_KNOBS:
        for v in values:
            # Past 2**53 the candidate table's int64 columns turn to float or object, whose
            # products go wrong and on which optuna's sampler never returns (2**63).
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= LARGEST_SIZE:
                raise LayoutSearchError(
                    f"search space {knob}={v!r}: must be a positive integer of at most 2**53")
    elif knob in BOOLEAN_KNOBS:
        for v in values:
            if not isinstance(v, bool):
                raise LayoutSearchError(f"search space {knob}={v!r}: must be true or false")
    else:
        valid = CHOICE_KNOBS[knob]
        for v in values:
            if not isinstance(v, str):
                raise LayoutSearchError(
                    f"search space {knob}={v!r}: must be one of {', '.join(valid)}")
            if v not in valid:
                raise LayoutSearchError(unknown_name_message(knob, str(v), valid))
    return list(dict.fromkeys(values))  # drop repeats, keep order


DP_IS_DERIVED = "dp follows from num_gpus / (tp·pp·cp)"
"""Why dp is no knob: said wherever a user tries to set it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """The values each knob may take; the candidates are their cartesian product."""

    name: str = "custom"
    tp: Sequence[int] = (1, 2, 4, 8)
    pp: Sequence[int] = (1, 2, 4, 8, 16)
    cp: Sequence[int] = (1,)
    vp: Sequence[int] = (1,)
    micro_batch_size: Sequence[int] = (1, 2, 4, 8)
    sequence_parallel: Sequence[bool] = (False, True)
    attention: Sequence[str] = ("torch", "fused", "flash1", "flash2")
    rmsnorm_kernel: Sequence[bool] = (False, True)
    recompute: Sequence[str] = ("none", "full")
    distributed_optimizer: Sequence[bool] = (True,)
    # Overlap never slows a step in the model (it hides what fits in the compute window),
    # so a space offers one value, not both: on, as Megatron-LM recommends.
    overlap_grad_reduce: Sequence[bool] = (True,)

    def __post_init__(self) -> None:
        # Validated here, not only in from_dict, so a space built in Python is checked too.
        if not isinstance(self.name, str) or not self.name.strip():
            # It labels reports and sweep summaries: null would be shown as 'None'.
            raise LayoutSearchError(f"search space name={self.name!r}: must be a non-empty "
                                    "string (a label for reports)")
        for knob in KNOBS:
            object.__setattr__(self, knob, tuple(_as_list(knob, getattr(self, knob))))

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any], name: str = "custom") -> SearchSpace:
        if not isinstance(fields, Mapping):
            raise LayoutSearchError(f"search space {name!r} is {fields!r}: it must map knobs "
                                    f"to their values; knobs: {', '.join(KNOBS)}")
        values: dict[str, Any] = {}
        name = fields.get("name", name)
        if not set(fields) - {"name", "_target_"}:
            # An empty file or mapping is more likely a mistake than a wish for the class
            # defaults, which no report would then name.
            raise LayoutSearchError(
                f"search space {name!r} sets no knob; name a space ({', '.join(space_names())})"
                f" or give values for some of the knobs {', '.join(KNOBS)}")
        for knob, raw in fields.items():
            if knob in ("name", "_target_"):
                continue
            if knob not in KNOBS:
                raise LayoutSearchError(
                    f"search space {name!r} has unknown knob {knob!r}; knobs: {', '.join(KNOBS)}"
                    + (f"; {DP_IS_DERIVED}" if knob == "dp" else "")
                )
            values[knob] = raw
        return cls(name=name, **values)

    @classmethod
    def load(cls, name: str) -> SearchSpace:
        """A space of the `search_spaces/` config group by name."""
        if not isinstance(name, str) or name not in space_names():
            raise LayoutSearchError(unknown_name_message("search space", name, space_names()))
        path = option_files("search_spaces")[name]
        return cls.from_dict(read_yaml_mapping(path, "search space"), name=name)

    def pin(self, **knobs: Any) -> SearchSpace:
        """The same space with some knobs restricted (`tp=2`, `attention=["flash2"]`)."""
        for knob in knobs:
            if knob not in KNOBS:
                raise LayoutSearchError(
                    f"cannot pin {knob!r}: not a knob of the search space; "
                    f"knobs: {', '.join(KNOBS)}"
                )
        return dataclasses.replace(self, **knobs)

    def axes(self) -> dict[str, tuple[Any, ...]]:
        return {knob: tuple(getattr(self, knob)) for knob in KNOBS}

    def size(self) -> int:
        return int(np.prod([len(v) for v in self.axes().values()]))

    def candidates(self, job: Job) -> pd.DataFrame:
        """Every layout of the space for `job`, one row each, job columns broadcast.

        dp is derived (0 where tp·pp·cp does not divide the GPUs; the rules reject those).
        Sequence parallelism at tp = 1 is a no-op in Megatron-LM, so such twins are left out
        (or, where the space has no "off" value, recorded as off). So are the twins of a
        single data-parallel rank (dp·cp = 1: `layout.DATA_PARALLEL_NO_OPS`).
        Text columns are categorical (a million rows score in a second); `results.rank`
        turns them back into plain strings for the user.
        """
        axes = self.axes()
        grids = np.meshgrid(*[np.arange(len(v)) for v in axes.values()], indexing="ij")
        columns: dict[str, Any] = {}
        for (knob, values), index in zip(axes.items(), grids, strict=True):
            flat = index.ravel()
            if knob in CHOICE_KNOBS:
                columns[knob] = pd.Categorical.from_codes(
                    flat.astype(np.int64), categories=pd.Index(list(values))
                )
            else:
                columns[knob] = np.asarray(values)[flat]
        table = pd.DataFrame(columns)
        no_op = table["sequence_parallel"] & (table["tp"] == 1)
        if False in axes["sequence_parallel"]:
            table = table[~no_op]
        else:  # a space with sequence_parallel [true] alone: tp = 1 runs without it
            table.loc[no_op, "sequence_parallel"] = False
        model_parallel = table["tp"] * table["pp"] * table["cp"]
        dp = np.where(job.num_gpus % model_parallel == 0, job.num_gpus // model_parallel, 0)
        table.insert(2, "dp", dp.astype(np.int64))
        for knob, kept in DATA_PARALLEL_NO_OPS.items():
            if len(axes[knob]) > 1:
                alone = table["dp"] * table["cp"] == 1
                table = table[~(alone & (table[knob] != kept))]
        table = table.reset_index(drop=True)
        constant = np.zeros(len(table), dtype=np.int64)
        for column, value in job.columns().items():
            if isinstance(value, str):
                table[column] = pd.Categorical.from_codes(constant, categories=pd.Index([value]))
            else:
                table[column] = value
        return table
