"""Ranking a scored candidate table, and saying why nothing fits when nothing does.

    ranked = rank(scored)                 # feasible first, best MFU first
    message = no_fit_message(ranked, job) # None when some layout fits
    note = close_call_note(ranked)        # "" unless runners-up are too close to call
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.costs.base import MEASURED, MEASURED_FAILURE, UNMEASURED
from layoutsearch.costs.timing import stays_in_node
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import FLASH_ATTENTION, LAYOUT_COLUMNS, Layout
from layoutsearch.specs import Job

RESULT_COLUMNS = (
    *LAYOUT_COLUMNS, "mfu", "step_time_s", "tokens_per_s", "peak_memory_gib", "headroom_gib",
    "fits", "reason",
)


TIGHT_HEADROOM_GIB = 5.0
"""GPU memory left free below which a predicted fit of a FlashAttention layout is a gamble:
on the study's 736 ok/oom runs, every FlashAttention layout the shipped analytic model
predicted to fit that ran out of memory had less than this free by the prediction (at most
2.1 GiB)."""
TIGHT_HEADROOM_OTHER_KERNELS_GIB = 13.0
"""The same for the fused and torch kernels, whose s×s scores the model prices less exactly:
such a layout of the study's runs ran out of memory with up to 12.6 GiB free by the
prediction (LLaMA 13B at 2k, tp2 pp2 mb8, fused)."""


def safe_headroom_gib(attention: pd.Series) -> pd.Series:
    """GiB a layout with this attention kernel should leave free for its predicted fit to be
    more than a gamble (TIGHT_HEADROOM_GIB, TIGHT_HEADROOM_OTHER_KERNELS_GIB)."""
    flash = attention.isin(FLASH_ATTENTION)
    return pd.Series(np.where(flash, TIGHT_HEADROOM_GIB, TIGHT_HEADROOM_OTHER_KERNELS_GIB),
                     index=attention.index)


def priced_a_sample(ranked: pd.DataFrame) -> bool:
    """Whether `ranked` holds fewer layouts than its search space (a sampling driver, paper
    or optuna, returns the rows it priced): "no layout ..." then speaks for those rows only."""
    return len(ranked) < int(ranked.attrs.get("space_size", len(ranked)))


def headroom_note(ranked: pd.DataFrame) -> str:
    """A warning when the best layout fits with less memory to spare than its kernel's
    layouts ran out of memory with on the study's runs (safe_headroom_gib), naming the best
    layout with more room and what it costs; "" otherwise."""
    if "headroom_gib" not in ranked.columns or ranked.empty or not bool(ranked["fits"].iloc[0]):
        return ""
    safe = safe_headroom_gib(ranked["attention"])
    best = ranked.iloc[0]
    margin = float(safe.iloc[0])
    if not best["headroom_gib"] < margin:
        return ""
    kernels = ("FlashAttention layout" if margin == TIGHT_HEADROOM_GIB
               else "layout with the fused or torch attention kernel")
    note = (f"the best layout leaves {best['headroom_gib']:.1f} GiB of GPU memory free; on "
            f"the study's runs every {kernels} predicted to fit that ran out of memory had "
            f"less than {margin:.0f} GiB free by the prediction, so it may run out of memory.")
    roomy = ranked[ranked["fits"].astype(bool) & (ranked["headroom_gib"] >= safe)]
    sample = priced_a_sample(ranked)
    if roomy.empty:
        if sample:
            return (f"{note} Of the layouts this driver priced ({len(ranked)}), none that "
                    "fits leaves that much for its kernel; driver=grid prices every layout.")
        return f"{note} No layout that fits leaves that much for its kernel."
    safer = roomy.iloc[0]
    layout = Layout.from_row({str(k): v for k, v in safer.items()}).describe()
    gap = 100 * (best["mfu"] - safer["mfu"])
    among = " this driver priced" if sample else ""
    return (f"{note} The best{among} with that much free for its kernel: {layout}, MFU "
            f"{safer['mfu']:.3f} ({gap:.1f} points lower, {safer['headroom_gib']:.1f} GiB "
            "free).")


COMMAND_REJECTED = "Megatron-LM would reject its command with the settings' extra flags: "
"""How `reason` starts for a layout the cost model found to fit whose command Megatron-LM
rejects once megatron.extra_args are added (emit.command_rejections): it cannot be
launched as the settings stand, so it ranks after every layout that can."""


def rejected_commands_note(ranked: pd.DataFrame) -> str:
    """When the settings' extra flags made Megatron-LM reject the commands of layouts the
    cost model found to fit, how many and why, and the best of them; "" when none, or when
    none fits (the no-fit message says it then)."""
    if ranked.empty or not ranked["fits"].any():
        return ""
    rejected = ranked[ranked["reason"].str.startswith(COMMAND_REJECTED)]
    if rejected.empty:
        return ""
    best = rejected.iloc[int(np.nanargmax(rejected["mfu"].to_numpy(dtype=float)))]
    layout = Layout.from_row({str(k): v for k, v in best.items()}).describe()
    gap = 100 * (float(best["mfu"]) - float(ranked["mfu"].iloc[0]))
    count = "1 layout" if len(rejected) == 1 else f"{len(rejected)} layouts"
    why = _rule_summary(rejected["reason"].str.removeprefix(COMMAND_REJECTED), of=len(ranked))
    return (f"{count} the cost model found to fit rank after every layout that fits, as "
            f"Megatron-LM would reject {'its' if len(rejected) == 1 else 'their'} command "
            f"with megatron.extra_args: {why}. The "
            f"best of them, {layout}, has MFU {float(best['mfu']):.3f} ({abs(gap):.1f} points "
            f"{'above' if gap > 0 else 'below'} the best that fits); without those flags it "
            "would rank by its MFU.")


FAILED_LAUNCHES_NAMED = 5
"""Failed launches a note names one by one (the rest are counted)."""


def failed_launches_note(ranked: pd.DataFrame) -> str:
    """When layouts ran, the launched ones that failed, which the ranking puts after every
    layout that fits (a measured search's top prescreen picks may be among them); "" when
    none failed or none fits (the no-fit message leads with them then)."""
    if ranked.empty or not ranked["fits"].any():
        return ""
    failed = ranked[ranked["reason"].str.startswith(MEASURED_FAILURE)]
    if failed.empty:
        return ""
    named = [f"row {i} {Layout.from_row({str(k): v for k, v in row.items()}).describe()} "
             f"({row['measured_status']})"
             for i, row in failed.head(FAILED_LAUNCHES_NAMED).iterrows()]
    more = len(failed) - len(named)
    return (f"{len(failed)} launched layout{'s' * (len(failed) != 1)} failed and rank after "
            f"every layout that ran: {', '.join(named)}{f' and {more} more' if more else ''}; "
            "each row's reason holds its log's line, and cost_models.retry=[<status>] "
            "launches them again.")


CLOSE_CALL_GAP = 0.05
"""Relative gap in predicted MFU within which the analytic model cannot call the order of two
layouts: on the study's runs, the shipped constants' pairs of measured layouts of one job
predicted within 5 % of each other ran in the other order in 32 % of 1,645 pairs, pairs 5-10 %
apart in 15 %, pairs further apart in under 5 % (benchmarks/fidelity.py prints the table;
layoutsearch.fidelity.order_errors_by_gap)."""
CLOSE_CALL_WRONG_ORDER = 0.32
"""That share of close pairs measured the other way round (same source)."""
CLOSE_CALL_MAX_TRIALS = 8
"""The most layouts the note suggests measuring, as in the measured search's documented
`cost_models.top_k=8`: a tie-break of a few short trials, not a sweep."""


def close_call_note(ranked: pd.DataFrame, *,
                    launchable: Callable[[dict[str, Any]], bool] = lambda row: True,
                    prescreen: Callable[[], str] = lambda: "analytic",
                    settings: str = "") -> str:
    """A note when other fitting layouts are within CLOSE_CALL_GAP of the best's predicted
    MFU, naming the next one and the measured search that settles the order; "" otherwise.

    Meant for a grid ranking by the analytic model, whose error decides what "close" means.
    Only rows `launchable` says a measured search would launch (one whose Megatron-LM
    command runs the layout as asked) are counted, named and suggested for measuring;
    `prescreen()` names the cost model the suggested measured search ranks with (asked only
    when there is a note: finding the name may read files); `settings` names the
    Megatron-LM settings it launches with ("" for the shipped ones).
    """
    if ranked.empty or not bool(ranked["fits"].iloc[0]):
        return ""
    fitting = ranked[ranked["fits"].astype(bool) & ranked["mfu"].notna()]
    if fitting.empty:
        return ""
    best = fitting.iloc[0]
    close = fitting[fitting["mfu"] >= float(best["mfu"]) * (1 - CLOSE_CALL_GAP)]
    rows = [{str(k): v for k, v in row.items()} for row in close.to_dict("records")]
    others = [row for row in rows[1:] if launchable(row)]
    if not others:
        return ""
    runner_up = others[0]
    wanted = len(others) + int(launchable(rows[0]))
    trials = min(wanted, CLOSE_CALL_MAX_TRIALS)
    capped = (f" (the best {CLOSE_CALL_MAX_TRIALS} of {wanted}: a tie-break, not a sweep)"
              if wanted > trials else "")
    count = "1 other layout is" if len(others) == 1 else f"{len(others)} other layouts are"
    # The local launcher runs one node; a job on more needs Slurm.
    nodes = int(best["num_gpus"]) > int(best["gpus_per_node"])
    launcher = " cost_models.launcher=slurm" if nodes else ""
    return (f"{count} within {100 * CLOSE_CALL_GAP:.0f} % of the best's predicted MFU (the "
            f"next: {Layout.from_row(runner_up).describe()}, MFU {float(runner_up['mfu']):.3f}"
            f"); on the study's runs {100 * CLOSE_CALL_WRONG_ORDER:.0f} % of the layout pairs "
            f"the shipped analytic model predicted this close ran in the other order. Measure "
            f"the top {trials}{capped} before committing: cost_models=measured "
            f"cost_models.prescreen={prescreen()} cost_models.top_k={trials}{launcher}"
            + (f" cost_models.megatron={settings}" if settings else "") + ".")


MASKED_ATTENTION_SHARE = 0.2
"""Share of the study's counted FLOPs per token that is the masked half of causal attention
from which a ranking says how its MFU reads: about seq_length 20k for Llama 3 8B, 36k for
Llama 3 70B, where the study's count is 1.3 times Megatron-LM's (at 8k: 1.19 and 1.09 times)."""


def cap_raising_batch(job: Job) -> int:
    """The global batch nearest the job's that lifts its data-parallel cap (the larger on a
    tie). dp may be as large as gcd(batch, GPUs), so a multiple of any divisor of the GPU
    count above the cap lifts it: the nearest such batch is often far nearer than a
    multiple of the GPU count (2048, not 16384, for 1536 sequences on 16384 GPUs)."""
    batch, gpus = job.global_batch_size, job.num_gpus
    cap = math.gcd(batch, gpus)
    nearby = {multiple for d in range(cap + 1, gpus + 1) if gpus % d == 0
              for multiple in (batch // d * d, batch // d * d + d) if multiple > 0}
    return min(nearby, key=lambda multiple: (abs(multiple - batch), -multiple))


def batch_note(ranked: pd.DataFrame, job: Job,
               rescore: Callable[[int], pd.DataFrame] | None = None) -> str:
    """A note when the global batch caps data parallelism and the cap is what holds the best
    layout back: dp must divide both the global batch and the GPUs (DOMAIN.md §6), so a
    batch with few factors in common with the GPU count (2047, 1000 on 64 GPUs) can force
    model parallelism the job would not otherwise need; "" otherwise.

    `rescore(batch)` ranks the same search at another global batch: memory, not the batch,
    may be what forces model parallelism, so the note is kept only when the best layout
    that fits at the nearest batch lifting the cap has a larger dp. None (a cost model that
    would launch runs to answer) gives no note.
    """
    if ranked.empty or not bool(ranked["fits"].iloc[0]) or rescore is None:
        return ""
    cap = math.gcd(job.global_batch_size, job.num_gpus)
    if cap == job.num_gpus or int(ranked["dp"].iloc[0]) != cap:
        return ""
    suggested = cap_raising_batch(job)
    try:
        other = rescore(suggested)
    except LayoutSearchError:
        return ""  # no layout of the space splits that batch into micro-batches
    fitting = other[other["fits"].astype(bool)]
    if fitting.empty or int(fitting["dp"].iloc[0]) <= cap:
        return ""
    best = fitting.iloc[0]
    layout = Layout.from_row({str(k): v for k, v in best.items()}).describe()
    return (f"global_batch_size={job.global_batch_size} caps data parallelism at dp={cap}: "
            f"dp must divide the global batch and the {job.num_gpus} GPUs, and {cap} is the "
            f"largest that divides both. The best layout sits at that cap, so the rest of the "
            f"GPUs go to model parallelism. With a global batch of {suggested} dp may reach "
            f"{math.gcd(suggested, job.num_gpus)}, and the best layout would be {layout}, "
            f"MFU {float(best['mfu']):.3f} against {float(ranked['mfu'].iloc[0]):.3f} here.")


def mfu_convention_note(ranked: pd.DataFrame, job: Job) -> str:
    """How the study's MFU reads at long context, with the best layout's MFU by Megatron-LM's
    count; "" when the masked half of attention is a small share of the counted FLOPs.

    The study's formula (6N + 12·L·h·s per token, DOMAIN.md §2) counts the full s×s
    attention, of which a causal model computes half: at long context MFU overstates the
    work done and can pass 1. The FLOPs per token do not depend on the layout, so the
    ranking is the same under either count.
    """
    if ranked.empty or not bool(ranked["fits"].iloc[0]) or pd.isna(ranked["mfu"].iloc[0]):
        return ""
    model, seq = job.model, job.seq_length
    counted = model.paper_flops_per_token(seq)
    share = 6.0 * model.num_layers * model.hidden_size * seq / counted
    best = float(ranked["mfu"].iloc[0])
    if share < MASKED_ATTENTION_SHARE and best <= 1.0:
        return ""
    megatron = best * model.megatron_flops_per_token(seq) / counted
    past_one = f" (the best layout's is {best:.3f})" if best > 1.0 else ""
    return (f"MFU here is the study's, 6N + 12·L·h·s FLOPs per token, which counts the masked "
            f"half of causal attention: at seq_length {seq} that half is {100 * share:.0f} % "
            f"of the FLOPs counted, so MFU overstates the work done and can pass 1{past_one}. "
            f"By Megatron-LM's count (core >= 0.12: per matmul, causal attention halved) the "
            f"best layout's MFU is {megatron:.3f}; the ranking is the same under either.")


SLOW_FABRIC_EFFICIENCY = 0.3
"""`network_efficiency` below which a ranking says its constants price a slow fabric:
nccl-tests reach 80-90 % of the NICs' rate on a healthy InfiniBand fabric
(cost_models/analytic_prior.yaml); the study's cluster, fitted, gave 5 %."""
NETWORK_SHARE = 0.05
"""Share of the best layout's step in inter-node traffic (exposed data-parallel and pipeline
communication) from which the fabric's speed can change the ranking."""


def fabric_note(ranked: pd.DataFrame, network_efficiency: float,
                constants: Callable[[], str]) -> str:
    """A note when the cost model prices inter-node traffic far below the NICs' rate and
    that traffic is a real part of the best layout's step; "" otherwise.

    `constants()` names where `network_efficiency` comes from (a `cost_models=` option);
    asked only when there is a note (finding the name reads files).
    """
    if (network_efficiency >= SLOW_FABRIC_EFFICIENCY or ranked.empty
            or not bool(ranked["fits"].iloc[0])):
        return ""
    best = ranked.iloc[0]
    if int(best["num_gpus"]) <= int(best["gpus_per_node"]):
        return ""  # one node: its traffic stays on NVLink
    # The pipeline paces at its hop across a node boundary; data-parallel groups cross
    # nodes only when their ranks (dp·cp of them, tp apart) do not fit in one.
    crossing = ["time_pp_comm_s"]
    if not stays_in_node(int(best["dp"]) * int(best.get("cp", 1)), int(best["tp"]),
                         int(best["gpus_per_node"]), int(best["num_gpus"])):
        crossing.append("time_dp_comm_s")
    network = sum(float(best.get(c, np.nan)) for c in crossing)
    step = float(best["step_time_s"])
    if not network >= NETWORK_SHARE * step:  # also NaN: no breakdown to judge by
        return ""
    gpu = str(best["gpu"])
    return (f"{constants()} prices inter-node traffic on {gpu} at {100 * network_efficiency:.0f}"
            f" % of the NICs' rate (network_efficiency {network_efficiency:g}: the fabric its "
            f"constants describe; the shipped analytic constants have it from the study's "
            f"cluster), and that traffic is {network:.2f} s of the best layout's {step:.2f} s "
            f"step. On a fabric that reaches nccl-tests' rates (80-90 %) the ranking may "
            f"differ: rank with cost_models=analytic_prior, or fit the constants to a few runs "
            f"of your cluster (layoutsearch-calibrate).")


JOB = "job"
"""`ranked.attrs` entry: the job ranked, as `Job.to_record` writes it (plain JSON values,
so that DataFrame.to_parquet can write them, and a ranking read back carries its job)."""


def job_of(ranked: pd.DataFrame, caller: str = "job_of(ranked)") -> Job:
    """The job a ranking is of, from its `attrs` (a `Job`); an error naming `caller` without
    one."""
    record = ranked.attrs.get(JOB)
    if isinstance(record, Job):  # set by hand
        return record
    if not isinstance(record, Mapping):
        raise LayoutSearchError(
            f"{caller}: the frame's attrs['job'] is missing; pass the frame layoutsearch.search "
            "returned, or one read back from its to_parquet file (pandas drops attrs in some "
            "operations, e.g. concat, and CSV files do not keep them)")
    return Job.from_record(record)


NOTED_FOR = "noted_for"
"""`ranked.attrs` entry: `notes_key` of the ranking the search wrote its notes about."""


def notes_key(ranked: pd.DataFrame) -> tuple[int, str]:
    """What a ranking's notes are about: its row count and its best layout. A selection or
    re-sorting of the frame keeps the notes in `attrs` (pandas copies them), but no longer
    this key, so a report can tell notes about another table from its own."""
    if ranked.empty:
        return (0, "")
    return (len(ranked), Layout.from_row({str(k): v for k, v in ranked.iloc[0].items()}).describe())


def counts_line(ranked: pd.DataFrame) -> str:
    """'2240 layouts, 1712 priced, 1350 fit'; with the rows a sampling driver returned
    ('2240 layouts, 50 tried, 50 priced, 42 fit') when it did not try the whole space; and
    of a selection of the search's rows, those shown ('400 shown of a search of 2240
    layouts, 380 priced, 300 fit')."""
    size = int(ranked.attrs.get("space_size", len(ranked)))
    priced = f"{int(ranked['mfu'].notna().sum())} priced, {int(ranked['fits'].sum())} fit"
    returned = int(ranked.attrs.get(NOTED_FOR, (len(ranked), ""))[0])
    if len(ranked) < returned:
        # pandas copies attrs into a selection: the space size is the search's, not its own.
        return f"{len(ranked)} shown of a search of {size} layouts, {priced}"
    tried = "" if len(ranked) == size else f", {len(ranked)} tried"
    return f"{size} layouts{tried}, {priced}"


WAITING_TIME = ("time_tp_comm_s", "time_cp_comm_s", "time_pp_comm_s", "time_dp_comm_s",
                "time_bubble_s")
"""Step-time components spent waiting on other GPUs (exposed communication, the pipeline
bubble); the others are this GPU's own work (compute, recompute, overheads)."""


def _own_work_s(scored: pd.DataFrame) -> np.ndarray:
    """Seconds of a step a GPU spends on its own work; 0 without a breakdown."""
    columns = [c for c in scored.columns
               if c.startswith("time_") and c.endswith("_s") and c not in WAITING_TIME]
    if not columns:
        return np.zeros(len(scored))
    return np.nan_to_num(scored[columns].to_numpy(dtype=float)).sum(axis=1)


def rank(scored: pd.DataFrame) -> pd.DataFrame:
    """Feasible rows first by MFU; then the rest, the nearest to fitting in memory first
    (the smallest overshoot; rows with memory to spare, out for another reason such as a
    command Megatron-LM would reject, count as no overshoot), then by MFU (unpriced rows
    last); a fresh 0..n-1 index.

    Rows of equal MFU go in order of their own work, least first: where communication
    hides a kernel's time (flash1 and flash2 under context-parallel exchanges) the faster
    kernel comes first, and it is the one that gains if the overlap falls short.
    """
    feasible = scored["fits"].to_numpy(dtype=bool)
    headroom = pd.to_numeric(scored.get("headroom_gib", pd.Series(np.nan, index=scored.index)),
                             errors="coerce").to_numpy(dtype=float)
    nearest = np.where(feasible, 0.0, np.minimum(np.nan_to_num(headroom, nan=-np.inf), 0.0))
    mfu = np.nan_to_num(scored["mfu"].to_numpy(dtype=float), nan=-1.0)
    # np.lexsort is stable and sorts by its last key first.
    order = scored.iloc[np.lexsort((_own_work_s(scored), -mfu, -nearest, ~feasible))]
    first = [c for c in RESULT_COLUMNS if c in order.columns]
    rest = [c for c in order.columns if c not in first]
    ranked = order[first + rest].reset_index(drop=True)
    for column in ranked.columns:  # categorical while scoring, plain text for the user
        if isinstance(ranked[column].dtype, pd.CategoricalDtype):
            ranked[column] = ranked[column].astype(str)
    return ranked


def _rule_summary(reasons: pd.Series, top: int = 3, of: int | None = None) -> str:
    """The rules that reject most layouts, each with one example and its row count.

    A row may break several rules ("a; b"); rules are told apart by their text without
    the parenthesized values, so 'global_batch_size (3) must divide by ... (1·8)' and
    '... (2·8)' count as one rule. Counts are out of `of` layouts (default: the reasons
    given), so that a summary of some of a ranking's rows counts them out of all of it.
    """
    clauses = reasons[reasons != ""].str.split("; ").explode()
    broken = pd.DataFrame({
        "row": clauses.index,
        "rule": clauses.str.replace(r" \([^()]*\)", "", regex=True).to_numpy(),
        "example": clauses.to_numpy(),
    }).drop_duplicates(["row", "rule"])
    counts = broken.groupby("rule", sort=False).agg(
        layouts=("row", "size"), example=("example", "first")
    ).sort_values("layouts", ascending=False, kind="stable").head(top)
    return "; ".join(
        f"{example} (rejects {layouts} of {len(reasons) if of is None else of} layouts)"
        for example, layouts in zip(counts["example"], counts["layouts"], strict=True)
    )


LONG_SEQUENCE = 8192
"""Tokens from which a no-fit message suggests context parallelism (its activations)."""
ACTIVATION_SHARE = 0.5
"""Share of the smallest footprint in activations from which a no-fit message suggests
activation fixes even when the model state alone is over the limit (they are part of the
way there)."""
SUGGESTED_PAIRS = 12
"""tp×pp pairs named at most when no layout passes the rules."""


DISTRIBUTED_OPTIMIZER = "enable distributed_optimizer"
FULL_RECOMPUTE = "allow recompute=full"
MICRO_BATCH_1 = "allow micro_batch_size=1"
FLASH = "allow FlashAttention (attention=flash2)"
"""Fixes a no-fit message names, in the words of both of its ways to choose them."""


def _shards_optimizer(smallest: pd.Series) -> bool:
    """Whether the distributed optimizer would shard anything: with dp·cp = 1 there is no
    replica to shard the optimizer state over."""
    return int(smallest["dp"]) * int(smallest["cp"]) > 1


def _single_changes(smallest: pd.Series) -> list[tuple[str, str, dict[str, Any]]]:
    """Each fix a no-fit message may name, as one knob of the smallest layout changed: its
    kind, how to say it, and the change. A larger tp, pp or cp takes its GPUs from dp, as
    the GPU count is fixed."""
    toggles: list[tuple[bool, str, dict[str, Any]]] = [
        (not bool(smallest["distributed_optimizer"]) and _shards_optimizer(smallest),
         DISTRIBUTED_OPTIMIZER, {"distributed_optimizer": True}),
        (str(smallest["recompute"]) != "full", FULL_RECOMPUTE, {"recompute": "full"}),
        (int(smallest["micro_batch_size"]) > 1, MICRO_BATCH_1, {"micro_batch_size": 1}),
        (not str(smallest["attention"]).startswith("flash"), FLASH, {"attention": "flash2"}),
        (int(smallest["tp"]) > 1 and not bool(smallest["sequence_parallel"]),
         "enable sequence_parallel", {"sequence_parallel": True}),
    ]
    changes = [(text, text, change) for wanted, text, change in toggles if wanted]
    dp = int(smallest["dp"])
    for knob in ("tp", "pp", "cp"):
        for k in (k for k in range(2, dp + 1) if dp % k == 0):
            value = int(smallest[knob]) * k
            changes.append((f"larger {knob}", f"set {knob}={value} (dp={dp // k})",
                            {knob: value, "dp": dp // k}))
    return changes


def _fixes_that_fit(smallest: pd.Series, fits: Callable[[pd.DataFrame], pd.Series],
                    ) -> tuple[list[str], list[str]]:
    """The single changes of the smallest layout that `fits` (the search's rules and cost
    model) finds to fit, the smallest tp, pp or cp of each; and the kinds of change tried."""
    changes = _single_changes(smallest)
    if not changes:
        return [], []
    variants = pd.DataFrame([{**smallest.to_dict(), **change} for _, _, change in changes])
    fitting = fits(variants).to_numpy(dtype=bool)
    named: dict[str, str] = {}
    for (kind, text, _), ok in zip(changes, fitting, strict=True):
        if ok:
            named.setdefault(kind, text)
    return list(named.values()), list(dict.fromkeys(kind for kind, _, _ in changes))


def _possible_fixes(priced: pd.DataFrame, smallest: pd.Series, job: Job,
                    activations_matter: bool) -> list[str]:
    """The fixes that could make the smallest layout fit, of those the space did not try:
    a judgement without the cost model's figures."""
    fixes = []
    if not priced["distributed_optimizer"].any() and _shards_optimizer(smallest):
        fixes.append(DISTRIBUTED_OPTIMIZER)
    if activations_matter and "full" not in set(priced["recompute"]):
        fixes.append(FULL_RECOMPUTE)
    model_parallel = int(smallest["tp"]) * int(smallest["pp"]) * int(smallest["cp"])
    can_grow = model_parallel < job.num_gpus  # tp, pp or cp take their GPUs from dp
    if can_grow and int((priced["tp"] * priced["pp"] * priced["cp"]).max()) < job.num_gpus:
        fixes.append("allow larger tp·pp")
    if activations_matter:
        # Activation memory: smaller micro-batches, no s×s scores, split sequences.
        if int(priced["micro_batch_size"].min()) > 1:
            fixes.append(MICRO_BATCH_1)
        if not priced["attention"].astype(str).str.startswith("flash").any():
            fixes.append(FLASH)
        if not priced["sequence_parallel"].astype(bool).any():
            fixes.append("enable sequence_parallel (with tp > 1)")
        if can_grow and int(priced["cp"].max()) == 1 and job.seq_length >= LONG_SEQUENCE:
            fixes.append("allow context parallelism (cp > 1)")
    return fixes


def no_fit_message(ranked: pd.DataFrame, job: Job,
                   passing_tp_pp: Callable[[], list[tuple[int, int]]] | None = None,
                   passing_rules: int = 0,
                   fits: Callable[[pd.DataFrame], pd.Series] | None = None) -> str | None:
    """One sentence on why no candidate is feasible and what to change; None if one is.

    `passing_tp_pp` (called only when no layout passes the rules) gives the tp·pp pairs
    that would pass with the space's other settings, to suggest them. `passing_rules`
    counts the layouts of `ranked` that pass the rules: when there are some but none has a memory
    figure, the cost model (a replay of measurements) is why, not the rules. `fits` says
    whether each of some layouts passes the rules and fits by the search's cost model: with
    it, a fix is named only when it makes the smallest layout fit; without it (a cost
    model that would launch runs), the fixes that could.
    """
    if ranked["fits"].any():
        return None
    rejected = ranked["reason"].str.startswith(COMMAND_REJECTED)
    if rejected.any():
        # They fit in memory; the settings' extra flags are what stops every one of them.
        why = _rule_summary(ranked["reason"][rejected].str.removeprefix(COMMAND_REJECTED),
                            of=len(ranked))
        return (f"no layout can be launched: the {int(rejected.sum())} layouts the cost "
                f"model found to fit all have commands Megatron-LM would reject with the "
                f"settings' extra flags: {why}; change megatron.extra_args, or the search "
                f"space")
    priced = ranked[ranked["peak_memory_gib"].notna()]
    limit = job.cluster.gpu.memory_gib
    unpriced = int(ranked["reason"].str.startswith(UNMEASURED).sum())
    if priced.empty and passing_rules and unpriced >= passing_rules:
        # A replay of measurements that never ran this job: nothing is known to not fit.
        # Why those that pass were not priced; the rules' rejections are not news here.
        unpriced_reasons = ranked["reason"][ranked["reason"].str.startswith(UNMEASURED)]
        return (f"no layout was priced: {passing_rules} of {len(ranked)} layouts pass the "
                f"rules, and the cost model has no figures for any of them: "
                f"{_rule_summary(unpriced_reasons, top=4, of=len(ranked))}")
    failed = ranked["reason"].str.startswith(MEASURED_FAILURE)
    if priced.empty and failed.any():
        # What the launches said comes first, however many layouts were not launched.
        launched = int(failed.sum())
        message = (f"no layout fits: the {launched} layout{'s' * (launched != 1)} launched "
                   f"failed: {_rule_summary(ranked['reason'][failed])}")
        if failed.all():
            return message
        return (f"{message}; of the {len(ranked)} layouts, {passing_rules} pass the rules "
                f"and the others were not launched: "
                f"{_rule_summary(ranked['reason'][~failed], top=3, of=len(ranked))}")
    if priced.empty and passing_rules:
        # A replay that measured some of the layouts passing the rules: what it measured,
        # then why it has no figures for the rest; the rules' rejections are not its findings.
        reasons = ranked["reason"]
        unmeasured = reasons.str.startswith(UNMEASURED)
        measured = passing_rules - int(unmeasured.sum())
        found = reasons[reasons.str.startswith(MEASURED)]
        message = (f"no layout fits: {passing_rules} of {len(ranked)} layouts pass the rules; "
                   f"{measured} measured, none fit: {_rule_summary(found, top=3)}")
        if unmeasured.any():
            message += (f"; the other {int(unmeasured.sum())} were not measured: "
                        f"{_rule_summary(reasons[unmeasured], top=2)}")
        return message
    if priced.empty:
        message = f"no layout passes the rules: {_rule_summary(ranked['reason'])}"
        pairs = passing_tp_pp() if passing_tp_pp else []
        if pairs:
            named = ", ".join(f"{tp}×{pp}" for tp, pp in pairs[:SUGGESTED_PAIRS])
            if len(pairs) > SUGGESTED_PAIRS:
                named += f" and {len(pairs) - SUGGESTED_PAIRS} more"
            message += (f"; with the space's other settings these tp×pp pass: {named} "
                        f"(set tp and pp to them)")
        return message
    smallest = priced.iloc[int(priced["peak_memory_gib"].to_numpy().argmin())]
    largest_model_parallel = int((priced["tp"] * priced["pp"] * priced["cp"]).max())
    # What activations take of the smallest footprint: when the rest (weights, gradients,
    # optimizer state) is over the limit alone, no activation fix can help. Unknown (NaN,
    # a cost model without breakdowns) keeps every suggestion.
    activations = sum(float(smallest.get(c, np.nan))
                      for c in ("memory_activations_gib", "memory_logits_gib"))
    model_state = float(smallest["peak_memory_gib"]) - activations
    activations_matter = not model_state >= limit
    advice = "use more GPUs or GPUs with more memory"
    if fits is not None:
        fitting, tried = _fixes_that_fit(smallest, fits)
        if fitting:
            advice = ", or ".join([advice, *fitting])
        elif tried:
            advice = (f"no single change of its layout brings it under the limit "
                      f"({', '.join(tried)}): {advice}")
    else:
        # Activations a large share: their fixes are part of the way, whatever the state.
        large = activations >= ACTIVATION_SHARE * float(smallest["peak_memory_gib"])
        advice = ", or ".join([advice, *_possible_fixes(priced, smallest, job,
                                                        activations_matter or large)])
    state_note = "" if activations_matter else (
        f" (weights, gradients, optimizer state and overhead alone take {model_state:.1f} GiB)")
    return (
        f"no layout fits: the smallest per-GPU footprint is "
        f"{smallest['peak_memory_gib']:.1f} GiB > {limit:.1f} GiB at tp·pp·cp ≤ "
        f"{largest_model_parallel} (tp={smallest['tp']} pp={smallest['pp']} cp={smallest['cp']} "
        f"mb={smallest['micro_batch_size']} recompute={smallest['recompute']}){state_note}; "
        f"{advice}"
    )
