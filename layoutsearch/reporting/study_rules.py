"""The study's recommendations checked on a result: which the best layout follows, which it
breaks, and why (from the breakdowns of the layouts the rules would have taken instead).

The rules are those of Hagemann et al. 2023 as `drivers.paper` applies them;
the rules' own pick is replayed on the rows the result already priced, so no cost model is
called again.

    check = check_study_rules(ranked, job_of(ranked, "check_study_rules"))
    check.summary, [v.rule for v in check.verdicts if v.follows is False]
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from layoutsearch.drivers.paper import paper_choice, wants_sequence_parallel
from layoutsearch.notes import priced_a_sample
from layoutsearch.reporting.explain import compare, label, require_ranking, same_except, twin
from layoutsearch.specs import Job

MATCH_POINTS = 1.0
"""The rules' pick 'matches' the best layout within this many MFU points."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleVerdict:
    rule: str
    follows: bool | None
    """True: the best layout follows the rule; False: it departs; None: does not apply."""
    detail: str


@dataclass(frozen=True, kw_only=True, slots=True)
class StudyCheck:
    verdicts: tuple[RuleVerdict, ...]
    best: pd.Series
    paper: pd.Series | None
    """The layout the study's rules pick among the rows this result priced."""
    gap_points: float | None
    """Best MFU minus the rules' pick's MFU, in MFU points (None when either is missing)."""
    summary: str


def _model_parallel(row: pd.Series) -> int:
    """GPUs one model replica spans: context parallelism splits it too."""
    return int(row["tp"]) * int(row["pp"]) * int(row.get("cp", 1))


def _verdicts(ranked: pd.DataFrame, job: Job, best: pd.Series,
              paper: pd.Series | None, say_no_breakdown: bool) -> list[RuleVerdict]:
    def versus(other: pd.Series | None, what: str = "the rules' layout") -> str:
        if other is None:
            return f"{what} was not priced in this result"
        return compare(best, other, say_no_breakdown=say_no_breakdown)

    mb = int(best["micro_batch_size"])
    least = None if paper is None else _model_parallel(paper)
    out = [RuleVerdict(
        rule="micro-batch 1", follows=mb == 1,
        detail="mb=1" if mb == 1 else
        "mb=1 loses at this layout: " + versus(twin(ranked, best, micro_batch_size=1),
                                                "the same layout at mb=1"),
    )]
    recompute = str(best["recompute"])
    detail = "no checkpointing"
    if recompute != "none":
        detail = (f"recompute={recompute}; without it: "
                  + versus(twin(ranked, best, recompute="none"), "recompute=none"))
        if paper is not None and paper.name != best.name:
            detail += f"; the rules' choice instead — {versus(paper)}"
    out.append(RuleVerdict(rule="prefer model parallelism over checkpointing",
                           follows=recompute == "none", detail=detail))
    size = _model_parallel(best)
    detail = f"tp·pp·cp={size}"
    if paper is not None and least is not None and size > least:
        detail += f", but tp·pp·cp={least} fits; the rules' layout: {versus(paper)}"
    out.append(RuleVerdict(rule="the least model parallelism that fits",
                           follows=None if least is None else size <= least, detail=detail))
    # The same tp·pp split with more of it in pipeline stages: cp and dp stay as they are,
    # and so does sequence parallelism, which tp 1 has none of.
    split = int(best["tp"]) * int(best["pp"])
    deeper = ranked[same_except(ranked, best, ("tp", "pp", "sequence_parallel"))
                    & ((ranked["sequence_parallel"] == best["sequence_parallel"])
                       | (ranked["tp"] == 1))
                    & (ranked["tp"] * ranked["pp"] == split) & (ranked["pp"] > best["pp"])
                    & ranked["fits"].astype(bool)]
    detail = f"tp{int(best['tp'])} pp{int(best['pp'])}"
    if not deeper.empty:
        detail += "; more pipeline stages lose: " + versus(deeper.iloc[0])
    out.append(RuleVerdict(rule="pipeline before tensor parallelism", follows=deeper.empty,
                           detail=detail))
    wanted = wants_sequence_parallel(job)
    sp = bool(best["sequence_parallel"])
    out.append(RuleVerdict(
        rule="sequence parallelism only above 30B parameters or 2k tokens",
        follows=None if int(best["tp"]) == 1 else sp == wanted,
        detail="tp=1: does not apply" if int(best["tp"]) == 1 else
        f"sequence_parallel={sp}" + ("" if sp == wanted else "; as the rule says: " + versus(
            twin(ranked, best, sequence_parallel=wanted), f"sequence_parallel={wanted}")),
    ))
    # The fused RMSNorm kernel is for RMSNorm models: for a LayerNorm one the rule asks
    # FlashAttention 2 alone, as drivers.paper applies it.
    rmsnorm = job.model.normalization == "RMSNorm"
    kernels = str(best["attention"]) == "flash2" and bool(best["rmsnorm_kernel"]) == rmsnorm
    detail = f"{best['attention']}, rmsnorm_kernel={bool(best['rmsnorm_kernel'])}"
    if not rmsnorm:
        detail += f" (the RMSNorm kernel does not apply to a {job.model.normalization} model)"
    out.append(RuleVerdict(
        rule="FlashAttention 2 with the RMSNorm kernel", follows=kernels,
        detail=detail + ("" if kernels else "; with them: " + versus(
            twin(ranked, best, attention="flash2", rmsnorm_kernel=rmsnorm),
            "flash2" + " + RMSNorm kernel" * rmsnorm)),
    ))
    if mb > 1:
        out.append(RuleVerdict(
            rule="raise the micro-batch only when model parallelism cannot shrink",
            follows=None if least is None else size <= least,
            detail=f"mb={mb} at tp·pp·cp={size}"
            + ("" if least is None or size <= least else f" although tp·pp·cp={least} fits"),
        ))
    return out


def check_study_rules(ranked: pd.DataFrame, job: Job, *, say_no_breakdown: bool = True,
                      ) -> StudyCheck | None:
    """The verdicts for the best feasible layout of `ranked`; None when nothing fits.
    `say_no_breakdown` as `explain.compare`."""
    require_ranking(ranked, "check_study_rules(ranked)")
    feasible = ranked[ranked["fits"].astype(bool)]
    if feasible.empty:
        return None
    best = feasible.iloc[0]
    paper = paper_choice(ranked, job, lambda rows: ranked.loc[rows.index]).row
    if paper is None:
        return StudyCheck(verdicts=tuple(_verdicts(ranked, job, best, None, say_no_breakdown)),
                          best=best,
                          paper=None, gap_points=None,
                          summary="the study's rules find no layout that fits among these rows")
    gap = 100 * (float(best["mfu"]) - float(paper["mfu"]))
    if paper.name == best.name:
        summary = f"the study's rules pick the best layout, {label(best)}"
    elif gap <= MATCH_POINTS:
        summary = (f"the study's rules pick {label(paper)} at {100 * paper['mfu']:.1f} % MFU, "
                   f"within {MATCH_POINTS:.0f} point of the best ({gap:.1f} points)")
    else:
        summary = (f"the study's rules miss the best layout by {gap:.1f} MFU points: "
                   + compare(best, paper, top=3, say_no_breakdown=say_no_breakdown))
    if priced_a_sample(ranked):
        # A sampling driver's rows (or a selection): the rules' pick, and what fits, are of
        # these rows only; the space may hold a layout the rules would take instead.
        summary += (f" (judged on the {len(ranked)} of the space's "
                    f"{int(ranked.attrs['space_size'])} layouts these rows hold)")
    return StudyCheck(verdicts=tuple(_verdicts(ranked, job, best, paper, say_no_breakdown)),
                      best=best,
                      paper=paper, gap_points=gap, summary=summary)
