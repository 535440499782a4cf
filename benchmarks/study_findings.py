"""Do the study's findings fall out of the analytic ranking? (Hagemann et al. 2023, §1.)

For each of the five measured jobs (paper space, vocabulary 128000, global batch 2^22
tokens) the top-ranked layout should use micro-batch 1, no recompute, FlashAttention 2 with
the RMSNorm kernel, and a (tp, pp) whose measured MFU with those settings is within 1 point
of the job's best measured run. The measurements have no sequence-parallel runs, so the
check is printed twice: on the full paper space and with sequence_parallel pinned to false.

    python benchmarks/study_findings.py [--runs RUNS.csv]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import pandas as pd
from measured_runs import RUNS_HELP, default_runs, read_runs

import layoutsearch

JOBS = (("llama_13b", 2048, 64), ("llama_13b", 8192, 128), ("llama_30b", 2048, 256),
        ("llama_30b", 8192, 128), ("llama_65b", 2048, 128))
TOKENS_PER_STEP = 2**22


def check(runs: pd.DataFrame, model: str, seq: int, gpus: int, **pins: object) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ranked = layoutsearch.search(model=model, num_gpus=gpus, seq_length=seq,
                                     global_batch_size=TOKENS_PER_STEP // seq, vocab_size=128000,
                                     search_space="paper", **pins)
    top = ranked.iloc[0]
    settings_ok = (top["micro_batch_size"] == 1 and top["recompute"] == "none"
                   and top["attention"] == "flash2" and bool(top["rmsnorm_kernel"]))
    job = runs[(runs["model"] == model) & (runs["seq_length"] == seq) & (runs["status"] == "ok")]
    best = job["mfu"].max()
    same = job[(job["tp"] == top["tp"]) & (job["pp"] == top["pp"])
               & (job["micro_batch_size"] == 1) & (job["recompute"] == "none")
               & (job["attention"] == "flash2") & job["rmsnorm_kernel"]]
    if same.empty:
        measured, verdict = "not measured", "UNCHECKED"
    else:
        gap = 100 * (best - same["mfu"].max())
        measured = f"measured {100 * same['mfu'].max():.1f} % (gap {gap:.2f} pts)"
        verdict = "met" if settings_ok and gap <= 1.0 else "NOT MET"
    layout = layoutsearch.Layout.from_row(top).describe()
    return (f"{model} {seq // 1024}k {gpus:3d} GPUs | top: {layout} | predicted "
            f"{100 * top['mfu']:.1f} % | {measured} | best measured {100 * best:.1f} % | "
            f"settings {'as the study' if settings_ok else 'DIFFER'} | {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=Path, default=default_runs(), help=RUNS_HELP)
    runs = read_runs(parser, parser.parse_args().runs)
    for title, pins in (("paper space", {}),
                        ("paper space, sequence_parallel=false (as measured)",
                         {"sequence_parallel": False})):
        print(f"== {title} ==")
        for model, seq, gpus in JOBS:
            print(check(runs, model, seq, gpus, **pins))
    return 0


if __name__ == "__main__":
    sys.exit(main())
