"""The public Python API: `search` a job's layouts, `predict` measured or planned rows.

    ranked = search(model="llama_13b", cluster="a100_80gb", num_gpus=64, seq_length=2048,
                    global_batch_size=2048, vocab_size=128000)
    ranked.head(10)
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from layoutsearch.catalog import clusters_by_gpu, load_cluster, load_model
from layoutsearch.costs import CostModel, build_cost_model
from layoutsearch.costs.analytic import AnalyticCostModel
from layoutsearch.costs.constants import constants_path
from layoutsearch.costs.measured import MeasuredCostModel
from layoutsearch.costs.replay import ReplayCostModel
from layoutsearch.drivers import Driver, GridDriver, build_driver
from layoutsearch.errors import LayoutSearchError, closest_names
from layoutsearch.layout import Layout
from layoutsearch.measurements import read_table, validate_measurements
from layoutsearch.megatron import with_megatron_args
from layoutsearch.megatron.args import build_command, flash3_attention_option, reduces_in_bf16
from layoutsearch.megatron.emit import (
    MEGATRON_SETTINGS,
    SettingsSpec,
    check_settings,
    command_rejections,
)
from layoutsearch.megatron.launchers import DRY_RUN_REASON
from layoutsearch.megatron.settings import MegatronSettings, resolve_settings
from layoutsearch.no_fit import no_fit_message
from layoutsearch.notes import (
    batch_note,
    close_call_note,
    constants_note,
    fabric_note,
    failed_launches_note,
    headroom_note,
    mfu_convention_note,
    rejected_commands_note,
)
from layoutsearch.problem import SearchProblem
from layoutsearch.results import JOB, NOTED_FOR, notes_key, rank
from layoutsearch.rules import violations
from layoutsearch.space import DP_IS_DERIVED, KNOBS, SearchSpace
from layoutsearch.specs import ClusterSpec, Job, ModelSpec

MODEL_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelSpec))
MEGATRON_ARGS_ROWS = 1_000
"""search() writes the Megatron-LM arguments of at most this many fitting rows, the best
ones (each command takes ~30 µs to build; a million-row search must not build them all)."""
DRY_RUN_SCRIPTS_NAMED = 5
"""Launch scripts a dry run's note names one by one: a dry run without top_k writes one per
layout that passes the rules (1,018 for a 13B job), which would make the note a page."""


class NoLayoutFitsWarning(UserWarning):
    """Every candidate of a search is infeasible; the message says why and what to change."""


def _split_overrides(overrides: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    model_fields, pins = {}, {}
    for key, value in overrides.items():
        if key in MODEL_FIELDS:
            model_fields[key] = value
        elif key in KNOBS:
            pins[key] = value
        else:
            close = closest_names(key, [*MODEL_FIELDS, *KNOBS])
            hint = (f"{DP_IS_DERIVED}; " if key == "dp" else
                    f"did you mean {' or '.join(map(repr, close))}? " if close else "")
            raise LayoutSearchError(
                f"unknown override {key}={value!r}: not a model field nor a knob; {hint}"
                f"model fields: {', '.join(sorted(MODEL_FIELDS))}; knobs: {', '.join(KNOBS)}"
            )
    return model_fields, pins


def _wrong_type(argument: str, value: Any, expected: str) -> LayoutSearchError:
    return LayoutSearchError(f"{argument}={value!r}: must be {expected}")


def resolve_model(model: str | ModelSpec, **fields: Any) -> ModelSpec:
    if not isinstance(model, str | ModelSpec):
        raise _wrong_type("model", model, "a catalog name (e.g. 'llama_13b') or a ModelSpec")
    spec = load_model(model) if isinstance(model, str) else model
    return spec.replace(**fields) if fields else spec


def resolve_cluster(cluster: str | ClusterSpec) -> ClusterSpec:
    if not isinstance(cluster, str | ClusterSpec):
        raise _wrong_type("cluster", cluster, "a catalog name (e.g. 'a100_80gb') or a ClusterSpec")
    return load_cluster(cluster) if isinstance(cluster, str) else cluster


def resolve_space(space: str | SearchSpace | Mapping[str, Any]) -> SearchSpace:
    if isinstance(space, SearchSpace):
        return space
    if isinstance(space, str):
        return SearchSpace.load(space)
    if isinstance(space, Mapping):
        return SearchSpace.from_dict(space)
    raise _wrong_type("search_space", space,
                      "a name (e.g. 'paper'), a SearchSpace or a mapping of knob values")


def search(
    *,
    model: str | ModelSpec,
    cluster: str | ClusterSpec = "a100_80gb",
    num_gpus: int,
    seq_length: int,
    global_batch_size: int,
    search_space: str | SearchSpace | Mapping[str, Any] = "paper",
    cost_model: str | Path | Mapping[str, Any] | CostModel = "analytic",
    driver: str | Mapping[str, Any] | Driver = "grid",
    megatron: SettingsSpec = None,
    **overrides: Any,
) -> pd.DataFrame:
    """Rank the layouts of one job, best first (feasible rows first).

    `overrides` change model fields (`vocab_size=128000`) or pin knobs (`tp=2`,
    `attention=["flash2"]`). The frame's `attrs["message"]` explains an empty answer.
    `megatron_args` holds the quoted `pretrain_gpt.py` arguments of the best
    `MEGATRON_ARGS_ROWS` (1,000) fitting rows, and "" for every other row, built with the
    Megatron-LM settings `megatron` names (a `cost_models/` name, a YAML path, a mapping);
    by default a measured cost model's own, else `cost_models/megatron.yaml`. When those
    settings carry extra flags, a layout whose command they make Megatron-LM reject does not
    fit: its reason says why, and `attrs["rejected_commands_note"]` counts them.
    """
    model_fields, pins = _split_overrides(overrides)
    job = Job(
        model=resolve_model(model, **model_fields),
        cluster=resolve_cluster(cluster),
        num_gpus=num_gpus,
        seq_length=seq_length,
        global_batch_size=global_batch_size,
    )
    space = resolve_space(search_space)
    if pins:
        space = space.pin(**pins)
    clusters = {**clusters_by_gpu(), job.cluster.gpu.name: job.cluster}
    scorer = build_cost_model(cost_model)
    # A wrong one fails before the search.
    settings = _megatron_settings(megatron, scorer, job.cluster.gpu.name)
    problem = _problem(job, space, scorer, clusters, settings)
    check_settings(problem.feasible_candidates(), job, settings)
    searcher = build_driver(driver)
    ranked = _dry_run_scripts_first(rank(searcher.run(problem)))
    fitting = ranked.index[ranked["fits"].eq(True)][:MEGATRON_ARGS_ROWS]
    ranked["megatron_args"] = ""
    if len(fitting):
        ranked.loc[fitting, "megatron_args"] = with_megatron_args(
            ranked.loc[fitting], job, settings)["megatron_args"]
    scripts = ranked.loc[ranked["reason"].str.startswith(DRY_RUN_REASON), "reason"]
    ranked.attrs["dry_run_note"] = ""
    # Counted among the rows ranked: a sampling driver returns only those it evaluated.
    passing_rules = 0 if ranked["fits"].any() else int((violations(ranked, clusters) == "").sum())
    message = no_fit_message(ranked, job, problem.passing_tp_pp, passing_rules=passing_rules,
                             fits=_fits(problem), space=problem.space)
    if message and len(scripts):
        # Nothing fits because nothing ran: the scripts are the answer, not a failure.
        message = ""
        ranked.attrs["dry_run_note"] = _dry_run_note(
            [reason.removeprefix(DRY_RUN_REASON) for reason in scripts], job)
    if message and len(ranked) < len(problem.candidates):
        # A sampling driver saw part of the space: what it saw says nothing of the rest.
        more = "raise its n_trials, or " if hasattr(searcher, "n_trials") else ""
        message = (f"none of the {len(ranked)} layouts the {searcher.name} driver evaluated "
                   f"(of {len(problem.candidates)} in the space) fits; {more}price every "
                   f"layout with driver=grid. Among those evaluated: {message}")
    # Plain JSON values, which DataFrame.to_parquet writes (and reads back).
    ranked.attrs[JOB] = job.to_record()
    ranked.attrs[MEGATRON_SETTINGS] = settings.to_record()  # emit_megatron's scripts use it
    ranked.attrs["space_size"] = len(problem.candidates)
    ranked.attrs["message"] = message or ""
    ranked.attrs["headroom_note"] = headroom_note(ranked)
    ranked.attrs["close_call_note"] = _close_call_note(ranked, scorer, searcher, job, megatron)
    ranked.attrs["mfu_convention_note"] = mfu_convention_note(ranked, job)
    ranked.attrs["fabric_note"] = _fabric_note(ranked, scorer, job)
    ranked.attrs["constants_note"] = (
        constants_note(ranked, job.cluster.gpu.name, scorer.fitted,
                       lambda: _constants_name(scorer), _measured_search_options(ranked, job))
        if isinstance(scorer, AnalyticCostModel) else "")
    ranked.attrs["failed_launches_note"] = failed_launches_note(ranked)
    ranked.attrs["rejected_commands_note"] = rejected_commands_note(ranked)
    # What a replay's file, or a measured search's launches, leave out of the ranking.
    ranked.attrs["coverage_note"] = (
        scorer.coverage_note(problem.feasible_candidates().drop(columns="rule_reason"),
                             clusters)
        if isinstance(scorer, ReplayCostModel | MeasuredCostModel) else "")
    ranked.attrs["batch_note"] = batch_note(ranked, job,
                                            _rescore(job, space, scorer, clusters, settings))
    ranked.attrs[NOTED_FOR] = notes_key(ranked)
    if message:
        warnings.warn(message, NoLayoutFitsWarning, stacklevel=2)
    return ranked


def _problem(job: Job, space: SearchSpace, scorer: CostModel,
             clusters: Mapping[str, ClusterSpec], settings: MegatronSettings) -> SearchProblem:
    """The job's search problem; with the settings' extra flags, a layout whose command
    Megatron-LM would reject does not fit."""
    launch_check = (partial(command_rejections, job=job, settings=settings)
                    if settings.extra_args else None)
    return SearchProblem.build(job, space, scorer, clusters, launch_check)


def _rescore(job: Job, space: SearchSpace, scorer: CostModel,
             clusters: Mapping[str, ClusterSpec], settings: MegatronSettings,
             ) -> Callable[[int], pd.DataFrame] | None:
    """Ranks the space at another global batch with the grid (for the batch note to check
    its suggestion; the search's own driver could leave an optuna study behind in its
    storage); None for a measured cost model, which would launch runs to answer."""
    if isinstance(scorer, MeasuredCostModel):
        return None

    def ranked_at(batch: int) -> pd.DataFrame:
        other = dataclasses.replace(job, global_batch_size=batch)
        return rank(GridDriver().run(_problem(other, space, scorer, clusters, settings)))
    return ranked_at


def _fits(problem: SearchProblem) -> Callable[[pd.DataFrame], pd.Series] | None:
    """Whether each of some layouts of the job passes the rules and fits, by the search's
    analytic cost model (for the no-fit message to try its fixes); None for other cost
    models: a replay knows only the layouts it measured, a measured one would launch runs."""
    if not isinstance(problem.cost_model, AnalyticCostModel):
        return None
    columns = [c for c in problem.candidates.columns if c != "rule_reason"]

    def fits(rows: pd.DataFrame) -> pd.Series:
        layouts = rows[columns].reset_index(drop=True)
        layouts["rule_reason"] = violations(layouts, problem.clusters)
        return problem.evaluate(layouts)["fits"]
    return fits


def _dry_run_note(paths: list[str], job: Job) -> str:
    """What a dry run that measured nothing wrote (the launch scripts at `paths`, which are
    rows 0.. of the ranking) and how to measure them."""
    # The local launcher runs one node (LocalLauncher.preflight refuses more).
    launchers = ("cost_models.launcher=local or slurm"
                 if job.num_gpus <= job.cluster.gpus_per_node else
                 f"cost_models.launcher=slurm (local runs one node; this job needs "
                 f"{job.num_gpus} GPUs, {job.cluster.gpus_per_node} a node)")
    named = ", ".join(paths[:DRY_RUN_SCRIPTS_NAMED])
    if len(paths) > DRY_RUN_SCRIPTS_NAMED:
        # Path: scripts in the folder the command ran in (log_dir: .) share "", not ".".
        named += (f" and {len(paths) - DRY_RUN_SCRIPTS_NAMED} more in "
                  f"{Path(os.path.commonpath(paths))} (each row's reason names its own)")
    return (f"dry run: wrote {_count(len(paths), 'launch script')} and measured nothing "
            f"(rows 0-{len(paths) - 1}): {named}. Measure them with {launchers}; the runs "
            "land in the measurement file and a search reads them back.")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _dry_run_scripts_first(ranked: pd.DataFrame) -> pd.DataFrame:
    """Rows a dry run wrote scripts for, just after the rows that fit: they are what the
    search chose to measure, in the order it chose them (the prescreen's best first)."""
    scripted = ranked["reason"].str.startswith(DRY_RUN_REASON)
    if not scripted.any():
        return ranked
    fits = ranked["fits"].astype(bool)
    order = pd.concat([ranked[fits], ranked[scripted & ~fits], ranked[~scripted & ~fits]])
    return order.reset_index(drop=True)


def _megatron_settings(megatron: SettingsSpec, scorer: CostModel, gpu: str,
                       ) -> MegatronSettings:
    """The settings the `megatron_args` column is built with: those named, else the ones a
    measured cost model launches with, so the column is the command that ran (other
    settings named beside a measured cost model are refused). Under an
    analytic model the gradient reduce, unless the settings fix it, is the one it priced
    (`gradient_bytes` 2: --grad-reduce-in-bf16)."""
    if isinstance(scorer, MeasuredCostModel):
        if megatron is not None and resolve_settings(megatron) != scorer.settings:
            # The column and emit=megatron scripts would not be the commands that ran.
            raise LayoutSearchError(
                f"megatron={megatron!r:.80}: differs from the Megatron-LM settings the "
                "measured cost model launches with (cost_models.megatron); the megatron_args "
                "column and emit=megatron scripts show the commands it runs, so leave "
                "megatron out, or name these settings in cost_models.megatron")
        return scorer.settings
    settings = resolve_settings(megatron)
    if (settings.grad_reduce_in_bf16 is None and isinstance(scorer, AnalyticCostModel)
            and gpu in scorer.constants):
        return settings.replace(
            grad_reduce_in_bf16=reduces_in_bf16(scorer.constants[gpu].gradient_bytes))
    return settings


def _close_call_note(ranked: pd.DataFrame, scorer: CostModel, searcher: Driver, job: Job,
                     megatron: SettingsSpec) -> str:
    """The close-call note of an exhaustive analytic ranking; "" for any other: measured
    MFUs (replay, measured) carry no model error, and a sampling driver's table lacks the
    layouts it never scored. The measured search it suggests launches with the settings
    `megatron` names, where a name or path can say them on a command line."""
    if not (isinstance(scorer, AnalyticCostModel) and isinstance(searcher, GridDriver)):
        return ""
    named = str(megatron) if isinstance(megatron, str | Path) else ""
    # A layout's command caveats (e.g. flash1) come from the layout and model alone.
    return close_call_note(ranked, prescreen=lambda: _constants_name(scorer), settings=named,
                           launchable=lambda row: build_command(Layout.from_row(row), job).exact,
                           options=_measured_search_options(ranked, job))


def _measured_search_options(ranked: pd.DataFrame, job: Job) -> str:
    """What a measured search the notes suggest needs beyond the ranking's own options: on
    a GPU that runs FlashAttention 3, flash3 in a space that has flash2 and not flash3."""
    if not job.cluster.gpu.supports_flash3 or ranked.empty:
        return ""
    return flash3_attention_option({str(kernel) for kernel in ranked["attention"].unique()})


def _fabric_note(ranked: pd.DataFrame, scorer: CostModel, job: Job) -> str:
    """The slow-fabric note of an analytic ranking ("" for measured MFUs, which carry the
    fabric they ran on)."""
    if not isinstance(scorer, AnalyticCostModel):
        return ""
    constants = scorer.constants.get(job.cluster.gpu.name)
    if constants is None:
        return ""
    return fabric_note(ranked, constants.network_efficiency,
                       lambda: f"cost_models={_constants_name(scorer)}")


def _constants_name(model: AnalyticCostModel) -> str:
    """How a measured search's `prescreen` names these constants: their config, or file."""
    name = model.config_name()
    if name is not None:
        return name
    try:
        return str(constants_path(model.source))
    except LayoutSearchError:
        return "<a YAML file of these constants>"


def predict(
    frame: pd.DataFrame | str | Path,
    cost_model: str | Path | Mapping[str, Any] | CostModel = "analytic",
    clusters: Mapping[str, ClusterSpec] | None = None,
) -> pd.DataFrame:
    """The rows of a measurement-schema frame (or file) with the cost model's predictions.

    A frame without a `status` column holds layouts not run yet (planned rows, or rows of
    a `search` result to price with another cost model): their `step_time_s` and `mfu`, if
    any, are not read. Adds `predicted_mfu`, `predicted_step_time_s`, `predicted_peak_memory_gib`,
    `predicted_fits` and `predicted_reason`; the given columns are left as they were. A
    frame that already holds these (a notebook cell run again) gets them replaced: rename
    them first to compare two cost models side by side.
    """
    if isinstance(frame, str | Path):
        source = str(frame)
        frame = read_table(frame)
    elif isinstance(frame, pd.DataFrame):
        source = "frame"
    else:
        raise LayoutSearchError(f"predict: frame={frame!r} must be a pandas DataFrame or the "
                                "path of a CSV or Parquet file of measurement rows")
    clusters = clusters_by_gpu() if clusters is None else _checked_clusters(clusters)
    rows = validate_measurements(frame, source=source, gpus=clusters, planned=True)
    rule_reason = violations(rows, clusters)
    scored = build_cost_model(cost_model).score(rows, clusters)
    out = frame.copy()  # the caller's index and columns stay as they were
    out["predicted_mfu"] = scored["mfu"].to_numpy()
    out["predicted_step_time_s"] = scored["step_time_s"].to_numpy()
    out["predicted_peak_memory_gib"] = scored["peak_memory_gib"].to_numpy()
    fits = scored["fits"].fillna(False).astype(bool) & (rule_reason == "")
    out["predicted_fits"] = fits.to_numpy()
    out["predicted_reason"] = rule_reason.where(rule_reason != "", scored["cost_reason"]).to_numpy()
    return out


def _checked_clusters(clusters: Any) -> dict[str, ClusterSpec]:
    """predict()'s `clusters`: the GPU name of the rows' `gpu` column -> the ClusterSpec to
    price them on."""
    expected = "a mapping of GPU names to ClusterSpecs, e.g. {'a100_80gb': load_cluster(...)}"
    if not isinstance(clusters, Mapping) or not clusters:
        raise _wrong_type("predict: clusters", clusters, expected)
    for gpu, cluster in clusters.items():
        if not isinstance(gpu, str) or not isinstance(cluster, ClusterSpec):
            raise _wrong_type(f"predict: clusters[{gpu!r}]", cluster, expected)
    return dict(clusters)
