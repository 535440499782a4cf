"""The run report: `report.md` with the job, the top layouts, figures and explanations.

    path = write_report(ranked, Path("outputs/run"))   # outputs/run/report.md + PNGs
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import LAYOUT_COLUMNS
from layoutsearch.megatron import with_megatron_args
from layoutsearch.megatron.emit import (
    MEGATRON_SETTINGS,
    best_command_environment,
    best_command_requirements,
)
from layoutsearch.reporting.explain import (
    NO_BREAKDOWN,
    component_name,
    label,
    require_ranking,
    time_columns,
    why_rejected,
)
from layoutsearch.reporting.plots import BREAKDOWN, MFU_VS_MEMORY, TP_PP_HEATMAP, save_figures
from layoutsearch.reporting.study_rules import StudyCheck, check_study_rules
from layoutsearch.results import NOTED_FOR, TOP_K, counts_line, grouped, job_of, notes_key, rank
from layoutsearch.specs import Job

SHOWN_KNOBS = tuple(k for k in LAYOUT_COLUMNS
                    if k not in ("cp", "vp", "distributed_optimizer", "overlap_grad_reduce"))
"""Knobs the top-k table shows; cp, vp, the optimizer sharding and the data-parallel overlap
appear only if they vary."""


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def markdown_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def top_table(ranked: pd.DataFrame, k: int = TOP_K) -> str:
    """The best `k` layouts: knobs, MFU, step time, peak memory, fits."""
    require_ranking(ranked, "top_table(ranked)")
    knobs = [c for c in LAYOUT_COLUMNS if c in SHOWN_KNOBS or ranked[c].nunique() > 1]
    rows = []
    for position, (_, row) in enumerate(ranked.head(k).iterrows(), start=1):
        rows.append([position, *(row[c] for c in knobs),
                     f"{100 * row['mfu']:.1f}" if pd.notna(row["mfu"]) else "—",
                     f"{row['step_time_s']:.2f}" if pd.notna(row["step_time_s"]) else "—",
                     f"{row['peak_memory_gib']:.1f}" if pd.notna(row["peak_memory_gib"])
                     else "—",
                     "yes" if row["fits"] else f"no: {row['reason']}"])
    header = ["#", *knobs, "MFU (%)", "step time (s)", "peak memory (GiB)", "fits"]
    return markdown_table(rows, header)


NOTE_TITLES = {
    "message": "Nothing fits", "dry_run_note": "Dry run", "headroom_note": "Memory headroom",
    "close_call_note": "A close call", "fabric_note": "The fabric",
    "constants_note": "Constants not fitted to this GPU",
    "mfu_convention_note": "MFU at long context", "failed_launches_note": "Failed launches",
    "rejected_commands_note": "Commands Megatron-LM would reject",
    "batch_note": "The global batch", "coverage_note": "What the measurements cover",
}
"""`ranked.attrs` texts the job section shows, in this order, each under its title."""


def _job_section(ranked: pd.DataFrame, job: Job) -> list[str]:
    m = job.model
    facts = [
        ["model", f"{m.name}: {m.num_parameters() / 1e9:.1f} B parameters, {m.num_layers} "
                  f"layers, hidden {grouped(m.hidden_size)}, {m.num_attention_heads} heads, "
                  f"vocabulary {grouped(m.vocab_size)}"],
        ["GPUs", f"{job.num_gpus} × {job.cluster.gpu.name} ({job.cluster.gpus_per_node} per "
                 f"node, {job.cluster.gpu.memory_gib:g} GiB each)"],
        ["sequence length", f"{grouped(job.seq_length)} tokens"],
        ["global batch", f"{grouped(job.global_batch_size)} sequences = "
                         f"{grouped(job.tokens_per_step)} tokens"],
        ["candidates", counts_line(ranked)],
    ]
    lines = ["## The job", "", markdown_table(facts, ["", ""]), ""]
    noted_for = ranked.attrs.get(NOTED_FOR)
    if noted_for is not None and tuple(noted_for) != notes_key(ranked):
        rows, best = noted_for
        return [*lines, f"The search's notes are left out: they are about its whole ranking "
                        f"of {rows} layouts, best {best}, and this table is a selection or "
                        f"re-sorting of it ({len(ranked)} rows, first "
                        f"{notes_key(ranked)[1]}).", ""]
    for attr, title in NOTE_TITLES.items():
        text = ranked.attrs.get(attr, "")
        if text:
            lines += [f"**{title}.** {_sentence_start(text)}", ""]
    return lines


def _best_section(best: pd.Series, job: Job, paths: dict[str, Path], command: str,
                  environment: Sequence[str] = (), requires: Sequence[str] = ()) -> list[str]:
    # A replayed run may have no memory figure (the file's column is optional).
    memory = (f"{best['peak_memory_gib']:.1f} GiB peak memory per GPU"
              if pd.notna(best["peak_memory_gib"]) else "peak memory per GPU not measured")
    lines = [
        "## The best layout", "",
        f"**{label(best)}**: {100 * best['mfu']:.1f} % MFU, {best['step_time_s']:.2f} s per "
        f"step, {grouped(best['tokens_per_s'])} tokens/s for the whole job "
        f"({job.num_gpus} GPUs), {memory}.", "",
    ]
    if command:
        lines += ["Megatron-LM arguments (`pretrain_gpt.py`):", "", "```", command, "```", ""]
    if command and environment:
        # Megatron-LM's validate_args refuses tp or cp > 1 without the first (pre-Blackwell);
        # emit=megatron's scripts export them all.
        lines += ["Environment the run needs (emit=megatron's scripts set it):", "", "```",
                  " ".join(environment), "```", ""]
    if command:
        lines += [f"The run needs {need}." for need in requires]
        lines += [""] if requires else []
    parts = sorted(((float(best[c]), c) for c in time_columns(pd.DataFrame([best]))),
                   reverse=True)
    shares = [f"{component_name(c)} {100 * v / best['step_time_s']:.1f} %"
              for v, c in parts if v > 0]
    if shares:
        lines += ["Share of the step: " + ", ".join(shares) + ".", ""]
    if BREAKDOWN in paths:
        lines += [f"![time and memory breakdown]({paths[BREAKDOWN].name})", ""]
    return lines


def _rules_section(check: StudyCheck | None) -> list[str]:
    lines = ["## The study's rules (Hagemann et al. 2023)", ""]
    if check is None:
        return [*lines, "Nothing fits, so there is no best layout to check.", ""]
    lines += [check.summary[0].upper() + check.summary[1:] + ".", ""]
    verdict = {True: "follows", False: "departs", None: "n/a"}
    rows = [[v.rule, verdict[v.follows], v.detail] for v in check.verdicts]
    return [*lines, markdown_table(rows, ["rule", "best layout", "why"]), ""]


REPORT_FILE = "report.md"


def write_report(ranked: pd.DataFrame, out_dir: Path, *, top_k: int = TOP_K) -> Path:
    """Write `report.md` and its PNGs into `out_dir`; returns the report's path.

    The rows are ranked first (feasible first, best MFU first), so that a re-sorted frame
    or a selection of one is reported best first: its first row is not the best otherwise.
    """
    require_ranking(ranked, "report(result)")
    if ranked.empty:
        raise LayoutSearchError("report(result): the result has no rows")
    job = job_of(ranked, "report(result)")
    ranked = rank(ranked)
    # Without a time breakdown every comparison below would end by saying so: it is said
    # once, above them.
    has_breakdown = bool(time_columns(ranked))
    check = check_study_rules(ranked, job, say_no_breakdown=False)
    best = ranked.iloc[0]
    bars: list[tuple[str, pd.Series]] = [("best", best)]
    marks: list[tuple[str, pd.Series]] = [("best", best)]
    if check is not None and check.paper is not None and check.paper.name != best.name:
        bars.append(("study rules", check.paper))
        marks.append(("study rules", check.paper))
    if check is not None:
        runner = ranked[ranked["fits"].astype(bool)
                        & ((ranked["tp"] != best["tp"]) | (ranked["pp"] != best["pp"]))]
        if not runner.empty:
            bars.append(("best other tp·pp", runner.iloc[0]))
    paths = save_figures(ranked, out_dir, gpu_memory_gib=job.cluster.gpu.memory_gib,
                         bars=bars if has_breakdown and check is not None else (),
                         marks=marks if check is not None else ())
    lines = [f"# Layouts for {job.model.name} on {job.num_gpus} × {job.cluster.gpu.name}, "
             f"{grouped(job.seq_length)} tokens", "", *_job_section(ranked, job),
             f"## Top {min(top_k, len(ranked))} layouts", "", top_table(ranked, top_k), ""]
    if check is not None:
        # The command the ranking carries (search() built it with the run's Megatron-LM
        # settings); a frame without one gets it built with those settings, if known.
        command = best.get("megatron_args")
        if not isinstance(command, str) or not command:
            command = with_megatron_args(ranked.head(1), job, ranked.attrs.get(
                MEGATRON_SETTINGS))["megatron_args"].iloc[0]
        head = ranked.head(1).assign(megatron_args=command)
        first = best.name == ranked.index[0]
        environment = best_command_environment(head) if first else []
        requires = best_command_requirements(head) if first else []
        lines += _best_section(best, job, paths, str(command), environment, requires)
    lines += ["## Every candidate", "",
              f"![MFU against peak memory]({paths[MFU_VS_MEMORY].name})", "",
              f"![best MFU per tp and pp]({paths[TP_PP_HEATMAP].name})", ""]
    if check is not None:
        alternatives = why_rejected(ranked, say_no_breakdown=False)
        lines += ["## Why the main alternatives lost", ""]
        if alternatives and not has_breakdown:
            lines += [f"{_sentence_start(NO_BREAKDOWN)}: the comparisons below and the study's "
                      f"rules give MFU gaps alone.", ""]
        lines += [f"- {line}" for line in alternatives or [
            "every axis of the search space has one value: there is no alternative to compare"]]
        lines += [""]
    lines += _rules_section(check)
    path = out_dir / REPORT_FILE
    path.write_text("\n".join(lines))
    return path


def _sentence_start(text: str) -> str:
    """`text` with a capital first letter, unless it opens with code such as a setting
    (`cost_models=analytic`), which is spelt as typed."""
    first = text.split(" ", 1)[0]
    return text if any(c in first for c in "=_.`") else text[0].upper() + text[1:]
