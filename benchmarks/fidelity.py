"""How well a cost model ranks measured layouts (docs/fidelity.md): one line per job, a summary.

Per job (model, seq_length, gpu, num_gpus, global_batch_size): rows, fit accuracy and its
two error kinds, Spearman ρ of predicted against measured MFU, top-1 regret in MFU points,
whether the measured best is among the top 3 predicted, and MFU MAPE; then the summary
and the targets of the core-engine issue; then how often two layouts of one job ran in the
order opposite to the predicted one, by their gap in predicted MFU (the source of the
search's close-call note, layoutsearch.notes.CLOSE_CALL_GAP); last, where the model errs:
its mean signed MFU error per value of each knob and per band of predicted memory headroom,
per job and over all jobs; and what switching one knob does to twin layouts, measured
against predicted (FlashAttention 1 -> 2 by pp, the RMSNorm kernel, full recompute -> none
by tp).

    python benchmarks/fidelity.py [--runs RUNS.csv] [--cost-model analytic|PATH.yaml]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from measured_runs import RUNS_HELP, default_runs, read_runs

import layoutsearch
from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.errors import LayoutSearchError
from layoutsearch.fidelity import (
    GAP_EDGES,
    GROUP_COLUMNS,
    fidelity,
    knob_effects,
    order_errors_by_gap,
    run_noise,
    signed_errors,
)
from layoutsearch.notes import CLOSE_CALL_GAP, TIGHT_HEADROOM_GIB

ERROR_KNOBS = ("tp", "pp", "micro_batch_size", "recompute", "attention", "rmsnorm_kernel")
KNOB_SWITCHES = (  # knob, before, after, split by
    ("attention", "flash1", "flash2", "pp"),
    ("rmsnorm_kernel", False, True, None),
    ("recompute", "full", "none", "tp"),
)
HEADROOM_EDGES = (-1e9, 0.0, TIGHT_HEADROOM_GIB, 2 * TIGHT_HEADROOM_GIB, 20.0, 1e9)
"""Bands of predicted free GPU memory (GiB): over the limit, the search's tight-memory band,
twice that, and two roomier ones."""

TARGETS = {  # summary key: (rule, threshold)
    "fit_accuracy": (">=", 0.95),
    "min_spearman": (">=", 0.90),
    "max_regret_points": ("<=", 1.0),
    "mape": ("<=", 0.10),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=Path, default=default_runs(), help=RUNS_HELP)
    parser.add_argument("--cost-model", default="analytic",
                        help="a cost_models/ config name or a YAML path (default: analytic)")
    args = parser.parse_args()
    runs = read_runs(parser, args.runs)
    try:
        predicted = layoutsearch.predict(runs, cost_model=args.cost_model)
    except LayoutSearchError as error:
        print(f"error: {error}")
        return 2
    table, summary = fidelity(predicted)
    shown = table.assign(
        fit_accuracy=table["fit_accuracy"].round(3),
        spearman=table["spearman"].round(3),
        regret_points=table["regret_points"].round(2),
        mape=(100 * table["mape"]).round(1).astype(str) + " %",
    ).rename(columns={"fits_but_oom": "fit→oom", "oom_but_ran": "oom→ran", "top3_hit": "top3"})
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(f"cost model {args.cost_model!r} on {args.runs}\n")
        print(shown.to_string(index=False))
    without_a_run = int(summary["groups_without_a_run"])
    # A job without a finished run has no measured best for its top 3 to hit.
    print(
        f"\nsummary: rows {int(summary['rows'])} | fit accuracy {summary['fit_accuracy']:.3f} "
        f"(fits but OOM {int(summary['fits_but_oom'])}, OOM but ran {int(summary['oom_but_ran'])})"
        f" | min ρ {summary['min_spearman']:.3f} | max regret "
        f"{summary['max_regret_points']:.2f} pts | top-3 hits {int(summary['top3_hits'])}/"
        f"{int(summary['groups']) - without_a_run} | MFU MAPE {100 * summary['mape']:.1f} %"
    )
    if without_a_run:
        print(f"{without_a_run} of the {int(summary['groups'])} jobs had no run that finished "
              "(every layout out of memory): their ρ, regret and MAPE are NaN, left out of "
              "the summary's min ρ, max regret, MAPE and top-3 hits")
    for key, (rule, threshold) in TARGETS.items():
        value = summary[key]
        met = value >= threshold if rule == ">=" else value <= threshold
        print(f"target {key} {rule} {threshold}: {value:.3f} {'met' if met else 'NOT MET'}")
    print_run_noise(predicted, table)
    print("\npairs of measured layouts of one job, by gap in predicted MFU: share that ran in "
          "the other order")
    for edges in (GAP_EDGES, (0.0, CLOSE_CALL_GAP, 1.0)):
        for row in order_errors_by_gap(predicted, edges).itertuples():
            print(f"  gap {100 * row.gap_from:4.0f}-{100 * row.gap_to:3.0f} %: {row.pairs:5d} "
                  f"pairs, {100 * row.wrong_order:4.1f} % in the other order")
    print_signed_errors(predicted)
    print_knob_effects(predicted)
    return 0


def print_run_noise(predicted: pd.DataFrame, table: pd.DataFrame) -> None:
    """Per job: how much one run scatters (an upper bound, from kernel-switch twins), next
    to the job's regret, which one run more or less can change by about that much."""
    noise = run_noise(predicted)
    if noise.empty:
        return
    print("\none run's noise, at most (twins of a kernel switch: flash1 -> flash2, RMSNorm "
          "kernel off -> on; their measured effect's scatter around the predicted one)")
    regrets = table.set_index(list(GROUP_COLUMNS))["regret_points"]
    for row, name in zip(noise.itertuples(index=False), _job_names(noise), strict=True):
        regret = regrets.get(tuple(getattr(row, c) for c in GROUP_COLUMNS), float("nan"))
        print(f"  {name:26s} {100 * row.noise:4.1f} % of MFU = {row.noise_points:4.2f} pts "
              f"({row.twins} twins) | regret {regret:.2f} pts")


def print_signed_errors(predicted: pd.DataFrame) -> None:
    """Per knob value and per band of predicted headroom: the mean signed MFU error per job
    and over all jobs (rows in brackets)."""
    hbm_gib = {name: spec.gpu.memory_gib for name, spec in clusters_by_gpu().items()}
    predicted = predicted.assign(predicted_headroom_gib=(
        predicted["gpu"].map(hbm_gib) - predicted["predicted_peak_memory_gib"]))
    print("\nwhere the model errs: mean of (predicted - measured) / measured MFU over the ok "
          "rows; + means the layouts ran slower than predicted")
    groupings = [(knob, None) for knob in ERROR_KNOBS]
    groupings.append(("predicted_headroom_gib", HEADROOM_EDGES))
    for by, edges in groupings:
        per_job, overall = signed_errors(predicted, by, edges)
        if overall.empty:  # e.g. a cost model that predicts no memory
            print(f"\n{by}: no ok row has a value")
            continue
        cells = per_job.assign(job=_job_names(per_job), cell=_cells(per_job))
        table = cells.pivot(index="value", columns="job", values="cell").fillna("")
        table["all jobs"] = _cells(overall)
        table.index = [_band(v) if edges is not None else str(v) for v in table.index]
        table.index.name = by
        table.columns.name = None
        with pd.option_context("display.width", 250, "display.max_columns", 30):
            print(f"\n{table.to_string()}")


def print_knob_effects(predicted: pd.DataFrame) -> None:
    """Per knob switch: the MFU ratio of twin layouts (the same but for that knob), measured
    vs predicted, per job (pairs in brackets)."""
    print("\nwhat switching one knob does: MFU after / before over twin layouts, measured vs "
          "predicted (geometric means; pairs in brackets)")
    for knob, before, after, by in KNOB_SWITCHES:
        effects = knob_effects(predicted, knob, before, after, by)
        title = f"{knob} {before} -> {after}" + (f", by {by}" if by else "")
        if effects.empty:
            print(f"\n{title}: no twin layouts ran")
            continue
        cells = effects.assign(
            job=_job_names(effects),
            cell=[f"x{m:.3f} vs x{p:.3f} ({n})" for m, p, n in zip(
                effects["measured_speedup"], effects["predicted_speedup"], effects["pairs"],
                strict=True)],
            value=effects[by] if by else "all")
        table = cells.pivot(index="value", columns="job", values="cell").fillna("")
        table.index.name = by or ""
        table.columns.name = None
        with pd.option_context("display.width", 250, "display.max_columns", 30):
            print(f"\n{title}\n{table.to_string()}")


def _job_names(per_job: pd.DataFrame) -> pd.Series:
    """'llama_13b 2048 64 2048': each row's job, named by the group columns that tell the
    file's jobs apart."""
    naming = [c for c in GROUP_COLUMNS if per_job[c].nunique() > 1] or ["model"]
    return per_job[naming].astype(str).agg(" ".join, axis=1)


def _cells(errors: pd.DataFrame) -> list[str]:
    """'+6.0% (16)': each row's mean signed error and, in brackets, its number of rows."""
    return [f"{e:+.1%} ({n})" for e, n in zip(errors["mean_error"], errors["rows"], strict=True)]


def _band(interval: pd.Interval) -> str:
    """'<= 0 GiB', '0-5 GiB', '> 20 GiB': a headroom band without the open ends' sentinels."""
    if interval.left <= HEADROOM_EDGES[0]:
        return f"<= {interval.right:g} GiB"
    if interval.right >= HEADROOM_EDGES[-1]:
        return f"> {interval.left:g} GiB"
    return f"{interval.left:g}-{interval.right:g} GiB"


if __name__ == "__main__":
    sys.exit(main())
