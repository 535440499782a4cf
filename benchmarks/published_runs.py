"""How well do the cost models price training runs measured on other clusters, by other people?

`benchmarks/published_runs.csv` holds 17 Megatron-LM runs on A100 80GB nodes (8 GPUs, eight
200 Gb/s HDR NICs each), in the measurement schema, that no constant was fitted to:

- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv 2205.05198): the 22B, 175B, 530B and 1T GPT models of its Table 3 (tp, pp, GPUs,
  global and micro batch), each with full recompute and with sequence parallelism plus
  selective recompute (Table 5's iteration times), and the 530B on 2,240 GPUs (§6.3).
  Sequence 2,048, vocabulary 51,200, tied embeddings, no data parallelism but the last;
  three interleaved stages for 175B and 530B (§6); the 1T's interleaving is not stated, so
  vp 1 is assumed. Attention is Megatron's fused softmax kernel (2022, no FlashAttention).
- MegaScale (Jiang et al. 2024, arXiv 2402.15627), Table 2's Megatron-LM baseline: a 175B
  GPT (128 heads, vocabulary 64,000) at tp 8, pp 8 with six interleaved stages, batch 768 on
  256-1,024 GPUs and 6,144 on 3,072-12,288. The paper does not state the micro-batch,
  sequence parallelism, recompute, optimizer sharding or GPU memory; the file assumes micro-
  batch 1, sequence parallelism with selective recompute and the distributed optimizer on
  A100 80GB (column `assumed`).

Step times are compared, not MFU: the sources count FLOPs in their own ways (their MFUs
match the study's formula to 0.2 points, which the file's `mfu` column uses). Left out:
Narayanan et al. 2021's Table 1 (micro-batch and interleaving not stated), NeMo's published
H100 runs (FP8; the cost models price bf16) and Llama 3's (Meta's own stack and FSDP).

    python benchmarks/published_runs.py [--runs benchmarks/published_runs.csv]
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import pandas as pd
from measured_runs import read_runs

import layoutsearch

PUBLISHED_RUNS = Path(__file__).with_name("published_runs.csv")
COST_MODELS = ("analytic", "analytic_prior")


def describe(row: pd.Series) -> str:
    """'gpt3_175b  64 GPUs  tp8 pp8 vp3 mb1 sp recompute=selective'."""
    vp = f" vp{int(row['vp'])}" if row["vp"] > 1 else ""
    dp = f" dp{int(row['dp'])}" if row["dp"] > 1 else ""
    sp = " sp" if row["sequence_parallel"] else ""
    return (f"{row['model']:15s} {int(row['num_gpus']):6d} GPUs  tp{int(row['tp'])} "
            f"pp{int(row['pp'])}{vp}{dp} mb{int(row['micro_batch_size'])}{sp} "
            f"recompute={row['recompute']}")


def priced(runs: pd.DataFrame, cost_model: str) -> pd.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = layoutsearch.predict(runs, cost_model=cost_model)
    out["error"] = out["predicted_step_time_s"] / out["step_time_s"] - 1
    return out


def ratio(frame: pd.DataFrame, column: str, a: pd.Series, b: pd.Series) -> float:
    """`column` of the row `a` selects over that of the row `b` selects."""
    return float(frame.loc[a, column].iloc[0] / frame.loc[b, column].iloc[0])


def knob_effects(out: pd.DataFrame) -> list[str]:
    """What the sources changed, measured vs predicted: recompute and SP (Korthikanti),
    strong scaling (MegaScale's batch 768 from 256 to 1,024 GPUs and 6,144 from 3,072 to
    12,288 GPUs)."""
    lines = []
    for model in ("gpt_22b", "gpt3_175b", "mtnlg_530b", "gpt_1t"):
        of_model = out["model"] == model
        base = of_model & (out["num_gpus"] == out.loc[of_model, "num_gpus"].min())
        full = base & (out["recompute"] == "full")
        selective = base & (out["recompute"] == "selective")
        if full.any() and selective.any():
            lines.append(f"  {model:15s} full recompute / SP + selective: measured "
                         f"x{ratio(out, 'step_time_s', full, selective):.2f}, predicted "
                         f"x{ratio(out, 'predicted_step_time_s', full, selective):.2f}")
    scaled = out[out["model"] == "gpt3_175b_v64k"]
    for batch in sorted(set(scaled["global_batch_size"])):
        series = scaled[scaled["global_batch_size"] == batch]
        low = series["num_gpus"] == series["num_gpus"].min()
        high = series["num_gpus"] == series["num_gpus"].max()
        gpus = int(series.loc[high, "num_gpus"].iloc[0]) // int(series.loc[low, "num_gpus"].iloc[0])
        lines.append(f"  gpt3_175b_v64k batch {batch}: {gpus}x the GPUs, step time measured "
                     f"/{ratio(series, 'step_time_s', low, high):.2f}, predicted "
                     f"/{ratio(series, 'predicted_step_time_s', low, high):.2f}")
    return lines


def report(runs: pd.DataFrame, cost_model: str) -> str:
    out = priced(runs, cost_model)
    lines = [f"== {cost_model}: published step time vs predicted =="]
    labels = [describe(row) for _, row in out.iterrows()]
    width = max(map(len, labels))
    stated = out["assumed"].fillna("").eq("") if "assumed" in out else pd.Series(True, out.index)
    for label, (_, row), known in zip(labels, out.iterrows(), stated, strict=True):
        fits = ("" if row["predicted_fits"]
                else f"  predicted not to fit ({row['predicted_reason']})")
        lines.append(f"{label:{width}s}  {row['step_time_s']:6.2f} s vs "
                     f"{row['predicted_step_time_s']:6.2f} s  {100 * row['error']:+6.1f} %"
                     f"{'' if known else '  *'}{fits}")
    errors = out["error"].abs()
    lines.append(f"summary {cost_model}: step-time MAPE {100 * errors.mean():.1f} % over "
                 f"{len(out)} runs ({100 * errors[stated].mean():.1f} % over the "
                 f"{int(stated.sum())} fully stated) | mean signed error "
                 f"{100 * out['error'].mean():+.1f} % | "
                 f"predicted to fit {int(out['predicted_fits'].sum())} of {len(out)} (all ran)")
    lines.append("what the sources changed, step time measured vs predicted:")
    lines.extend(knob_effects(out))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=PUBLISHED_RUNS,
                        help="measurement file of published runs (default: %(default)s)")
    args = parser.parse_args()
    runs = read_runs(parser, args.runs)
    runs = runs[runs["status"] == "ok"].reset_index(drop=True)  # the runs with a step time
    print(f"{len(runs)} published runs from {os.path.relpath(args.runs)} (* = settings the "
          "source does not state, assumed as its `assumed` column says)\n")
    for cost_model in COST_MODELS:
        print(report(runs, cost_model), end="\n\n")


if __name__ == "__main__":
    main()
