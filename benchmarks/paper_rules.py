"""Does `driver=paper` (the study's rules, no search) match the grid search's best layout?

For the five jobs of the shared measurements (Hagemann et al. 2023: vocabulary 128000,
global batch 2^22 tokens) it prints, per cost model, the grid's best layout and MFU, the
rules' pick and MFU, and the gap in MFU points (target: ≤ 1). Under `replay` MFUs are the
measured ones, so the row compares the measured MFU of the rules' pick with the best
measured run; a rule step that meets an unmeasured layout is reported as such.

    python benchmarks/paper_rules.py [--runs RUNS.csv]
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from measured_runs import RUNS_HELP, default_runs, read_runs

import layoutsearch
from layoutsearch.reporting.explain import compare, label

JOBS = (  # model, seq_length, num_gpus, global batch (2^22 tokens)
    ("llama_13b", 2048, 64, 2048),
    ("llama_13b", 8192, 128, 512),
    ("llama_30b", 2048, 256, 2048),
    ("llama_30b", 8192, 128, 512),
    ("llama_65b", 2048, 128, 2048),
)
MATCH_POINTS = 1.0


def compare_job(model: str, seq: int, gpus: int, batch: int, cost_model: object,
                **pins: object) -> str:
    job = dict(model=model, seq_length=seq, num_gpus=gpus, global_batch_size=batch,
               vocab_size=128000, search_space="paper", cost_model=cost_model, **pins)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grid = layoutsearch.search(**job)
        paper = layoutsearch.search(driver="paper", **job)
    name = f"{model} {seq // 1024}k {gpus} GPUs"
    if not grid["fits"].any():
        return f"{name:24s} nothing fits"
    best, pick = grid.iloc[0], paper.iloc[0]
    if not pick["fits"]:
        return f"{name:24s} grid {label(best)} {100 * best['mfu']:.1f} % | rules: no pick " \
               f"({pick['paper_rule']})"
    gap = 100 * (best["mfu"] - pick["mfu"])
    verdict = "match" if gap <= MATCH_POINTS else "MISS"
    line = (f"{name:24s} grid {label(best):50s} {100 * best['mfu']:5.1f} % | rules "
            f"{label(pick):50s} {100 * pick['mfu']:5.1f} % | gap {gap:4.1f} {verdict}")
    if gap > MATCH_POINTS:
        line += "\n" + " " * 26 + "why: " + compare(best, pick)
    unmeasured = paper["reason"].fillna("").str.startswith("unmeasured").sum()
    if unmeasured:
        line += (f"\n{'':26s}note: the rules passed over {unmeasured} unmeasured "
                 f"layout{'' if unmeasured == 1 else 's'}")
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=Path, default=default_runs(), help=RUNS_HELP)
    args = parser.parse_args()
    # The shared runs never used sequence parallelism, so under replay the space is pinned
    # to what was measured (the SP rule cannot be checked against them).
    models: list[tuple[str, object, dict[str, object]]] = [("analytic", "analytic", {})]
    if args.runs.is_file():
        measured = sorted(set(read_runs(parser, args.runs)["sequence_parallel"]))
        models.append(("replay (measured), sequence_parallel pinned to the measured "
                       f"{measured}", {"_target_": "layoutsearch.costs.replay.ReplayCostModel",
                                       "path": str(args.runs)},
                       {"sequence_parallel": measured}))
    else:
        print(f"{args.runs} not found: the replay comparison is skipped")
    for title, cost_model, pins in models:
        print(f"\n== {title}: the study's rules vs the grid's best (MFU, gap in points) ==")
        for model, seq, gpus, batch in JOBS:
            print(compare_job(model, seq, gpus, batch, cost_model, **pins))


if __name__ == "__main__":
    main()
