"""How many evaluations the optuna driver needs to find a near-best layout (issue 3 targets).

Each job (sweep) of a measurement file is replayed: the search space is spanned by the knob
values the sweep used, and the replay cost model prices the layouts that were measured
(status ok or oom). Every other combination is one the model has no figures for
(`unpriced`), so the driver rejects it without calling the cost model, as it rejects any
rule-breaking layout. An evaluation is a call of the replay cost model: one that would
launch a real run. It counts whether the run finished or went out of memory.

Per job it prints the measured layouts and the evaluations needed to first reach a layout
within 1 MFU point of the sweep's best: random search (expected value, exact: sampling
without replacement), plain TPE and TPE warm-started from the analytic model (medians over
10 seeds), and the driver's own time per trial (cost-model time excluded, in-memory study).

    python benchmarks/search_efficiency.py [--runs RUNS.csv] [--seeds 10] [--driver KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import yaml
from measured_runs import RUNS_HELP, default_runs, read_runs

from layoutsearch.catalog import clusters_by_gpu, load_cluster
from layoutsearch.costs.base import CostModel
from layoutsearch.costs.replay import ReplayCostModel, summarize_runs
from layoutsearch.drivers import build_driver
from layoutsearch.drivers.optuna import OptunaDriver
from layoutsearch.errors import LayoutSearchError
from layoutsearch.measurements import JOB_KEY, MEASUREMENT_KEY
from layoutsearch.problem import SearchProblem
from layoutsearch.space import KNOBS, SearchSpace
from layoutsearch.specs import ClusterSpec, Job, ModelSpec

WITHIN_MFU = 0.01  # "within 1 MFU point" of the best
MODEL_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                "num_query_groups", "vocab_size", "swiglu", "untie_embeddings", "normalization")


class TimedCostModel:
    """Wraps a cost model and adds up the seconds spent in it (to isolate driver overhead)."""

    def __init__(self, inner: CostModel) -> None:
        self.inner = inner
        self.name = inner.name
        self.seconds = 0.0

    def score(self, candidates: pd.DataFrame,
              clusters: Mapping[str, ClusterSpec]) -> pd.DataFrame:
        start = time.perf_counter()
        try:
            return self.inner.score(candidates, clusters)
        finally:
            self.seconds += time.perf_counter() - start

    def unpriced(self, candidates: pd.DataFrame,
                 clusters: Mapping[str, ClusterSpec]) -> pd.Series:
        """The replay's unmeasured layouts; the driver asks once per search (driver time)."""
        return self.inner.unpriced(candidates, clusters)


def job_problem(runs: pd.DataFrame, source: str) -> tuple[SearchProblem, pd.DataFrame]:
    """The sweep as a search problem whose only candidates are its measured layouts."""
    first = runs.iloc[0]
    model = ModelSpec(name=str(first["model"]),
                      **{f: first[f].item() if hasattr(first[f], "item") else first[f]
                         for f in MODEL_FIELDS})
    cluster = load_cluster(str(first["gpu"])).replace(gpus_per_node=int(first["gpus_per_node"]))
    job = Job(model=model, cluster=cluster, num_gpus=int(first["num_gpus"]),
              seq_length=int(first["seq_length"]),
              global_batch_size=int(first["global_batch_size"]))
    finished_or_oom = runs[runs["status"].isin(["ok", "oom"])]
    measured = summarize_runs(finished_or_oom)
    space = SearchSpace.from_dict(
        {k: sorted(set(measured[k].tolist())) for k in KNOBS}, name="measured"
    )
    clusters = {**clusters_by_gpu(), cluster.gpu.name: cluster}
    timed = TimedCostModel(ReplayCostModel(finished_or_oom, source=source))
    problem = SearchProblem.build(job, space, timed, clusters)
    key = list(MEASUREMENT_KEY)
    rejected = len(problem.candidates[problem.candidates["rule_reason"] != ""].loc[:, key]
                   .merge(measured.loc[:, key], on=key))
    if rejected:
        print(f"  note: the rules reject {rejected} measured layouts of {model.name}")
    return problem, measured


def evaluations_to_reach(ranked: pd.DataFrame, target: float) -> int | None:
    order = ranked.sort_values("trial").reset_index(drop=True)
    hits = order.index[order["fits"] & (order["mfu"] >= target)]
    return int(hits[0]) + 1 if len(hits) else None


PER_RUN_SETTINGS = ("n_trials", "target", "seed", "progress", "warm_start")
"""The optuna settings each replayed search is given by the benchmark itself."""


def setting(item: str) -> tuple[str, object]:
    """One `--driver KEY=VALUE`, the value read as YAML (5, true, [mfu, step_time_s])."""
    key, equals, value = item.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{item!r}: must be KEY=VALUE, e.g. n_startup_trials=5")
    return key, yaml.safe_load(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=Path, default=default_runs(), help=RUNS_HELP)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--driver", nargs="*", default=[], metavar="KEY=VALUE", type=setting,
                        help="optuna driver settings to try, e.g. n_startup_trials=5")
    args = parser.parse_args()
    settings = dict(args.driver)
    try:  # refused before any job is replayed, naming the setting and its rule
        build_driver("optuna", **settings)
    except LayoutSearchError as error:
        parser.error(f"--driver: {error}")
    chosen = sorted(set(settings) & set(PER_RUN_SETTINGS))
    if chosen:
        parser.error(f"--driver {chosen[0]}=...: set by the benchmark for each run "
                     f"({', '.join(PER_RUN_SETTINGS)}); try other settings")
    runs = read_runs(parser, args.runs)
    header = (f"{'job':<34} {'measured':>8} {'random':>7} {'TPE':>6} {'warm':>5} "
              f"{'ms/trial':>8} {'ms/eval':>7}")
    print(header)
    print("-" * len(header))
    verdicts = []
    for _, job_runs in runs.groupby(list(JOB_KEY), sort=False):
        problem, measured = job_problem(job_runs, Path(args.runs).name)
        merged = problem.feasible_candidates().loc[:, list(MEASUREMENT_KEY)].merge(
            measured, on=list(MEASUREMENT_KEY))
        best = float(merged["mfu"].max())
        target = best - WITHIN_MFU
        good = int((merged["mfu"] >= target).sum())
        count = len(merged)
        random_expected = (count + 1) / (good + 1)  # first success without replacement
        found: dict[str, list[int]] = {"plain": [], "warm": []}
        trials = 0
        driver_s = 0.0
        evaluations = 0
        timed = problem.cost_model
        assert isinstance(timed, TimedCostModel)
        for variant in found:
            for seed in range(args.seeds):
                driver = OptunaDriver(n_trials=count, target=target, seed=seed, progress=False,
                                      warm_start="analytic" if variant == "warm" else None,
                                      **settings)
                timed.seconds = 0.0
                start = time.perf_counter()
                ranked = driver.run(problem)
                elapsed = time.perf_counter() - start
                needed = evaluations_to_reach(ranked, target)
                found[variant].append(needed if needed is not None else count + 1)
                if variant == "plain":  # warm start adds one analytic pass, not per trial
                    trials += int(ranked.attrs["trials"])
                    evaluations += len(ranked)
                    driver_s += elapsed - timed.seconds
        plain = statistics.median(found["plain"])
        warm = statistics.median(found["warm"])
        name = (f"{problem.job.model.name} {problem.job.num_gpus}gpu "
                f"s{problem.job.seq_length} gbs{problem.job.global_batch_size}")
        print(f"{name:<34} {count:>8} {random_expected:>7.1f} {plain:>6.1f} {warm:>5.1f} "
              f"{1000 * driver_s / trials:>8.1f} {1000 * driver_s / evaluations:>7.1f}")
        verdicts.append((warm <= 5, plain <= 0.25 * count and plain < random_expected,
                         1000 * driver_s / trials < 50))
    print("-" * len(header))
    print(f"overall: warm-start <= 5 evaluations in {sum(v[0] for v in verdicts)}/"
          f"{len(verdicts)} jobs; plain TPE <= 25 % of measured and better than random in "
          f"{sum(v[1] for v in verdicts)}/{len(verdicts)}; driver time < 50 ms/trial in "
          f"{sum(v[2] for v in verdicts)}/{len(verdicts)}")


if __name__ == "__main__":
    main()
