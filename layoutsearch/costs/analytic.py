"""The analytic cost model: time and memory of every candidate from first principles.

It prices a whole candidate table in vectorized calls (a big one in row blocks, one per
CPU core, side by side: `blocks.py`): memory per GPU by component (`memory.py`), seconds
per step by component (`timing.py`), then MFU by the study's formula, tokens/s and the
go/no-go `fits`. Its constants — efficiencies and overheads per GPU kind — come from
`cost_models/analytic.yaml` or a calibrated copy.

    model = AnalyticCostModel.load("analytic")
    scored = model.score(candidates, clusters)   # step_time_s, mfu, peak_memory_gib, ...
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.costs.blocks import in_blocks
from layoutsearch.costs.constants import (
    AnalyticConstants,
    analytic_config,
    fitted_gpus,
    parse_constants,
)
from layoutsearch.costs.memory import GIB, memory_breakdown
from layoutsearch.costs.shapes import Array, Shapes, by_gpu_kind, total
from layoutsearch.costs.timing import time_breakdown
from layoutsearch.errors import LayoutSearchError
from layoutsearch.paths import option_files, option_mapping
from layoutsearch.specs import ClusterSpec
from layoutsearch.text_columns import text_column


class AnalyticCostModel:
    """Time and memory from formulas with a few physical constants per GPU kind."""

    name = "analytic"

    def __init__(self, constants: Mapping[str, AnalyticConstants], source: str = "",
                 fitted: frozenset[str] | None = None) -> None:
        self.constants = dict(constants)
        self.source = source
        self.fitted = fitted
        """The GPU kinds whose constants were fitted to measured runs of that kind (the
        config's `provenance.gpus`); None when the config does not say."""

    @classmethod
    def load(cls, name_or_path: str | Path = "analytic") -> AnalyticCostModel:
        """Constants from a `cost_models/` config by name, or from a YAML file."""
        path, config = analytic_config(name_or_path)
        return cls(parse_constants(config, str(path)), source=str(name_or_path),
                   fitted=fitted_gpus(config, str(path)))

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str = "") -> AnalyticCostModel:
        """From a `cost_models/` config: a `gpus:` mapping (and optional `provenance:`)."""
        unknown = set(config) - {"gpus", "provenance"}
        if unknown:
            raise LayoutSearchError(
                f"{source}: unknown setting(s) {', '.join(sorted(unknown))} for the analytic "
                "cost model; it takes 'gpus' (constants per GPU kind) and 'provenance'"
            )
        return cls(parse_constants(config, source), source=source,
                   fitted=fitted_gpus(config, source))

    def fingerprint(self) -> str:
        """A digest of the constants: two files with the same constants price alike."""
        constants = {gpu: c.to_dict() for gpu, c in sorted(self.constants.items())}
        return hashlib.sha1(json.dumps(constants, sort_keys=True).encode()).hexdigest()[:16]

    def fingerprint_covers(self) -> str:
        return f"the constants of {self.source or 'this analytic model'}: they changed"

    def config_name(self) -> str | None:
        """The `cost_models/` config holding these very constants (e.g. `analytic`), if any:
        the name a measured search's `prescreen` takes to rank as this model does. Files that
        are not analytic configs, or not valid ones, are passed over."""
        mine = self.fingerprint()
        for name, path in option_files("cost_models").items():
            config = option_mapping(path)
            if config is None or config.get("_target_") != f"{__name__}.AnalyticCostModel":
                continue
            try:
                constants = parse_constants(config, str(path))
            except LayoutSearchError:
                continue
            if AnalyticCostModel(constants).fingerprint() == mine:
                return name
        return None

    def _per_row(self, shapes: Shapes) -> dict[str, Array]:
        codes, kinds = shapes.gpu_codes, shapes.gpu_kinds
        missing = set(kinds) - set(self.constants)
        if missing:
            raise LayoutSearchError(
                f"cost model {self.source or self.name!r} has no constants for GPU kind(s) "
                f"{', '.join(sorted(missing))}; it covers {', '.join(sorted(self.constants))}."
                f" Add them to a copy of cost_models/analytic_prior.yaml (its comments say "
                f"where each value comes from) and name that copy as the cost model"
            )
        out: dict[str, Array] = {}
        for field in AnalyticConstants.__dataclass_fields__:
            out[field] = by_gpu_kind([getattr(self.constants[g], field) for g in kinds], codes)
        return out

    def score(
        self, candidates: pd.DataFrame, clusters: Mapping[str, ClusterSpec]
    ) -> pd.DataFrame:
        columns = in_blocks(lambda block: self._price(block, clusters), candidates)
        limit_gib = columns.pop(MEMORY_LIMIT)
        # copy=False: the columns stay the arrays just computed; consolidating ~50 float
        # columns into one block copies them all (~0.2 s of a 1.2M-row table).
        frame = pd.DataFrame(columns, index=candidates.index, copy=False)
        frame["cost_reason"] = _memory_reasons(columns["peak_memory_gib"], limit_gib,
                                               columns["fits"], frame.index).array
        return frame

    def _price(self, candidates: pd.DataFrame, clusters: Mapping[str, ClusterSpec],
               ) -> dict[str, Array]:
        """The prediction columns of the rows of `candidates`, and each row's GPU memory
        (GiB) as `MEMORY_LIMIT`, for the reasons of those that do not fit."""
        shapes = Shapes.of(candidates, clusters)
        constants = self._per_row(shapes)
        times = time_breakdown(shapes, constants)
        memory = memory_breakdown(shapes, constants)
        step = total(times.values())
        peak_bytes = total(memory.values())
        tokens_per_step = shapes.global_batch * shapes.layer.seq
        mfu = shapes.mfu(step)
        fits = peak_bytes <= shapes.memory_bytes
        out = {
            "step_time_s": step,
            "mfu": mfu,
            "tokens_per_s": tokens_per_step / step,
            "peak_memory_gib": peak_bytes / GIB,
            "fits": fits,
            # GPU memory minus the predicted peak (negative: over). On the study's runs the
            # FlashAttention layouts predicted to fit that ran out of memory had under 5 GiB
            # of it, fused and torch ones under 13 GiB (notes.safe_headroom_gib): treat a
            # layout with less headroom than that as a gamble, and prefer the next one if
            # the gap is small.
            "headroom_gib": (shapes.memory_bytes - peak_bytes) / GIB,
        }
        out.update({f"time_{name}_s": value for name, value in times.items()})
        out.update({f"memory_{name}_gib": value / GIB for name, value in memory.items()})
        out[MEMORY_LIMIT] = np.broadcast_to(shapes.memory_bytes / GIB, step.shape)
        return out


MEMORY_LIMIT = "gpu memory (GiB)"
"""Key of each row's GPU memory among `_price`'s columns; not a prediction column."""

PACKED_PEAK_TENTHS = 2**38
"""Peaks below this many tenths of a GiB (27 billion GiB) pack with a limit below 2**24
tenths into one int64 key; an absurd size (a 2**53 vocabulary, an infinite peak) takes the
slower path."""


def _memory_reasons(peak_gib: Array, limit_gib: Array, fits: Array, index: pd.Index,
                    ) -> pd.Series:
    """'needs 91.2 GiB > 80.0 GiB per GPU' where a row does not fit, "" elsewhere.

    Formatted once per distinct (peak, limit) pair at 0.1 GiB: thousands of strings for a
    million rows, gathered into the column by code (text_columns).
    """
    codes = np.zeros(len(peak_gib), dtype=np.intp)  # 0: "", the reason of a row that fits
    over = ~fits
    if not over.any():
        return text_column(codes, [""], index)
    limit_gib = np.broadcast_to(limit_gib, peak_gib.shape)  # one number for one GPU kind
    tenths = np.round(np.stack([peak_gib[over], limit_gib[over]], axis=1) * 10)
    if np.all(tenths[:, 0] < PACKED_PEAK_TENTHS):  # False for a NaN peak too
        # One integer key per pair of tenths of a GiB, factorized by hashing: a 2-D unique
        # sorts rows, an order slower, and a 1-D one still sorts a million keys.
        pairs = tenths.astype(np.int64)
        inverse, keys = pd.factorize(pairs[:, 0] * 2**24 + pairs[:, 1])
        distinct = np.stack([keys // 2**24, keys % 2**24], axis=1)
    else:
        distinct, inverse = np.unique(tenths, axis=0, return_inverse=True)
    codes[over] = inverse.ravel() + 1
    # Python numbers: formatting numpy scalars is twice as slow.
    texts = [f"needs {peak / 10:.1f} GiB > {limit / 10:.1f} GiB per GPU"
             for peak, limit in distinct.tolist()]
    return text_column(codes, ["", *texts], index)
