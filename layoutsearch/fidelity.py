"""How well a cost model's ranking matches measurements (docs/fidelity.md), per job and overall.

A group is one sweep: the rows sharing (model, seq_length, gpu, num_gpus,
global_batch_size). Rows that a kernel refused or that crashed are left out; twins of one
effective layout (sequence parallelism at tp = 1 is a no-op) are averaged first.

    table, summary = fidelity(predict(runs))
    order = order_errors_by_gap(predict(runs))   # how often close calls come out the other way
    per_job, overall = signed_errors(predict(runs), "tp")   # where the model errs, by knob
    effects = knob_effects(predict(runs), "attention", "flash1", "flash2", by="pp")
    noise = run_noise(predict(runs))   # how much one run scatters, from kernel-switch twins
    change, low, high = spearman_change_interval(predict(job_runs, a), predict(job_runs, b))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise

import numpy as np
import pandas as pd

from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import LAYOUT_COLUMNS
from layoutsearch.measurements import BOOLEAN_COLUMNS, JOB_KEY, OPTIONAL_DEFAULTS, as_bool

GROUP_COLUMNS = ("model", "seq_length", "gpu", "num_gpus", "global_batch_size")
PREDICTED = ("predicted_mfu", "predicted_fits")


def _effective_layouts(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """`frame` with sequence parallelism at tp=1 (a no-op) folded to false, and the columns
    that tell its effective layouts apart (the group's and the layout's)."""
    # predict() leaves the given columns as written, e.g. "true"/"false" read from a CSV.
    sequence_parallel = as_bool(frame, "sequence_parallel", "fidelity input")
    rows = frame.assign(sequence_parallel=sequence_parallel & (frame["tp"] > 1))
    return rows, [c for c in (*GROUP_COLUMNS, *LAYOUT_COLUMNS) if c in rows.columns]


def _one_job_per_group(rows: pd.DataFrame) -> None:
    """Refuse a group (GROUP_COLUMNS) that holds runs of several jobs: rows named alike
    whose model dimensions, GPUs per node or normalization differ (a family name such as
    "llama" for its 7B and 13B runs). Their layouts would be averaged together as repeats
    and ranked as one sweep; a replay tells them apart by these columns."""
    others = [c for c in JOB_KEY if c not in GROUP_COLUMNS and c in rows.columns]
    if not others or not set(GROUP_COLUMNS) <= set(rows.columns):
        return
    job = rows[[*GROUP_COLUMNS, *others]].copy()
    for column in others:
        if column in BOOLEAN_COLUMNS:
            job[column] = as_bool(rows, column, "fidelity input")
        elif column in OPTIONAL_DEFAULTS:
            job[column] = job[column].fillna(OPTIONAL_DEFAULTS[column])
    counts = job.groupby(list(GROUP_COLUMNS), dropna=False, observed=True)[others].nunique()
    mixed = counts[(counts > 1).any(axis=1)]
    if mixed.empty:
        return
    group = mixed.index[0]
    column = next(c for c in others if mixed.iloc[0][c] > 1)
    named = dict(zip(GROUP_COLUMNS, group, strict=True))
    values = job.loc[(job[list(GROUP_COLUMNS)] == pd.Series(named)).all(axis=1), column]
    raise LayoutSearchError(
        f"fidelity input: the rows of {', '.join(f'{k}={v}' for k, v in named.items())} "
        f"differ in {column} ({', '.join(sorted(map(str, values.unique())))}): runs of "
        f"different jobs, which a job ({', '.join(GROUP_COLUMNS)}) cannot tell apart; "
        "give each its own model name")


def distinct_layouts(frame: pd.DataFrame) -> int:
    """How many effective layouts `frame` holds: repeats and SP-at-tp=1 twins count once."""
    rows, keys = _effective_layouts(frame)
    return len(rows.drop_duplicates(keys))


def collapse_twins(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per effective layout of each group: SP at tp=1 folded, repeats averaged."""
    missing = [c for c in ("status", "mfu", *PREDICTED) if c not in frame.columns]
    if missing:
        raise LayoutSearchError(
            f"fidelity needs measured rows with predictions: missing {', '.join(missing)}; "
            "score the rows of a measurement file with layoutsearch.predict() first")
    _one_job_per_group(frame)
    rows, keys = _effective_layouts(frame)
    rows = rows[rows["status"].isin(["ok", "oom"])]
    # Spelt as the rows were (a CSV of predictions read back as text, say): the string
    # "False" would count as true. Only the rows scored need a call: one that did not run
    # (unavailable, error, timeout) may have no prediction.
    rows["predicted_fits"] = as_bool(rows, "predicted_fits", "fidelity input")
    rows["ran"] = rows["status"] == "ok"
    # Every prediction is averaged over twins, save the go/no-go call and the reason.
    predictions = {c: "mean" for c in rows.columns if c.startswith("predicted_")
                   and c != "predicted_fits" and pd.api.types.is_numeric_dtype(rows[c])}
    aggregations = {"mfu": "mean", "ran": "mean", **predictions, "predicted_fits": "first"}
    collapsed = rows.groupby(keys, dropna=False, observed=True).agg(aggregations).reset_index()
    # A layout measured both ok and oom counts as ok if most of its runs fit.
    collapsed["status"] = np.where(collapsed["ran"] >= 0.5, "ok", "oom")
    collapsed.loc[collapsed["status"] == "oom", "mfu"] = np.nan
    return collapsed.drop(columns="ran")


def _spearman(a: pd.Series, b: pd.Series) -> float:
    if len(a) < 2:
        return float("nan")
    return float(a.rank().corr(b.rank()))


@dataclass(frozen=True, slots=True)
class GroupFidelity:
    rows: int
    fit_accuracy: float
    fits_but_oom: int
    oom_but_ran: int
    spearman: float
    regret_points: float
    top3_hit: bool
    mape: float


def group_fidelity(group: pd.DataFrame) -> GroupFidelity:
    ran = group["status"] == "ok"
    predicted_fits = group["predicted_fits"].astype(bool)
    ok = group[ran]
    best = ok["mfu"].max()
    # A row predicted to fit without a predicted MFU was not ranked: neither the pick nor
    # among the three best-predicted.
    candidates = group[predicted_fits & group["predicted_mfu"].notna()].sort_values(
        "predicted_mfu", ascending=False)
    measured_of_pick = candidates["mfu"].fillna(0.0)  # a pick that went OOM scores 0
    regret = (best - measured_of_pick.iloc[0]) * 100 if len(candidates) else best * 100
    top3 = bool((measured_of_pick.head(3) >= best).any()) if len(candidates) else False
    return GroupFidelity(
        rows=len(group),
        fit_accuracy=float((predicted_fits == ran).mean()),
        fits_but_oom=int((predicted_fits & ~ran).sum()),
        oom_but_ran=int((~predicted_fits & ran).sum()),
        spearman=_spearman(ok["predicted_mfu"], ok["mfu"]),
        regret_points=float(regret),
        top3_hit=top3,
        mape=float(((ok["predicted_mfu"] - ok["mfu"]).abs() / ok["mfu"]).mean()),
    )


def fidelity(predicted: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per-group table and the summary line (overall fit accuracy, min ρ, max regret, ...).

    A group none of whose runs finished (every one out of memory) has no best MFU: its ρ,
    regret and MAPE are NaN, left out of the summary's min, max and mean, and
    `groups_without_a_run` counts such groups, so that a max regret is not read as
    covering them."""
    collapsed = collapse_twins(predicted)
    if collapsed.empty:
        raise LayoutSearchError(
            "fidelity needs measured rows with status ok or oom; the frame has none"
        )
    records = []
    for key, group in collapsed.groupby(list(GROUP_COLUMNS), observed=True):
        result = group_fidelity(group)
        records.append({**dict(zip(GROUP_COLUMNS, key, strict=True)), **asdict(result)})
    table = pd.DataFrame(records)
    ok = collapsed[collapsed["status"] == "ok"]
    ran = collapsed["status"] == "ok"
    summary = {
        "rows": float(len(collapsed)),
        "fit_accuracy": float((collapsed["predicted_fits"].astype(bool) == ran).mean()),
        "fits_but_oom": float(table["fits_but_oom"].sum()),
        "oom_but_ran": float(table["oom_but_ran"].sum()),
        "min_spearman": float(table["spearman"].min()),
        "max_regret_points": float(table["regret_points"].max()),
        "top3_hits": float(table["top3_hit"].sum()),
        "groups": float(len(table)),
        "groups_without_a_run": float(len(table) - ok.groupby(list(GROUP_COLUMNS),
                                                              observed=True).ngroups),
        "mape": float(((ok["predicted_mfu"] - ok["mfu"]).abs() / ok["mfu"]).mean()),
    }
    return table, summary


GAP_EDGES = (0.0, 0.02, 0.05, 0.10, 0.20, 1.0)
"""Bins of the relative gap in predicted MFU between two layouts of one job."""


def order_errors_by_gap(predicted: pd.DataFrame,
                        edges: tuple[float, ...] = GAP_EDGES) -> pd.DataFrame:
    """How often two measured layouts of one job ran in the order opposite to the predicted
    one, by how far apart their predicted MFUs were: the confidence a ranking deserves.

    Every pair of priced `ok` rows of a group (twins collapsed) counts once; its gap is
    |p1 - p2| / max(p1, p2) of the predicted MFUs. Returns one row per bin: `gap_from`,
    `gap_to`, `pairs`, `wrong_order` (the share measured the other way round; a measured
    tie is not wrong).
    """
    ok = collapse_twins(predicted)
    ok = ok[ok["status"] == "ok"]
    gaps, wrong = [], []
    for _, group in ok.groupby(list(GROUP_COLUMNS), observed=True):
        p, m = group["predicted_mfu"].to_numpy(float), group["mfu"].to_numpy(float)
        priced = np.isfinite(p) & np.isfinite(m)  # an unpriced row is in no pair
        p, m = p[priced], m[priced]
        i, j = np.triu_indices(len(p), k=1)
        larger = np.maximum(p[i], p[j])
        gaps.append(np.divide(np.abs(p[i] - p[j]), larger, out=np.zeros(len(i)),
                              where=larger > 0))  # two predictions of 0: no gap
        wrong.append((p[i] - p[j]) * (m[i] - m[j]) < 0)
    gap = np.concatenate(gaps) if gaps else np.array([])
    flipped = np.concatenate(wrong) if wrong else np.array([], dtype=bool)
    records = []
    for low, high in pairwise(edges):
        # Each bin holds its lower edge; the last one its upper edge too.
        inside = (gap >= low) & ((gap < high) | (high == edges[-1]) & (gap <= high))
        pairs = int(inside.sum())
        records.append({"gap_from": low, "gap_to": high, "pairs": pairs,
                        "wrong_order": float(flipped[inside].mean()) if pairs else float("nan")})
    return pd.DataFrame(records)


def signed_errors(predicted: pd.DataFrame, by: str,
                  edges: Sequence[float] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where a cost model errs: the mean signed MFU error, (predicted − measured) / measured,
    of the `ok` rows (twins collapsed) per value of the column `by` (a knob, or a numeric
    prediction such as `predicted_peak_memory_gib` binned by `edges`). Positive: the model
    expected those layouts to run faster than they did. A bias that a knob's values share
    cancels in the ranking; one that differs between them reorders it.

    Returns the figures per group (GROUP_COLUMNS, `value`, `rows`, `mean_error`) and over
    all groups (`value`, `rows`, `mean_error`).
    """
    ok = collapse_twins(predicted)
    if by not in ok.columns:
        raise LayoutSearchError(
            f"signed_errors: no column {by!r} to group by; the rows have "
            f"{', '.join(c for c in ok.columns if c not in GROUP_COLUMNS)}")
    ok = ok[(ok["status"] == "ok") & np.isfinite(ok["predicted_mfu"].astype(float))]
    value = pd.cut(ok[by], list(edges)) if edges is not None else ok[by]
    frame = ok[list(GROUP_COLUMNS)].assign(
        value=value, error=(ok["predicted_mfu"] - ok["mfu"]) / ok["mfu"])
    per_group = frame.groupby([*GROUP_COLUMNS, "value"], observed=True)["error"].agg(
        rows="size", mean_error="mean")
    overall = frame.groupby("value", observed=True)["error"].agg(rows="size", mean_error="mean")
    return per_group.reset_index(), overall.reset_index()


def knob_effects(predicted: pd.DataFrame, knob: str, before: object, after: object,
                 by: str | None = None) -> pd.DataFrame:
    """What switching one knob does, measured and predicted: for every two `ok` layouts of
    one job that differ only in `knob` (`before` → `after`), the MFU ratio after / before.
    A cost model that gets a knob's effect right ranks its twins right wherever they sit.

    Returns one row per group (GROUP_COLUMNS) and value of the column `by` (e.g. "pp"; the
    column is left out without it): `pairs`, and the geometric means `measured_speedup` and
    `predicted_speedup` of the pairs' ratios.
    """
    if by == knob:
        raise LayoutSearchError(
            f"knob_effects: by={by!r} is the knob switched; split by another column")
    split = [by] if by else []
    frame = _twins(predicted, knob, before, after, split, "knob_effects")
    keys = [*GROUP_COLUMNS, *split]
    effects = frame.groupby(keys, observed=True).agg(
        pairs=("measured", "size"), measured_speedup=("measured", "mean"),
        predicted_speedup=("predicted", "mean")).reset_index()
    for column in ("measured_speedup", "predicted_speedup"):
        effects[column] = np.exp(effects[column])
    return effects


def _twins(predicted: pd.DataFrame, knob: str, before: object, after: object,
           keep: Sequence[str], caller: str) -> pd.DataFrame:
    """Every two `ok` layouts of one job that differ only in `knob`: the job's columns,
    `keep`, and the log MFU ratio after / before, `measured` and `predicted`."""
    ok = collapse_twins(predicted)
    missing = [c for c in (knob, *keep) if c not in ok.columns]
    if missing:
        raise LayoutSearchError(
            f"{caller}: no column {missing[0]!r}; the rows have "
            f"{', '.join(c for c in ok.columns if c not in GROUP_COLUMNS)}")
    ok = ok[(ok["status"] == "ok") & np.isfinite(ok["predicted_mfu"].astype(float))]
    # Everything but the knob pairs the two rows: the job and every other layout column.
    pairing = [c for c in (*GROUP_COLUMNS, *LAYOUT_COLUMNS) if c in ok.columns and c != knob]
    values = ["mfu", "predicted_mfu"]
    twins = ok[ok[knob] == before][[*pairing, *values]].merge(
        ok[ok[knob] == after][[*pairing, *values]], on=pairing, suffixes=("_before", "_after"))
    return twins[[*GROUP_COLUMNS, *keep]].assign(
        measured=np.log(twins["mfu_after"] / twins["mfu_before"]),
        predicted=np.log(twins["predicted_mfu_after"] / twins["predicted_mfu_before"]))


KERNEL_SWITCHES = (("attention", "flash1", "flash2"), ("rmsnorm_kernel", False, True))
"""Switches of one kernel, whose twins a per-run noise estimate compares (`run_noise`)."""


def run_noise(predicted: pd.DataFrame,
              switches: Sequence[tuple[str, object, object]] = KERNEL_SWITCHES,
              within: Sequence[str] = ("tp",)) -> pd.DataFrame:
    """How much one run's MFU scatters, per job, estimated from twin runs: how far the
    measured effect of a kernel switch strays from the predicted one, from twin to twin.

    For each twin pair (`knob_effects`), the residual is measured − predicted log MFU ratio.
    A constant error of the cost model in a switch's effect (per switch and value of
    `within`) is taken out by comparing residuals within those groups; what is left is two
    runs' noise, plus whatever the model gets wrong from twin to twin, so
    sqrt(pooled variance / 2) bounds one run's relative noise from above.

    Returns one row per job with twins, `noise` (relative) and `noise_points` (that share of
    the job's best measured MFU, in MFU points): a regret or an order error of that size is
    within what one run more or less would change.
    """
    parts = [_twins(predicted, knob, before, after, within, "run_noise").assign(switch=knob)
             for knob, before, after in switches]
    twins = pd.concat(parts, ignore_index=True)
    twins["residual"] = twins["measured"] - twins["predicted"]
    groups = [*GROUP_COLUMNS, "switch", *within]
    twins["deviation"] = twins["residual"] - twins.groupby(
        groups, observed=True)["residual"].transform("mean")
    twins["group"] = twins.groupby(groups, observed=True).ngroup()
    per_job = twins.groupby(list(GROUP_COLUMNS), observed=True).agg(
        twins=("residual", "size"), groups=("group", "nunique"),
        squares=("deviation", lambda d: float((d ** 2).sum()))).reset_index()
    dof = per_job["twins"] - per_job["groups"]
    per_job["noise"] = np.sqrt(per_job["squares"] / dof.where(dof > 0) / 2)
    ok = collapse_twins(predicted)
    best = ok[ok["status"] == "ok"].groupby(list(GROUP_COLUMNS), observed=True)["mfu"].max()
    per_job = per_job.merge(best.rename("best_mfu").reset_index(), on=list(GROUP_COLUMNS))
    per_job["noise_points"] = 100 * per_job["noise"] * per_job["best_mfu"]
    return per_job.drop(columns=["squares", "groups"])


def spearman_change_interval(before: pd.DataFrame, after: pd.DataFrame, *,
                             level: float = 0.95, resamples: int = 2000,
                             seed: int = 0) -> tuple[float, float, float]:
    """How much of a change in ρ between two cost models is the luck of which runs were made.

    `before` and `after` are one job's rows predicted by two cost models (the same rows).
    Returns ρ(after) − ρ(before) over the job's `ok` rows that both price (twins collapsed)
    and its paired bootstrap interval at `level`: the rows are resampled with replacement
    and both ρ are recomputed on each resample. An interval that holds 0 is a change the
    job's runs cannot tell from noise: with n rows ρ itself wanders by about (1 − ρ²)/√n.
    """
    first, second = (_ok_rows_of_one_job(frame) for frame in (before, after))
    keys = [c for c in (*GROUP_COLUMNS, *LAYOUT_COLUMNS) if c in first.columns]
    if not first[keys].equals(second[keys]):
        raise LayoutSearchError("spearman_change_interval: `before` and `after` must hold the "
                                "same measured rows, predicted by two cost models")
    measured = first["mfu"].to_numpy(float)
    predicted = np.stack([first["predicted_mfu"].to_numpy(float),
                          second["predicted_mfu"].to_numpy(float)])
    priced = np.isfinite(predicted).all(axis=0)
    measured, predicted = measured[priced], predicted[:, priced]
    if len(measured) < 3:
        return float("nan"), float("nan"), float("nan")
    # Column 0 is the rows as measured; the others are resamples, drawn with replacement.
    draws = np.random.default_rng(seed).integers(0, len(measured), (len(measured), resamples))
    draws = np.column_stack([np.arange(len(measured)), draws])

    # One column per resample; ties share their mean rank, as in _spearman.
    measured_ranks = pd.DataFrame(measured[draws]).rank().to_numpy()

    def rho(values: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return _columnwise_correlation(pd.DataFrame(values[draws]).rank().to_numpy(),
                                           measured_ranks)

    changes = rho(predicted[1]) - rho(predicted[0])
    tail = 100 * (1 - level) / 2
    low, high = np.nanpercentile(changes[1:], [tail, 100 - tail])
    return float(changes[0]), float(low), float(high)


def _ok_rows_of_one_job(predicted: pd.DataFrame) -> pd.DataFrame:
    collapsed = collapse_twins(predicted)
    if collapsed[list(GROUP_COLUMNS)].drop_duplicates().shape[0] > 1:
        raise LayoutSearchError("spearman_change_interval: the rows must be of one job "
                                f"(one {', '.join(GROUP_COLUMNS)})")
    return collapsed[collapsed["status"] == "ok"].reset_index(drop=True)


def _columnwise_correlation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson's r of each column of `a` with the same column of `b` (NaN where one is flat)."""
    a = a - a.mean(axis=0)
    b = b - b.mean(axis=0)
    return (a * b).sum(axis=0) / np.sqrt((a * a).sum(axis=0) * (b * b).sum(axis=0))
