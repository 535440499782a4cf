"""Why one layout beats another, in words, from their time and memory breakdowns.

Cost models return breakdown columns (`time_*_s`, `memory_*_gib`);
comparing two rows component by component names what makes the difference.

    compare(best, other)  # "tp8 pp1 ... is 4.2 MFU points lower: TP communication takes 18 % ..."
    why_rejected(ranked)  # one sentence per main alternative the winner beat
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from layoutsearch.costs.base import MEASURED, UNMEASURED
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import LAYOUT_COLUMNS, Layout
from layoutsearch.notes import priced_a_sample

TIME_NAMES = {
    "gemm": "matrix multiplies",
    "attention": "attention",
    "elementwise": "element-wise ops (norms, activations)",
    "logits": "logits and loss",
    "recompute": "activation recomputation",
    "tp_comm": "TP communication",
    "pp_comm": "pipeline send/receive",
    "overhead": "per-micro-batch overhead",
    "bubble": "the pipeline bubble",
    "dp_comm": "exposed data-parallel gradient sync",
    "optimizer": "the optimizer step",
}
MEMORY_NAMES = {
    "weights": "bf16 weights",
    "gradients": "gradients",
    "optimizer": "optimizer state",
    "activations": "activations",
    "logits": "fp32 logits",
    "overhead": "CUDA context, buffers, fragmentation",
}


RANKING_COLUMNS = (*LAYOUT_COLUMNS, "mfu", "step_time_s", "peak_memory_gib", "fits", "reason")
"""What the reports read of a ranking (a `search` result, or rows of one)."""


def require_ranking(frame: pd.DataFrame | pd.Series, who: str,
                    columns: Iterable[str] = RANKING_COLUMNS) -> None:
    """Refuse a frame, or a row, that is not (part of) a ranking, naming what it lacks of
    `columns`."""
    have = frame.index if isinstance(frame, pd.Series) else frame.columns
    missing = [c for c in columns if c not in have]
    if not missing:
        return
    predicted = [c for c in missing if f"predicted_{c}" in have]
    hint = (f" (a predict() frame holds {', '.join(f'predicted_{c}' for c in predicted)}: "
            "measured rows beside a model's figures, not a ranking)" if predicted else "")
    raise LayoutSearchError(
        f"{who}: the {'row' if isinstance(frame, pd.Series) else 'frame'} lacks the "
        f"ranking's column(s) {', '.join(missing)}{hint}; pass what layoutsearch.search "
        "returned")


def time_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith("time_") and c.endswith("_s")]


def memory_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith("memory_") and c.endswith("_gib")]


def component_name(column: str) -> str:
    """`time_tp_comm_s` -> 'TP communication'; unknown components keep their own words."""
    if column.startswith("memory_"):
        core = column.removeprefix("memory_").removesuffix("_gib")
        return MEMORY_NAMES.get(core, core.replace("_", " "))
    core = column.removeprefix("time_").removesuffix("_s")
    return TIME_NAMES.get(core, core.replace("_", " "))


def label(row: pd.Series) -> str:
    return Layout.from_row(row).describe()


NO_BREAKDOWN = "this cost model gives no time breakdown to say why"
"""What a comparison says in place of the components behind an MFU gap (a replay's)."""


def compare(winner: pd.Series, other: pd.Series, *, top: int = 2,
            say_no_breakdown: bool = True) -> str:
    """Why `other` lost to `winner`: its MFU gap and the step-time components behind it.

    Without a time breakdown the gap is all there is; `say_no_breakdown` adds NO_BREAKDOWN
    (a report, which compares many layouts, says it once instead)."""
    require_ranking(other, "compare(other)", ("fits", "reason"))
    if not bool(other["fits"]):
        # No MFU: the layout breaks a rule or the cost model has no figures for it (a
        # replay's unmeasured layout); it was not priced, which is not "does not fit". A
        # layout whose runs failed (out of memory) has no MFU either, but it was tried.
        unpriced = "mfu" in other.index and pd.isna(other["mfu"])
        verdict = ("did not run" if str(other["reason"]).startswith(MEASURED)
                   else "was not priced" if unpriced else "does not fit")
        return f"{label(other)} {verdict}: {other['reason'] or 'no reason given'}"
    for row, name in ((winner, "winner"), (other, "other")):
        require_ranking(row, f"compare({name})", ("mfu", "step_time_s"))
    gap = 100 * (float(winner["mfu"]) - float(other["mfu"]))
    head = f"{label(other)} reaches {100 * float(other['mfu']):.1f} % MFU ({gap:.1f} points lower)"
    columns = [c for c in time_columns(pd.DataFrame([winner])) if c in other.index]
    if not columns:
        return head + f" ({NO_BREAKDOWN})" * say_no_breakdown
    step_w, step_o = float(winner["step_time_s"]), float(other["step_time_s"])
    deltas = sorted(columns, key=lambda c: float(other[c]) - float(winner[c]), reverse=True)
    reasons = []
    for column in deltas[:top]:
        extra = float(other[column]) - float(winner[column])
        if extra <= 0.005 * step_w:  # under half a percent of the step: not a reason
            break
        reasons.append(
            f"{component_name(column)} takes {100 * float(other[column]) / step_o:.0f} % of its "
            f"step vs {100 * float(winner[column]) / step_w:.0f} % (+{extra:.2f} s)"
        )
    return head + (": " + "; ".join(reasons) if reasons else "")


def same_except(frame: pd.DataFrame, row: pd.Series, knobs: Iterable[str]) -> pd.Series:
    mask = pd.Series(True, index=frame.index)
    for knob in LAYOUT_COLUMNS:
        if knob not in knobs and knob in frame.columns:
            mask &= frame[knob] == row[knob]
    return mask


def twin(frame: pd.DataFrame, row: pd.Series, **changes: Any) -> pd.Series | None:
    """The row of `frame` equal to `row` in every knob but `changes` (None if not priced)."""
    mask = same_except(frame, row, changes)
    for knob, value in changes.items():
        mask &= frame[knob] == value
    found = frame[mask]
    return None if found.empty else found.iloc[0]


ALTERNATIVE_AXES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model parallelism (tp, pp)", ("tp", "pp")),
    ("micro-batch size", ("micro_batch_size",)),
    ("activation recomputation", ("recompute",)),
    ("attention kernel", ("attention",)),
    ("RMSNorm kernel", ("rmsnorm_kernel",)),
    ("sequence parallelism", ("sequence_parallel",)),
)
"""The knobs along which a report names the winner's strongest rival."""


def _best_twin(ranked: pd.DataFrame, winner: pd.Series, knobs: tuple[str, ...]) -> pd.Series | None:
    """The best-ranked row that differs from `winner` only in `knobs` (feasible rows first)."""
    rows = ranked[same_except(ranked, winner, (*knobs, "dp"))]
    differs = pd.Series(False, index=rows.index)
    for knob in knobs:
        differs |= rows[knob] != winner[knob]
    rows = rows[differs]
    return None if rows.empty else rows.iloc[0]


def _none_fits(rivals: pd.DataFrame, among: str) -> str:
    """Why no layout of `rivals` (those with another value of a knob) fits, by their two
    commonest reasons. Layouts a replay has no measurement of are not known not to fit: when
    they are all there is, none was measured; beside others, they are counted apart."""
    reasons = rivals["reason"].fillna("").replace("", "not priced")
    unmeasured = reasons.str.startswith(UNMEASURED)

    def commonest(rows: pd.Series) -> str:
        return "; ".join(f"{reason} ({count} layout{'s' * (count != 1)})"
                         for reason, count in rows.value_counts().head(2).items())
    if unmeasured.all():
        return f"no layout{among} with another value was measured — {commonest(reasons)}"
    text = f"no layout{among} with another value fits — {commonest(reasons[~unmeasured])}"
    if unmeasured.any():
        more = int(unmeasured.sum())
        text += f"; {more} more {'was' if more == 1 else 'were'} not measured"
    return text


def why_rejected(ranked: pd.DataFrame, *, say_no_breakdown: bool = True) -> list[str]:
    """For each knob: its best other value at the winner's layout and overall, and why it lost.

    The twin (the same layout with only this knob changed) isolates the knob's own effect;
    the best feasible layout with another value shows what the rest of the space offers.
    An empty ranking has no winner and nothing to explain. `say_no_breakdown` as `compare`.
    """
    require_ranking(ranked, "why_rejected(ranked)")
    if ranked.empty:
        return []
    winner = ranked.iloc[0]
    lines = []
    for title, knobs in ALTERNATIVE_AXES:
        differs = pd.Series(False, index=ranked.index)
        for knob in knobs:
            differs |= ranked[knob] != winner[knob]
        rivals = ranked[differs]
        if rivals.empty:
            continue  # the space has a single value on this axis
        parts = []
        closest = _best_twin(ranked, winner, knobs)
        if closest is not None:
            parts.append("changing only this: "
                         + compare(winner, closest, say_no_breakdown=say_no_breakdown))
        feasible = rivals[rivals["fits"].astype(bool)]
        if not feasible.empty and (closest is None or feasible.index[0] != closest.name):
            parts.append("best layout with another value: " + compare(
                winner, feasible.iloc[0], say_no_breakdown=say_no_breakdown))
        elif feasible.empty:
            parts.append(_none_fits(rivals, " this driver priced" * priced_a_sample(ranked)))
        lines.append(f"**{title}**: " + "; ".join(parts))
    return lines
