"""The notes a search writes into a ranking's `attrs` about its best layout: tight memory, a
close call, a batch that caps data parallelism, the MFU convention at long context, a slow
fabric, constants not fitted to the GPU kind, failed launches and commands Megatron-LM
would reject; each "" when there is nothing to say.

    note = headroom_note(ranked)          # "" unless the best layout fits with too little free
    note = close_call_note(ranked)        # "" unless runners-up are too close to call
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.costs.base import MEASURED_FAILURE
from layoutsearch.costs.links import stays_in_node
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import FLASH_ATTENTION, Layout
from layoutsearch.results import COMMAND_REJECTED, rule_summary
from layoutsearch.specs import Job

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
    layout = Layout.from_row(safer).describe()
    gap = 100 * (best["mfu"] - safer["mfu"])
    among = " this driver priced" if sample else ""
    return (f"{note} The best{among} with that much free for its kernel: {layout}, MFU "
            f"{safer['mfu']:.3f} ({gap:.1f} points lower, {safer['headroom_gib']:.1f} GiB "
            "free).")


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
    layout = Layout.from_row(best).describe()
    gap = 100 * (float(best["mfu"]) - float(ranked["mfu"].iloc[0]))
    count = "1 layout" if len(rejected) == 1 else f"{len(rejected)} layouts"
    why = rule_summary(rejected["reason"].str.removeprefix(COMMAND_REJECTED), of=len(ranked))
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
    named = [f"row {i} {Layout.from_row(row).describe()} "
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
                    settings: str = "", options: str = "") -> str:
    """A note when other fitting layouts are within CLOSE_CALL_GAP of the best's predicted
    MFU, naming the next one and the measured search that settles the order; "" otherwise.

    Meant for a grid ranking by the analytic model, whose error decides what "close" means.
    Only rows `launchable` says a measured search would launch (one whose Megatron-LM
    command runs the layout as asked) are counted, named and suggested for measuring;
    `prescreen()` names the cost model the suggested measured search ranks with (asked only
    when there is a note: finding the name may read files); `settings` names the
    Megatron-LM settings it launches with ("" for the shipped ones); `options` are more
    options it needs (e.g. the flash3 kernel on Hopper: flash3_attention_option).
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
    return (f"{count} within {100 * CLOSE_CALL_GAP:.0f} % of the best's predicted MFU (the "
            f"next: {Layout.from_row(runner_up).describe()}, MFU {float(runner_up['mfu']):.3f}"
            f"); on the study's runs {100 * CLOSE_CALL_WRONG_ORDER:.0f} % of the layout pairs "
            f"the shipped analytic model predicted this close ran in the other order. Measure "
            f"the top {trials}{capped} before committing: "
            f"{measured_search(best, trials, prescreen(), settings, options)}.")


def measured_search(best: pd.Series, trials: int, prescreen: str,
                    settings: str = "", options: str = "") -> str:
    """The options of a measured search that launches the `trials` best layouts by the
    `prescreen` constants, for the job of the row `best`; `settings` names its Megatron-LM
    settings ("" for the shipped ones), `options` are more options it needs."""
    # The local launcher runs one node; a job on more needs Slurm.
    nodes = int(best["num_gpus"]) > int(best["gpus_per_node"])
    return (f"cost_models=measured cost_models.prescreen={prescreen} "
            f"cost_models.top_k={trials}" + (" cost_models.launcher=slurm" if nodes else "")
            + (f" cost_models.megatron={settings}" if settings else "")
            + (f" {options}" if options else ""))


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
    layout = Layout.from_row(best).describe()
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


STUDY_GPU = "a100_80gb"
"""The GPU kind of the study's runs, from which the other notes' error figures come."""


def constants_note(ranked: pd.DataFrame, gpu: str, fitted: frozenset[str] | None,
                   constants: Callable[[], str], options: str = "") -> str:
    """A note when the analytic constants that priced `ranked` were not fitted to measured
    runs of its GPU kind (`fitted`: the kinds that were, the config's `provenance.gpus`),
    so its MFU, step times and peak memory are a-priori estimates; "" when they were, or
    when the config does not say.

    `constants()` names the constants as a `cost_models` option (`analytic`); asked only
    when there is a note (finding the name reads files). `options` are more options the
    measured search it suggests needs (as in close_call_note).
    """
    if ranked.empty or fitted is None or gpu in fitted:
        return ""
    name = constants()
    search = measured_search(ranked.iloc[0], CLOSE_CALL_MAX_TRIALS, name, options=options)
    # An a-priori file (analytic_prior) borrows from no fit: it says so, and no more.
    basis, sources = ((f"fitted: {', '.join(sorted(fitted))}",
                       "published kernel and NCCL figures and fits of other GPU kinds")
                      if fitted else
                      ("fitted to no GPU kind's runs", "published kernel and NCCL figures"))
    return (f"cost_models={name} was not fitted to measured runs of {gpu} ({basis}): its "
            f"{gpu} constants come from datasheets, {sources} (its file says which), so "
            f"the MFU, step times and peak memory here are a-priori estimates, and the error "
            f"figures of the other notes, measured on the study's {STUDY_GPU} runs, "
            f"understate their error. Before "
            f"committing, measure the best layouts ({search}) or fit the constants to a few "
            f"runs of your cluster (layoutsearch-calibrate).")


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
