"""The study's rules as a driver: the layout Hagemann et al. 2023 would pick, without a search.

Their recommendations (arXiv 2311.05610 §5): micro-batch 1; no activation
checkpointing; the least model parallelism (tp·pp) that fits, pipeline before tensor;
sequence parallelism only above ~30B parameters or 2k tokens; FlashAttention 2 with the
fused RMSNorm kernel; raise the micro-batch only when model parallelism cannot shrink. Only
"does it fit" needs the cost model, asked for one layout at a time, smallest tp·pp first and
the most pipeline stages first within a size, stopping at the first that fits; then the
larger micro-batches of that layout, smallest first, up to the first out of memory. An
expensive backend (a measured search launches each row it prices) prices a handful of rows,
and the answer holds every one of them. `paper_choice` walks the same rules over any pricing
function, so a report can replay them on an already-scored table.

    ranked = layoutsearch.search(model="llama_13b", num_gpus=64, seq_length=2048,
                                 global_batch_size=2048, driver="paper")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from layoutsearch.errors import LayoutSearchError
from layoutsearch.problem import SearchProblem
from layoutsearch.progress import Progress
from layoutsearch.specs import Job

SP_MIN_PARAMETERS = 30e9
"""Sequence parallelism pays off above ~30B parameters (Hagemann et al. 2023, finding 4) ..."""
SP_MIN_SEQ_LENGTH = 2048
"""... or for sequences longer than 2k tokens."""
ATTENTION_PREFERENCE = ("flash2", "flash3", "flash1", "fused", "torch")
"""FlashAttention 2 first (the study's best kernel); the rest only if a space lacks it."""
RECOMPUTE_FALLBACK = ("none", "mlp", "full")
"""No checkpointing; if nothing fits, the MLP only (FlashAttention already recomputes
attention), then every layer."""
NO_RULE_LAYOUT = ("no candidate has the settings the study's rules pick (micro-batch 1 with "
                  "recompute none, mlp or full)")
RULE_COLUMN = "paper_rule"
"""The column that explains each row's part in the choice."""
PASSED_OVER = "passed over by the rules: "
"""How RULE_COLUMN starts for a row the rules priced but did not pick."""

Evaluate = Callable[[pd.DataFrame], pd.DataFrame]


def wants_sequence_parallel(job: Job) -> bool:
    """The study's finding 4: SP for models above ~30B parameters or sequences above 2k."""
    return job.model.num_parameters() > SP_MIN_PARAMETERS or job.seq_length > SP_MIN_SEQ_LENGTH


def _prefer(values: pd.Series, order: tuple[Any, ...]) -> Any:
    """The first of `order` that occurs in `values` (the space may lack the favourite)."""
    present = set(values)
    return next((v for v in order if v in present), values.iloc[0])


def rule_layouts(candidates: pd.DataFrame, job: Job) -> pd.DataFrame:
    """The rows the rules can pick from: their kernels, optimizer and SP setting.

    Knobs the study did not vary (cp, vp) keep their smallest value; the optimizer state is
    sharded (ZeRO-1) and the data-parallel communication not overlapped, as in the study,
    so each tp·pp is one row: a space with both overlap settings would otherwise price
    twins (a launch each) and pick whichever its list names first.
    """
    rows = candidates
    rows = rows[rows["attention"] == _prefer(rows["attention"], ATTENTION_PREFERENCE)]
    # The fused RMSNorm kernel is for RMSNorm models; the rules reject it for LayerNorm.
    kernel_first = (True, False) if job.model.normalization == "RMSNorm" else (False, True)
    rows = rows[rows["rmsnorm_kernel"] == _prefer(rows["rmsnorm_kernel"], kernel_first)]
    rows = rows[rows["distributed_optimizer"] == _prefer(rows["distributed_optimizer"],
                                                         (True, False))]
    rows = rows[rows["overlap_grad_reduce"] == _prefer(rows["overlap_grad_reduce"],
                                                       (False, True))]
    rows = rows[(rows["cp"] == rows["cp"].min()) & (rows["vp"] == rows["vp"].min())]
    sp = wants_sequence_parallel(job)
    multi_tp = rows["tp"] > 1
    sp_choice = _prefer(rows.loc[multi_tp, "sequence_parallel"], (sp, not sp)) if multi_tp.any() \
        else False
    return rows[~multi_tp | (rows["sequence_parallel"] == sp_choice)]


def _label(row: pd.Series) -> str:
    return f"tp{int(row['tp'])} pp{int(row['pp'])}"


@dataclass(frozen=True, kw_only=True, slots=True)
class PaperChoice:
    """What the rules picked, and every row they priced on the way."""

    priced: pd.DataFrame
    """The rows priced, in the order the rules tried them, with RULE_COLUMN."""
    chosen: Any
    """Index label of the chosen row in `priced`; None when nothing fits."""
    calls: int
    """How many times the pricing function was called."""
    why: str
    """Why the chosen row, or why none."""

    @property
    def row(self) -> pd.Series | None:
        return None if self.chosen is None else self.priced.loc[self.chosen]

    def frame(self) -> pd.DataFrame:
        """Every row priced (the driver's answer). The chosen one is the fastest of those
        that fit: the rules stop at the first size that fits, and keep a larger micro-batch
        only when it is faster."""
        return self.priced


@dataclass(kw_only=True, slots=True)
class _Pricer:
    """Prices rows through `evaluate`, keeping every priced row and the number of calls."""

    evaluate: Evaluate
    priced: list[pd.DataFrame]
    calls: int = 0

    def __call__(self, rows: pd.DataFrame) -> pd.DataFrame:
        self.calls += 1
        scored = self.evaluate(rows)
        self.priced.append(scored)
        return scored


def paper_choice(candidates: pd.DataFrame, job: Job, evaluate: Evaluate) -> PaperChoice:
    """Walk the study's rules over `candidates`, pricing rows with `evaluate` as needed."""
    pool = rule_layouts(candidates, job)
    price = _Pricer(evaluate=evaluate, priced=[])
    misses: list[str] = []
    for recompute in [r for r in RECOMPUTE_FALLBACK if r in set(pool["recompute"])]:
        level = pool[(pool["recompute"] == recompute) & (pool["micro_batch_size"] == 1)]
        for size in sorted(set(level["tp"] * level["pp"])):
            # Same tp·pp: more pipeline stages first (the study's PP-over-TP finding).
            group = level[level["tp"] * level["pp"] == size].sort_values("pp", ascending=False)
            tried = _price_until(group, price, stop=_fits)
            if not bool(tried["fits"].iloc[-1]):
                first = tried.iloc[0]
                misses.append(f"{_label(first)}: {first['reason'] or 'does not fit'}")
                continue
            why = _explain(job, tried.iloc[-1], recompute, misses)
            chosen, why = _raise_micro_batch(pool, price, tried.iloc[-1], why)
            return _finish(price, pool, chosen, why)
    if not price.calls:  # e.g. a space without micro-batch 1, or an optuna search's rows
        return _finish(price, pool, None, NO_RULE_LAYOUT)
    return _finish(price, pool, None,
                   "nothing fits under the study's rules: " + "; ".join(misses[-3:]))


def _price_until(rows: pd.DataFrame, price: _Pricer,
                 stop: Callable[[pd.Series], bool]) -> pd.DataFrame:
    """`rows` priced one at a time, in order, up to the first that `stop` says settles the
    rule: one launch each with a measured cost model, and none past that one."""
    tried = []
    for label in rows.index:
        tried.append(price(rows.loc[[label]]))
        if stop(tried[-1].iloc[0]):
            break
    return pd.concat(tried)


def _fits(row: pd.Series) -> bool:
    return bool(row["fits"])


def _out_of_memory(row: pd.Series) -> bool:
    """Whether the cost model says the row runs out of memory: predicted over the GPU's
    memory (negative headroom) or measured `oom`. Not a failed launch, a rule the row breaks
    or a layout never measured: those say nothing of the next micro-batch."""
    headroom = pd.to_numeric(row.get("headroom_gib", float("nan")), errors="coerce")
    return bool(headroom < 0) or row.get("measured_status") == "oom"


def _finish(price: _Pricer, pool: pd.DataFrame, chosen: Any, why: str) -> PaperChoice:
    rows = pd.concat(price.priced) if price.priced else pool.iloc[0:0].copy()
    if chosen is None:
        rows[RULE_COLUMN] = why
        return PaperChoice(priced=rows, chosen=None, calls=price.calls, why=why)
    rows[RULE_COLUMN] = [
        why if label == chosen
        else f"{PASSED_OVER}{reason or 'fits, no faster than the pick'}"
        for label, reason in zip(rows.index, rows["reason"].fillna(""), strict=True)
    ]
    return PaperChoice(priced=rows, chosen=chosen, calls=price.calls, why=why)


def _explain(job: Job, row: pd.Series, recompute: str, misses: list[str]) -> str:
    sp = "sequence parallel" if bool(row["sequence_parallel"]) else "no sequence parallelism"
    sp_why = ("(> 30B parameters or > 2k tokens)" if wants_sequence_parallel(job)
              else "(≤ 30B parameters and ≤ 2k tokens)")
    parts = [
        f"study rules: micro-batch 1, {row['attention']}"
        + (" + RMSNorm kernel" if bool(row["rmsnorm_kernel"]) else ""),
        f"{sp} {sp_why}" if int(row["tp"]) > 1 else "tp=1 needs no sequence parallelism",
        f"least model parallelism that fits: tp·pp={int(row['tp']) * int(row['pp'])}, "
        f"pipeline before tensor → {_label(row)}",
    ]
    if misses:
        parts.append("smaller ones do not fit (" + "; ".join(misses[-2:]) + ")")
    if recompute != "none":
        parts.append(f"recompute={recompute}: no model-parallel size fits without checkpointing")
    return "; ".join(parts)


def _raise_micro_batch(pool: pd.DataFrame, price: _Pricer, base: pd.Series,
                       why: str) -> tuple[Any, str]:
    """At the least model parallelism (it cannot shrink further), try larger micro-batches.

    The study raises the micro-batch only then; we keep the larger one only if the cost
    model says it fits and is faster. They are priced smallest first, up to the first that
    runs out of memory: a larger one holds more activations and would too.
    """
    same = (
        (pool["tp"] == base["tp"]) & (pool["pp"] == base["pp"])
        & (pool["recompute"] == base["recompute"]) & (pool["micro_batch_size"] > 1)
        & (pool["sequence_parallel"] == base["sequence_parallel"])
    )
    if not same.any():
        return base.name, why
    bigger = _price_until(pool[same].sort_values("micro_batch_size"), price,
                          stop=_out_of_memory)
    better = bigger[bigger["fits"].astype(bool) & (bigger["mfu"] > base["mfu"])]
    if better.empty:
        return base.name, why
    top = better.loc[better["mfu"].idxmax()]
    why += (f"; model parallelism cannot shrink further, so the micro-batch is raised to "
            f"{int(top['micro_batch_size'])} (fits, MFU {100 * top['mfu']:.1f} % vs "
            f"{100 * base['mfu']:.1f} % at mb=1)")
    return top.name, why


class PaperDriver:
    """The study's rules: a zero-search baseline that prices a handful of layouts."""

    name = "paper"

    def __init__(self, *, progress: bool | None = None) -> None:
        self.progress = progress
        """Show a progress line (None: only on a terminal or with LAYOUTSEARCH_PROGRESS)."""

    def run(self, problem: SearchProblem) -> pd.DataFrame:
        with Progress(label="paper rules", enabled=self.progress) as progress:
            def evaluate(rows: pd.DataFrame) -> pd.DataFrame:
                scored = problem.evaluate(rows)
                progress.update(scored)
                return scored

            choice = paper_choice(problem.candidates, problem.job, evaluate)
        if not choice.calls:
            # Nothing to price, so no answer to rank: the space is the mistake.
            sizes = sorted(set(problem.candidates["micro_batch_size"]))
            kinds = sorted(set(problem.candidates["recompute"]))
            missing = [*(["micro_batch_size 1"] if 1 not in sizes else []),
                       *(["a recompute of none, mlp or full"]
                         if not set(kinds) & set(RECOMPUTE_FALLBACK) else [])]
            raise LayoutSearchError(
                f"driver=paper: {choice.why}; the space offers micro_batch_size {sizes} and "
                f"recompute {kinds}: add {' and '.join(missing)}, or search this space with "
                "driver=grid")
        return choice.frame()

