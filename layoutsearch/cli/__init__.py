"""The `layoutsearch` command: a Hydra application over the catalog and the config groups.

It composes `conf/layoutsearch.yaml` with the groups `model`, `cluster` (the catalog),
`search_spaces`, `cost_models` and `driver`, runs the same search as
`layoutsearch.search()`, prints the ranking and writes `ranked.csv` into the Hydra run
directory; at the end of a `--multirun`, its callback writes the sweep's summary. The command
line is checked first (`overrides`, which reads it with Hydra's parser); this package is the
only part of layoutsearch that imports Hydra.

    layoutsearch model=llama_13b model.vocab_size=128000 num_gpus=64 search_spaces.tp=[1,2]
    layoutsearch --multirun model=llama_13b,llama_65b num_gpus=64,128
"""

from __future__ import annotations

import contextlib
import sys
import traceback
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn, cast

import hydra
import numpy as np
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from layoutsearch.api import NoLayoutFitsWarning, search
from layoutsearch.catalog import cluster_from_dict, model_from_dict
from layoutsearch.cli.overrides import (
    CONFIG_NAME,
    GROUP_DIRS,
    check_group_choices,
    check_output_dirs,
    offered_options,
    settable_spec_fields,
)
from layoutsearch.cli.overrides import (
    group_options as group_options,  # re-exported: layoutsearch.cli.group_options
)
from layoutsearch.costs import build_cost_model
from layoutsearch.drivers import build_driver
from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.layout import LAYOUT_COLUMNS
from layoutsearch.megatron import emit_megatron
from layoutsearch.megatron.emit import best_command_lines
from layoutsearch.paths import config_folders, package_folder
from layoutsearch.reporting import report as write_run_report
from layoutsearch.reporting.sweep import (
    ERROR_FILE,
    NOTE_TAGS,
    RANKED_FILE,
    SWEEPS_UNDER_WAY,
    collect_sweep,
    forget_job_outputs,
    mark_sweep_end,
    mark_sweep_start,
    write_notes,
    write_ranking,
    write_summary,
)
from layoutsearch.results import TOP_K, counts_line, grouped, job_of
from layoutsearch.space import SearchSpace

SUMMARY_COLUMNS = (*LAYOUT_COLUMNS, "mfu", "step_time_s", "peak_memory_gib", "headroom_gib",
                   "fits", "reason")

Emitter = Callable[..., object]
EMITTERS: dict[str, Emitter] = {"megatron": emit_megatron}
"""`emit=<name>` -> writer(ranked frame, run directory, top_k=...) of an extra output for the
`top_k` best layouts (`emit=megatron top_k=5`: launch scripts); what a writer needs beyond
the rows travels in the frame's attrs, set by `search`. Register here."""

USER_ERROR_STATUS = 2  # the argparse convention for "the command line was wrong"
INTERRUPTED_STATUS = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
NO_FIT_STATUS = 3
"""Exit status of a single run whose search found no layout that fits: the outputs are
written and the reason printed, but a script that goes on to launch (`emit=megatron`, then
sbatch) must stop. A `--multirun` exits 0 for it: a sweep over sizes expects some jobs not
to fit, and its summary shows each job's count of fitting layouts. A measured search's dry
run exits 0 too: nothing fits because nothing ran, and its scripts are the answer."""


def run(config: Mapping[str, Any], output_dir: Path,
        cost_model_name: str = "cost_models") -> pd.DataFrame:
    """Search the job a composed config describes; print the report, write `ranked.csv`.

    `cost_model_name` is how messages name the cost-model config ("cost_models=analytic").
    """
    _require_job_settings(config)
    model = model_from_dict(config["model"])
    cluster = cluster_from_dict(config["cluster"])
    space = SearchSpace.from_dict(config["search_spaces"])
    top_k = config.get("top_k", TOP_K)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise LayoutSearchError(f"top_k={top_k!r}: must be a positive integer (rows printed)")
    emit = config.get("emit")
    if emit is not None and not isinstance(emit, str):
        raise LayoutSearchError(f"emit={emit!r}: must be one name, one of {', '.join(EMITTERS)}")
    if emit is not None and emit not in EMITTERS:
        raise LayoutSearchError(unknown_name_message("emit", emit, EMITTERS))
    with warnings.catch_warnings():  # printed below as the frame's message instead
        warnings.simplefilter("ignore", NoLayoutFitsWarning)
        ranked = search(
            model=model,
            cluster=cluster,
            num_gpus=config["num_gpus"],
            seq_length=config["seq_length"],
            global_batch_size=config["global_batch_size"],
            search_space=space,
            cost_model=build_cost_model(config["cost_models"], name=cost_model_name),
            driver=build_driver(config["driver"]),
            megatron=config.get("megatron"),
        )
    output_dir.mkdir(parents=True, exist_ok=True)
    csv = write_ranking(ranked, output_dir)
    notes = write_notes(ranked, output_dir)
    markdown = write_run_report(ranked, output_dir, top_k=top_k)
    print(report(ranked, space, top_k=top_k))
    if emit is not None:
        EMITTERS[emit](ranked, output_dir, top_k=top_k)
    print(f"\nwrote {csv}, {notes.name} and {markdown.name} beside it")
    return ranked


JOB_SETTINGS = ("num_gpus", "seq_length", "global_batch_size")
"""Settings every search needs besides a choice of each group (GROUP_DIRS)."""


def _require_job_settings(config: Mapping[str, Any]) -> None:
    """Refuse a config without a group choice or a job setting every search needs (removed
    with `~model`, or left out of a primary config of the user's own), naming it."""
    for group in GROUP_DIRS:
        if group not in config:
            raise LayoutSearchError(
                f"{group}: removed (~{group}) or never chosen, but every search needs one; "
                f"choose one instead, e.g. {group}=<name>; options: "
                f"{', '.join(offered_options(group))}")
    for name in JOB_SETTINGS:
        if name not in config:
            raise LayoutSearchError(f"{name}: removed (~{name}) or never set, but every "
                                    f"search needs it; set it instead, e.g. {name}=<number>")


def _table(frame: pd.DataFrame) -> str:
    return frame.to_string(float_format=lambda v: f"{v:.3f}")


def report(ranked: pd.DataFrame, space: SearchSpace, top_k: int) -> str:
    """The job, the top `top_k` rows, the best layout's time and memory breakdowns, and its
    Megatron-LM command."""
    job = job_of(ranked, "report")
    fits = int(ranked["fits"].sum())
    lines = [
        f"job: {job.model.name} ({job.model.num_parameters() / 1e9:.1f}B parameters, "
        f"vocab {grouped(job.model.vocab_size)}) on {job.num_gpus} x {job.cluster.gpu.name}, "
        f"seq_length {job.seq_length}, global_batch_size {job.global_batch_size}",
        f"search space {space.name!r}: {counts_line(ranked)}",
        "",
        f"top {min(top_k, len(ranked))}:",
        _table(ranked.loc[: top_k - 1, [c for c in SUMMARY_COLUMNS if c in ranked.columns]]),
    ]
    if ranked.attrs.get("message"):
        lines += ["", ranked.attrs["message"]]
    for note in NOTE_TAGS:
        if ranked.attrs.get(note):
            lines += ["", f"note: {ranked.attrs[note]}"]
    if not fits:
        return "\n".join(lines)
    best = ranked.iloc[0]
    for prefix, unit, total in (("time", "s", "step_time_s"), ("memory", "gib", "peak_memory_gib")):
        parts = [c for c in ranked.columns if c.startswith(f"{prefix}_") and c.endswith(f"_{unit}")]
        values = best[parts].astype(float).to_numpy()
        if np.isnan(values).all() or pd.isna(best[total]):  # also when there are no parts
            # A replayed or measured row has the measured totals, not their parts.
            shown = "not measured" if pd.isna(best[total]) else f"{best[total]:.3f}"
            lines += ["", f"best layout, {prefix} ({total} = {shown}): this cost model gives "
                          "no breakdown"]
            continue
        breakdown = pd.DataFrame(
            {unit: values, "share": [f"{v / float(best[total]):.1%}" for v in values]},
            index=[c.removeprefix(f"{prefix}_").removesuffix(f"_{unit}") for c in parts],
        )
        lines += ["", f"best layout, {prefix} ({total} = {best[total]:.3f}):", _table(breakdown)]
    command = best_command_lines(ranked)
    if command:
        lines += ["", *command]
    return "\n".join(lines)


def _print_error(message: object) -> None:
    print(f"layoutsearch: error: {message}", file=sys.stderr)


def _fail(error: LayoutSearchError) -> NoReturn:
    _print_error(error)
    sys.exit(USER_ERROR_STATUS)


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The job's settings with every `${...}` resolved; one that cannot be is named."""
    try:
        return cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))  # keys are str
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "a setting"
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise LayoutSearchError(
            f"{key}: cannot resolve its value ({message}); an interpolation ${{...}} must "
            "name another setting (e.g. ${seq_length}) or a resolver (${now:%H-%M})"
        ) from None


INTERRUPTED_JOB = "interrupted (Ctrl-C) before this job finished; rerun it to rank its layouts"
INTERRUPTED_REPORT = (f"interrupted (Ctrl-C) after its ranking ({RANKED_FILE}, complete) was "
                      "written, before its report; rerun it for the report")


def _summarize(sweep_dir: Path) -> tuple[pd.DataFrame, Path]:
    """Write the sweep's summary and say where: the table of its jobs, and its report."""
    table = collect_sweep(sweep_dir)
    path = write_summary(table, sweep_dir)
    print(f"wrote {path} and {sweep_dir / 'multirun.csv'}")
    return table, path


class MultirunSummary(Callback):
    """Hydra callback (conf/layoutsearch.yaml): summarize the sweep when the multirun ends."""

    def __init__(self) -> None:
        self.sweep_dir: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Resolve now: the sweep dir interpolates ${now:...}, which must not drift.
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        mark_sweep_start(self.sweep_dir)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = self.sweep_dir or Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            mark_sweep_end()
            return
        table, path = _summarize(sweep_dir)
        mark_sweep_end()  # after the summary: a Ctrl-C while it is written writes it again
        failed = int(table["error"].notna().sum()) if "error" in table else 0
        if failed:
            # After every job ran: the sweep's exit status says that some input was wrong.
            _print_error(f"{failed} of {len(table)} job{'s' * (len(table) != 1)} failed; "
                         f"see {path}")
            sys.exit(USER_ERROR_STATUS)


# Hydra resolves config_path against the package of the function's module, taking the last
# dotted part of "layoutsearch.cli" for a module name (hydra/_internal/utils.py,
# compute_search_path_dir): "conf" is pkg://layoutsearch/conf, beside this package.
@hydra.main(version_base="1.3", config_path="conf", config_name=CONFIG_NAME)
def _app(cfg: DictConfig) -> None:
    hydra_config = HydraConfig.get()
    output_dir = Path(hydra_config.runtime.output_dir)
    forget_job_outputs(output_dir)
    # Names in settings (cost_models.megatron=mine) are found where Hydra found the groups.
    # (Relative ones from where the command ran: hydra.job.chdir moves the job.)
    launched_in = Path(hydra_config.runtime.cwd)
    sources = hydra_config.runtime.config_sources
    folders = [launched_in / s.path for s in sources if s.schema == "file"]
    folders += [f for s in sources if s.schema == "pkg" and (f := package_folder(s.path))]
    try:
        choice = hydra_config.runtime.choices.get("cost_models")
        # Paths a user gives (a settings file, measurements, a study's storage) mean the same
        # with hydra.job.chdir=true: outputs go to output_dir by name, and a measurement file
        # in each job's own folder would re-measure every layout in the next sweep.
        with config_folders(folders), contextlib.chdir(launched_in):
            ranked = run(resolved(cfg), output_dir, cost_model_name=f"cost_models={choice}")
    except KeyboardInterrupt:
        if hydra_config.mode == RunMode.MULTIRUN:
            # The sweep's summary, written as it stops, shows this job as not finished.
            output_dir.mkdir(parents=True, exist_ok=True)
            ranked_whole = (output_dir / RANKED_FILE).is_file()
            (output_dir / ERROR_FILE).write_text(
                f"{INTERRUPTED_REPORT if ranked_whole else INTERRUPTED_JOB}\n")
        raise
    except LayoutSearchError as error:
        if hydra_config.mode != RunMode.MULTIRUN:
            _fail(error)
        # One wrong job of a sweep must not stop the others: record it and go on.
        _print_error(error)
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / ERROR_FILE).write_text(f"{error}\n")
    except Exception as error:
        if hydra_config.mode != RunMode.MULTIRUN:
            raise
        # A fault of layoutsearch's own in one job: the traceback for a report, and the
        # sweep's other jobs and summary as for a wrong input.
        traceback.print_exc()
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / ERROR_FILE).write_text(
            f"internal error (a layoutsearch bug; the traceback is in the job's log): "
            f"{type(error).__name__}: {error}\n")
    else:
        # A dry run fits nothing because it measured nothing: its scripts are the answer.
        if (hydra_config.mode != RunMode.MULTIRUN and not ranked["fits"].any()
                and not ranked.attrs.get("dry_run_note")):
            sys.exit(NO_FIT_STATUS)


def main() -> None:
    """Console-script entry point (`layoutsearch ...`)."""
    try:
        check_group_choices(sys.argv[1:])
        check_output_dirs(sys.argv[1:])
    except LayoutSearchError as error:
        _fail(error)
    sys.argv[1:] = settable_spec_fields(sys.argv[1:])
    try:
        _app()
    except KeyboardInterrupt:
        # Ctrl-C is the user's choice, not a failure to explain with a traceback; what was
        # saved (a study, measurements) said so as it stopped.
        try:
            for sweep_dir in SWEEPS_UNDER_WAY:
                # The jobs that finished are answers: summarize them; those not started are
                # left out of the table.
                _summarize(sweep_dir)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: the user will not wait for the summary either
        print("layoutsearch: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED_STATUS)
