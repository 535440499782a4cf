"""Why no layout of a ranking fits, and what to change: the message a search warns with when
nothing fits (the rules, the settings' extra flags, failed launches, missing measurements or
memory, with the fixes that would make the smallest layout fit).

    message = no_fit_message(ranked, job)             # None when some layout fits
    message = no_fit_message(ranked, job, fits=fits)  # names only the fixes `fits` finds fit
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.costs.base import MEASURED, MEASURED_FAILURE, UNMEASURED
from layoutsearch.results import COMMAND_REJECTED, rule_summary
from layoutsearch.space import SearchSpace
from layoutsearch.specs import Job

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


MORE_MEMORY = "use more GPUs or GPUs with more memory"
"""The advice of a no-fit message when it cannot say how many GPUs."""


def _gpus_for_model_state(smallest: pd.Series, model_state: float, job: Job,
                          sizes: list[list[int]]) -> str:
    """How many GPUs the smallest layout's weights, gradients and optimizer state (and the
    fixed overhead) need before they fit per GPU, as the advice to use more GPUs: the fewest
    (whole nodes beyond one) that some tp·pp·cp of `sizes` (the space's tp, pp and cp values)
    divides, at the largest such tp·pp, with the distributed optimizer. Its figures are the
    smallest layout's, scaled: weights and gradients divide by tp·pp (dp and cp replicate
    them), the sharded optimizer state by every GPU. A lower bound: the embedding does not
    shrink with pp, and activations come on top."""
    optimizer = float(smallest.get("memory_optimizer_gib", np.nan))
    if math.isnan(optimizer):  # no breakdown to scale
        return MORE_MEMORY
    overhead = float(smallest.get("memory_overhead_gib", 0.0))
    tp_pp = int(smallest["tp"]) * int(smallest["pp"])
    shards = int(smallest["dp"]) * int(smallest["cp"]) if bool(
        smallest["distributed_optimizer"]) else 1
    # GiB of the model state on one GPU at tp·pp = 1 and no optimizer sharding.
    replicated = (model_state - optimizer - overhead) * tp_pp
    optimizer_total = optimizer * tp_pp * shards
    room = job.cluster.gpu.memory_gib - overhead
    tps, pps, cps = sizes
    largest = max(tps) * max(pps)
    if replicated / largest >= room:
        return (f"use GPUs with more memory, or allow larger tp·pp: at tp·pp={largest}, the "
                f"space's largest, the weights and gradients alone take "
                f"{replicated / largest:.1f} GiB per GPU")
    # `last`, whole nodes that tp·pp = largest divides, with the optimizer state shared
    # thinly enough, fits: the search ends there.
    node = job.cluster.gpus_per_node
    step = math.lcm(largest * min(cps), node)
    last = step * math.ceil(max(optimizer_total / (room - replicated / largest),
                                job.num_gpus + 1) / step)
    counts = [n for n in range(job.num_gpus + 1, last + 1) if n < node or n % node == 0]

    def usable(gpus: int) -> int:
        """The largest tp·pp of the space that a layout on `gpus` GPUs can have (0: none)."""
        return max((tp * pp for tp in tps for pp in pps
                    if any(gpus % (tp * pp * cp) == 0 for cp in cps)), default=0)

    gpus = next(n for n in counts
                if usable(n) and replicated / usable(n) + optimizer_total / n <= room)
    return (f"use at least {gpus} GPUs (the weights, gradients and optimizer state alone fit "
            f"from there, at tp·pp={usable(gpus)} with the distributed optimizer; activations "
            f"need more) or GPUs with more memory")


def no_fit_message(ranked: pd.DataFrame, job: Job,
                   passing_tp_pp: Callable[[], list[tuple[int, int]]] | None = None,
                   passing_rules: int = 0,
                   fits: Callable[[pd.DataFrame], pd.Series] | None = None,
                   space: SearchSpace | None = None) -> str | None:
    """One sentence on why no candidate is feasible and what to change; None if one is.

    `passing_tp_pp` (called only when no layout passes the rules) gives the tp·pp pairs
    that would pass with the space's other settings, to suggest them. `passing_rules`
    counts the layouts of `ranked` that pass the rules: when there are some but none has a memory
    figure, the cost model (a replay of measurements) is why, not the rules. `fits` says
    whether each of some layouts passes the rules and fits by the search's cost model: with
    it, a fix is named only when it makes the smallest layout fit; without it (a cost
    model that would launch runs), the fixes that could. `space` gives the tp, pp and cp
    values that more GPUs could use (without it, those `ranked` holds).
    """
    if ranked["fits"].any():
        return None
    rejected = ranked["reason"].str.startswith(COMMAND_REJECTED)
    if rejected.any():
        # They fit in memory; the settings' extra flags are what stops every one of them.
        why = rule_summary(ranked["reason"][rejected].str.removeprefix(COMMAND_REJECTED),
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
                f"{rule_summary(unpriced_reasons, top=4, of=len(ranked))}")
    failed = ranked["reason"].str.startswith(MEASURED_FAILURE)
    if priced.empty and failed.any():
        # What the launches said comes first, however many layouts were not launched.
        launched = int(failed.sum())
        message = (f"no layout fits: the {launched} layout{'s' * (launched != 1)} launched "
                   f"failed: {rule_summary(ranked['reason'][failed])}")
        if failed.all():
            return message
        return (f"{message}; of the {len(ranked)} layouts, {passing_rules} pass the rules "
                f"and the others were not launched: "
                f"{rule_summary(ranked['reason'][~failed], top=3, of=len(ranked))}")
    if priced.empty and passing_rules:
        # A replay that measured some of the layouts passing the rules: what it measured,
        # then why it has no figures for the rest; the rules' rejections are not its findings.
        reasons = ranked["reason"]
        unmeasured = reasons.str.startswith(UNMEASURED)
        measured = passing_rules - int(unmeasured.sum())
        found = reasons[reasons.str.startswith(MEASURED)]
        message = (f"no layout fits: {passing_rules} of {len(ranked)} layouts pass the rules; "
                   f"{measured} measured, none fit: {rule_summary(found, top=3)}")
        if unmeasured.any():
            message += (f"; the other {int(unmeasured.sum())} were not measured: "
                        f"{rule_summary(reasons[unmeasured], top=2)}")
        return message
    if priced.empty:
        message = f"no layout passes the rules: {rule_summary(ranked['reason'])}"
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
    sizes = [list(getattr(space, knob)) if space else sorted(set(ranked[knob].astype(int)))
             for knob in ("tp", "pp", "cp")]
    advice = (MORE_MEMORY if activations_matter
              else _gpus_for_model_state(smallest, model_state, job, sizes))
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
