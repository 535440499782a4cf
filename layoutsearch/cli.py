"""The `layoutsearch` command: a Hydra application over the catalog and the config groups.

It composes `conf/layoutsearch.yaml` with the groups `model`, `cluster` (the catalog),
`search_spaces`, `cost_models` and `driver`, runs the same search as
`layoutsearch.search()`, prints the ranking and writes `ranked.csv` into the Hydra run
directory; at the end of a `--multirun`, its callback writes the sweep's summary. This is the
only module of the package that imports Hydra.

    layoutsearch model=llama_13b model.vocab_size=128000 num_gpus=64 search_spaces.tp=[1,2]
    layoutsearch --multirun model=llama_13b,llama_65b num_gpus=64,128
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

import hydra
import numpy as np
import pandas as pd
import yaml
from hydra._internal.utils import get_args_parser  # Hydra's own argv parser (stable in 1.3)
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, Override, OverrideType, ValueType
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from layoutsearch.api import NoLayoutFitsWarning, search
from layoutsearch.catalog import CLUSTER_DIR, MODEL_DIR, cluster_from_dict, model_from_dict
from layoutsearch.costs import build_cost_model
from layoutsearch.costs.constants import config_target
from layoutsearch.drivers import build_driver
from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.layout import LAYOUT_COLUMNS
from layoutsearch.megatron import emit_megatron
from layoutsearch.paths import config_dir, config_folders, option_mapping, package_folder
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
from layoutsearch.results import counts_line, job_of
from layoutsearch.space import DP_IS_DERIVED, SearchSpace
from layoutsearch.specs import ClusterSpec, GPUSpec, ModelSpec

CONF_DIR = Path(__file__).parent / "conf"
CONFIG_NAME = "layoutsearch"
"""The primary config, `conf/layoutsearch.yaml`."""

GROUP_DIRS: dict[str, Callable[[], Path]] = {
    "model": lambda: MODEL_DIR,
    "cluster": lambda: CLUSTER_DIR,
    "search_spaces": lambda: config_dir("search_spaces"),
    "cost_models": lambda: config_dir("cost_models"),
    "driver": lambda: CONF_DIR / "driver",
}
"""Config group -> the folder of its options (one YAML file each)."""

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


def group_options(group: str, extra: Sequence[Path] = ()) -> list[str]:
    """The options of `group`: the shipped ones, and those in the user's config folders
    `extra` (`--config-dir`, `hydra.searchpath`), where `<folder>/<group>/<name>.yaml`."""
    folders = [GROUP_DIRS[group](), *(folder / group for folder in extra)]
    return sorted({p.stem for folder in folders for p in folder.glob("*.yaml")})


def offered_options(group: str, extra: Sequence[Path] = ()) -> list[str]:
    """The options a message offers for `group`: `cost_models/` also holds the Megatron-LM
    backend's settings, which are chosen through cost_models=measured, not as a cost model
    (one without a `_target_`)."""
    options = group_options(group, extra)
    if group != "cost_models":
        return options
    return [o for o in options if config_target(_option_config(group, o, extra))]


def run(config: Mapping[str, Any], output_dir: Path,
        cost_model_name: str = "cost_models") -> pd.DataFrame:
    """Search the job a composed config describes; print the report, write `ranked.csv`.

    `cost_model_name` is how messages name the cost-model config ("cost_models=analytic").
    """
    _require_job_settings(config)
    model = model_from_dict(config["model"])
    cluster = cluster_from_dict(config["cluster"])
    space = SearchSpace.from_dict(config["search_spaces"])
    top_k = config.get("top_k", 10)
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
    markdown = write_run_report(ranked, output_dir)
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
    """The job, the top `top_k` rows, and the best layout's time and memory breakdowns."""
    job = job_of(ranked, "report")
    fits = int(ranked["fits"].sum())
    lines = [
        f"job: {job.model.name} ({job.model.num_parameters() / 1e9:.1f}B parameters, "
        f"vocab {job.model.vocab_size}) on {job.num_gpus} x {job.cluster.gpu.name}, "
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
    return "\n".join(lines)


def _print_error(message: object) -> None:
    print(f"layoutsearch: error: {message}", file=sys.stderr)


def _fail(error: LayoutSearchError) -> NoReturn:
    _print_error(error)
    sys.exit(USER_ERROR_STATUS)


def _group_choices(override: Override, options: Sequence[str]) -> Iterator[str]:
    """The option names a group override selects: `model=a,b` -> a, b; a glob, those of the
    group's `options` it matches, as Hydra expands it (`model=glob(llama*)`)."""
    if override.value_type is ValueType.GLOB_CHOICE_SWEEP:
        yield from cast(Glob, override.value()).filter(list(options))
    elif override.is_discrete_sweep():
        yield from override.sweep_string_iterator()
    elif isinstance(value := override.value(), str):
        yield value


def _primary_config() -> dict[str, Any]:
    """`conf/layoutsearch.yaml` as written: its settings and its group defaults."""
    return cast(dict[str, Any], yaml.safe_load((CONF_DIR / f"{CONFIG_NAME}.yaml").read_text()))


def _known_keys() -> dict[str, list[str]]:
    """Top-level settings, and the fields of those whose fields are fixed, for `check_key`."""
    primary = _primary_config()
    known = {name: [f.name for f in dataclasses.fields(cls)] for name, cls in SPEC_FIELDS.items()}
    known[""] = sorted({*primary, *GROUP_DIRS} - {"defaults"})
    return known


SPEC_FIELDS = {"model": ModelSpec, "cluster": ClusterSpec, "cluster.gpu": GPUSpec,
               "search_spaces": SearchSpace}
"""Config nodes whose every field a user may set, whether or not the YAML spells it out."""


def _chosen_options(group: str, overrides: Sequence[Override],
                    extra: Sequence[Path] = ()) -> list[str]:
    """The options of `group` the command selects: its `group=` choices, else the default."""
    given = [o for o in overrides if o.key_or_group == group]
    if given:
        options = group_options(group, extra)
        return [choice for o in given for choice in _group_choices(o, options)]
    return _default_options(group)


def _default_options(group: str) -> list[str]:
    """The option of `group` that the primary config chooses (none where it chooses none)."""
    primary = _primary_config()
    return [str(d[group]) for d in primary["defaults"] if isinstance(d, dict) and group in d]


def _option_file(group: str, option: str, extra: Sequence[Path] = ()) -> Path | None:
    """An option's YAML file, looked for as Hydra does: in the shipped folder, then the
    user's (the first of a name wins)."""
    for folder in (GROUP_DIRS[group](), *(folder / group for folder in extra)):
        path = folder / f"{option}.yaml"
        if path.is_file():
            return path
    return None


def _option_config(group: str, option: str, extra: Sequence[Path] = ()) -> dict[str, Any]:
    """An option's YAML as written ({} where it is missing or unreadable)."""
    path = _option_file(group, option, extra)
    return (option_mapping(path) or {}) if path else {}


def check_option_files(overrides: Sequence[Override], extra: Sequence[Path]) -> None:
    """Parse every option the command chooses as Hydra will (OmegaConf also refuses a
    duplicate key), so a broken file is named with its line, not in Hydra's traceback."""
    for group in GROUP_DIRS:
        for option in _chosen_options(group, overrides, extra):
            path = _option_file(group, option, extra)
            if path is None:
                continue
            try:
                OmegaConf.load(path)
            except (OSError, UnicodeDecodeError, yaml.YAMLError,
                    OmegaConfBaseException) as error:
                raise LayoutSearchError(
                    f"{group}={option}: {str(path)!r} is not valid YAML: "
                    f"{' '.join(str(error).split())}") from None


SETTING_GROUPS = ("driver", "cost_models")
"""Groups whose options each have settings of their own (`driver.n_trials`,
`cost_models.top_k`): a setting of another option is refused, naming that option."""


def _chosen_settings(group: str, overrides: Sequence[Override],
                     extra: Sequence[Path] = ()) -> dict[str, list[str]]:
    """The options of `group` the command selects (the default's unless it says; several
    in a sweep), each with its keys."""
    return {name: list(_option_config(group, name, extra))
            for name in _chosen_options(group, overrides, extra)}


def check_setting_key(override: Override, group: str, chosen: Mapping[str, Sequence[str]],
                      extra: Sequence[Path] = ()) -> None:
    """`driver.n_trials=5` under the grid driver, `cost_models.top_k=8` under the analytic
    model: say which option has that setting. In a sweep over the group's options the
    setting reaches every job, so each option swept must have it."""
    key = override.key_or_group
    if not key.startswith(f"{group}.") or override.type is OverrideType.DEL:
        return
    name = key.split(".", 1)[1].split(".")[0]
    lacking = [option for option, keys in chosen.items() if name not in keys]
    if not lacking:
        return
    having = [option for option in chosen if option not in lacking]
    if having:
        # Hydra would stop the sweep at the first job whose option lacks it.
        raise LayoutSearchError(
            f"{group}.{name}: the sweep's {group}={lacking[0]} has no setting {name!r} "
            f"({group}={having[0]} has); a setting reaches every job of a --multirun, so "
            f"sweep {group}={lacking[0]} in a command of its own")
    option, keys = lacking[-1], chosen[lacking[-1]]
    owners = [o for o in offered_options(group, extra)
              if name in _option_config(group, o, extra)]
    if owners:
        raise LayoutSearchError(
            f"{group}.{name}: {group}={option} has no setting {name!r}; it is a setting of "
            f"{' and '.join(f'{group}={o}' for o in owners)} (add {group}={owners[0]})")
    raise LayoutSearchError(unknown_name_message(f"{group}={option} setting", name, keys))


def _has_key(group: str, option: str, path: Sequence[str],
             extra: Sequence[Path] = ()) -> bool:
    """Whether the YAML of `option` spells out the key at `path` below the group."""
    node: Any = _option_config(group, option, extra)
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def _left_to_defaults(override: Override, overrides: Sequence[Override],
                      extra: Sequence[Path] = ()) -> bool:
    """Whether `override` sets a key that a YAML Hydra sets it on leaves out, though it is
    valid: a spec field the chosen option leaves to the spec's defaults, or a setting that
    every option of a sweep over the group has and the primary config's default lacks.

    A --multirun composes its own config before it expands the sweeps: from the primary
    config's default options, with the overrides that are no sweeps (the defaults list
    skips sweep overrides, hydra/_internal/defaults_list.py), so `-m driver=optuna,mine
    driver.n_trials=5` sets n_trials on the grid driver too, and Hydra stops the sweep.
    """
    group, *path = override.key_or_group.split(".")
    if not path:
        return False  # a group's choice or a top-level setting
    swept = any(o.key_or_group == group and o.is_sweep_override() for o in overrides)
    cls = SPEC_FIELDS.get(".".join([group, *path[:-1]]))
    if cls is not None:
        if path[-1] not in {f.name for f in dataclasses.fields(cls)}:
            return False
        composed = [*_chosen_options(group, overrides, extra),
                    *(_default_options(group) if swept else [])]
        return not all(_has_key(group, option, path, extra) for option in composed)
    # Settings of other groups: check_setting_key has made sure each swept option has it.
    return (group in SETTING_GROUPS and swept
            and all(_has_key(group, o, path, extra)
                    for o in _chosen_options(group, overrides, extra))
            and not all(_has_key(group, o, path, extra) for o in _default_options(group)))


def _parsed(argv: Sequence[str]) -> tuple[argparse.Namespace, list[Override]]:
    """The command line as Hydra parses it: its arguments and overrides. A syntax error in
    an override, or a sweep (`model=a,b`) in a single run, is the user's: Hydra's own
    explanation, as a LayoutSearchError (status 2, not Hydra's 1)."""
    args = get_args_parser().parse_args(list(argv))
    parser = OverridesParser.create()
    overrides = []
    for item in args.overrides:
        try:
            overrides += parser.parse_overrides(overrides=[item])
        except HydraException as error:
            raise LayoutSearchError(f"{item}: {str(error).strip()}") from None
    sweeps = [o.input_line for o in overrides if o.is_sweep_override()]
    multirun = args.multirun or any(o.key_or_group == "hydra.mode" and o.value() == "MULTIRUN"
                                    for o in overrides)
    if sweeps and not multirun:
        raise LayoutSearchError(
            f"{sweeps[0]}: a sweep over values needs --multirun (-m); for one run with a list "
            "use key=[a,b], for a text with a comma quote it: key='a,b'")
    for override in overrides:
        # A glob's options are known only with the group's folders (check_group_choices).
        if (override.is_discrete_sweep() and override.value_type is not
                ValueType.GLOB_CHOICE_SWEEP and next(override.sweep_string_iterator(), None)
                is None):
            raise LayoutSearchError(
                f"{override.input_line}: the sweep has no values, so no job would run; "
                "range(start, stop, step) stops before stop, e.g. range(8, 65, 8) is 8 to 64")
    return args, overrides


def settable_spec_fields(argv: Sequence[str]) -> list[str]:
    """`argv` with `model.X=v` made `++model.X=v` where a YAML Hydra sets it on leaves X out.

    The catalog's YAML files spell out the fields that differ between models and leave
    the rest to the spec's defaults, so Hydra's struct mode would refuse to set those
    (`model.position_embedding_type=rope`); `++` sets a key whether or not it is there.
    A sweep also has Hydra set it on the group's default option (`_left_to_defaults`).
    """
    args, overrides = _parsed(argv)
    given = dict(zip(args.overrides, overrides, strict=True))
    extra = user_config_folders(args, overrides) or ()
    return [f"++{item}" if item in given and given[item].type is OverrideType.CHANGE
            and _left_to_defaults(given[item], overrides, extra) else item for item in argv]


def check_key(override: Override, known: Mapping[str, list[str]]) -> None:
    """Reject a setting that no config has (`num_gpu=64`, `model.vocab=1`), naming the closest.

    Adding a key below a config (`+model.foo=1`) is left to that config to judge; adding
    one at the top (`+num_gpu=32`) is refused here, as nothing would read it.
    """
    key = override.key_or_group
    parent, _, name = key.rpartition(".")
    top = key.split(".")[0].split("/")[0]
    if top == "hydra" or override.type is OverrideType.DEL:
        return
    if parent and top not in known[""]:
        # Below no setting at all (job.num_gpus=8): Hydra would refuse it with status 1 and
        # hint at +job.num_gpus=8, which nothing reads.
        own = f"; {name} is a setting of its own: {name}=..." if name in known[""] else ""
        raise LayoutSearchError(f"{key}: " + unknown_name_message("setting", top, known[""])
                                + own)
    adds_top_level = override.type in (OverrideType.ADD, OverrideType.FORCE_ADD) and not parent
    if override.type is not OverrideType.CHANGE and not adds_top_level:
        return
    if parent in known and name not in known[parent]:
        where = f"{parent} field" if parent else "setting"
        hint = f"; {DP_IS_DERIVED}" if key == "search_spaces.dp" else ""
        raise LayoutSearchError(unknown_name_message(where, name, known[parent]) + hint)


def user_config_folders(args: argparse.Namespace,
                        overrides: Sequence[Override]) -> list[Path] | None:
    """The config folders the command adds (`--config-dir`, `hydra.searchpath=[...]` of
    plain, `file://` or `pkg://` paths); None where one cannot be listed (a `pkg://` entry
    not on disk, another scheme)."""
    entries = [args.config_dir] if args.config_dir else []
    for override in overrides:
        if override.key_or_group == "hydra.searchpath":
            value = override.value()
            entries += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    folders = []
    for entry in entries:
        folder = (package_folder(entry.removeprefix("pkg://")) if entry.startswith("pkg://")
                  else None if "://" in entry and not entry.startswith("file://")
                  else Path(entry.removeprefix("file://")).expanduser())
        if folder is None:
            return None
        folders.append(folder)
    return folders


def check_group_choices(argv: Sequence[str]) -> None:
    """Reject an unknown option of a group (`model=llama13b`) or an unknown setting
    (`num_gpu=64`) with the closest valid name.

    Hydra would report them too, but with status 1 and no suggestion (and `+num_gpu=128`,
    which Hydra's own hint suggests, would be silently ignored). Options and settings in
    the user's config folders (`--config-dir`, `hydra.searchpath=`) count as valid; a
    search path that cannot be listed (a `pkg://` package not found on disk) leaves the
    option names to Hydra, and a primary config of the user's own (`--config-name`) leaves
    everything to it.
    """
    args, overrides = _parsed(argv)
    if args.config_name not in (None, CONFIG_NAME):
        return
    extra = user_config_folders(args, overrides)
    known = _known_keys()
    chosen = {group: _chosen_settings(group, overrides, extra or ())
              for group in SETTING_GROUPS}
    for override in overrides:
        check_key(override, known)
        if extra is None or override.key_or_group not in GROUP_DIRS or (
                override.type is OverrideType.DEL):
            continue
        options = group_options(override.key_or_group, extra)
        if override.value() in (None, ""):
            group = override.key_or_group
            raise LayoutSearchError(f"{group}={override.value() or 'null'}: a {group} must be "
                                    f"chosen; options: {', '.join(options)}")
        choices = list(_group_choices(override, options))
        if not choices and override.value_type is ValueType.GLOB_CHOICE_SWEEP:
            # Hydra would launch no job and exit 0, as if the sweep had run. (A mapping,
            # `model={num_layers: 48}`, sets the default option's keys: it chooses none.)
            raise LayoutSearchError(
                f"{override.input_line}: matches no {override.key_or_group} option, so no job "
                f"would run; options: {', '.join(offered_options(override.key_or_group, extra))}")
        for choice in choices:
            if choice not in options:
                raise LayoutSearchError(unknown_name_message(
                    override.key_or_group, choice, offered_options(override.key_or_group, extra)
                ))
    # After the options are known to exist: a misspelled one is named as such.
    if extra is None:
        return
    check_option_files(overrides, extra)
    for override in overrides:
        for group, swept in chosen.items():
            check_setting_key(override, group, swept, extra)


OUTPUT_DIRS = ("hydra.run.dir", "hydra.sweep.dir")
"""Where Hydra writes a run's or a sweep's outputs: folders it makes."""


def check_output_dirs(argv: Sequence[str]) -> None:
    """Refuse an output folder that cannot be made (it, or the nearest existing folder
    above it, is a file or cannot be written in), before Hydra fails to make it with a
    traceback; one written with `${...}` is Hydra's to resolve."""
    _, overrides = _parsed(argv)
    for override in overrides:
        if override.key_or_group not in OUTPUT_DIRS or override.is_sweep_override():
            continue
        value = override.value()
        if not isinstance(value, str) or "${" in value:
            continue
        path = Path(value).expanduser()
        existing = next(p for p in (path, *path.parents)
                        if p.exists() or p.is_symlink() or p == Path("."))
        where = f"{override.key_or_group}={value}"
        if existing.is_symlink() and not existing.exists():
            raise LayoutSearchError(f"{where}: {existing} is a symbolic link to "
                                    f"{os.readlink(existing)}, which does not exist; make that "
                                    "folder, or name another")
        if not existing.is_dir():
            named = "is a file" if existing == path else f"lies under {existing}, a file"
            raise LayoutSearchError(f"{where}: {named}; the outputs go into a folder (name a "
                                    "new or existing folder)")
        if existing != path and not os.access(existing, os.W_OK | os.X_OK):
            raise LayoutSearchError(f"{where}: cannot make it: {existing} is not writable; "
                                    "name a folder where you may write")


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


if __name__ == "__main__":
    main()
