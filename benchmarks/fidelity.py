"""How well a cost model ranks measured layouts (docs/fidelity.md): one line per job, a summary.

Per job (model, seq_length, gpu, num_gpus, global_batch_size): rows, fit accuracy and its
two error kinds, Spearman ρ of predicted against measured MFU, top-1 regret in MFU points,
whether the measured best is among the top 3 predicted, and MFU MAPE; then the summary
and the targets of the core-engine issue; then how often two layouts of one job ran in the
order opposite to the predicted one, by their gap in predicted MFU (the source of the
search's close-call note, layoutsearch.results.CLOSE_CALL_GAP).

    python benchmarks/fidelity.py [--runs RUNS.csv] [--cost-model analytic|PATH.yaml]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from measured_runs import RUNS_HELP, default_runs

import layoutsearch
from layoutsearch.fidelity import GAP_EDGES, fidelity, order_errors_by_gap
from layoutsearch.results import CLOSE_CALL_GAP

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
    if not args.runs.is_file():
        print(f"no measurement file at {args.runs}; pass one in the measurement schema")
        return 2
    predicted = layoutsearch.predict(args.runs, cost_model=args.cost_model)
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
    print(
        f"\nsummary: rows {int(summary['rows'])} | fit accuracy {summary['fit_accuracy']:.3f} "
        f"(fits but OOM {int(summary['fits_but_oom'])}, OOM but ran {int(summary['oom_but_ran'])})"
        f" | min ρ {summary['min_spearman']:.3f} | max regret "
        f"{summary['max_regret_points']:.2f} pts | top-3 hits {int(summary['top3_hits'])}/"
        f"{int(summary['groups'])} | MFU MAPE {100 * summary['mape']:.1f} %"
    )
    for key, (rule, threshold) in TARGETS.items():
        value = summary[key]
        met = value >= threshold if rule == ">=" else value <= threshold
        print(f"target {key} {rule} {threshold}: {value:.3f} {'met' if met else 'NOT MET'}")
    print("\npairs of measured layouts of one job, by gap in predicted MFU: share that ran in "
          "the other order")
    for edges in (GAP_EDGES, (0.0, CLOSE_CALL_GAP, 1.0)):
        for row in order_errors_by_gap(predicted, edges).itertuples():
            print(f"  gap {100 * row.gap_from:4.0f}-{100 * row.gap_to:3.0f} %: {row.pairs:5d} "
                  f"pairs, {100 * row.wrong_order:4.1f} % in the other order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
