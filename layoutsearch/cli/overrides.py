"""The `layoutsearch` command line before Hydra sees it: checked, and made settable.

Hydra reports a misspelt option or setting with status 1, no suggestion and a hint that
nothing reads (`+num_gpu=128`); these checks name the closest valid name instead, find
broken option files and output folders that cannot be made, and turn `model.X=v` into
`++model.X=v` where the chosen YAML leaves X to the spec's defaults. They read the command
line with Hydra's own parser, so they live beside the application (`layoutsearch.cli`).

    check_group_choices(["model=llama13b"])  # LayoutSearchError: ... did you mean 'llama_13b'?
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import yaml
from hydra._internal.utils import get_args_parser  # Hydra's own argv parser (stable in 1.3)
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, Override, OverrideType, ValueType
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from layoutsearch.catalog import CLUSTER_DIR, MODEL_DIR
from layoutsearch.costs.constants import config_target
from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.paths import config_dir, option_mapping, package_folder, unwritable_folder
from layoutsearch.space import DP_IS_DERIVED, SearchSpace
from layoutsearch.specs import ClusterSpec, GPUSpec, ModelSpec

CONF_DIR = Path(__file__).parent.parent / "conf"
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
    # Hydra's own settings (hydra.*) are Hydra's to check, and no setting of the search.
    known[""] = sorted({*primary, *GROUP_DIRS} - {"defaults", "hydra"})
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
    name, *below = key.split(".")[1:]
    if below:
        # Below a setting that holds one value (cost_models.megatron, a name): Hydra would
        # stop with "Key ... is not in struct".
        for option in chosen:
            value = _node(group, option, [name], extra)
            if value is not ABSENT and not isinstance(value, dict):
                hint = (_megatron_fields_hint(f"{group}.{name}", below[0])
                        if name == "megatron" else "")
                raise LayoutSearchError(
                    f"{key}: {group}.{name} holds one value ({group}={option} sets "
                    f"{value!r}), not settings of its own{hint}; set {group}.{name}=...")
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


ABSENT = object()
"""What `_node` returns for a key the YAML does not spell out."""


def _node(group: str, option: str, path: Sequence[str], extra: Sequence[Path] = ()) -> Any:
    """The value the YAML of `option` holds at `path` below the group (ABSENT: none)."""
    node: Any = _option_config(group, option, extra)
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return ABSENT
        node = node[key]
    return node


def _has_key(group: str, option: str, path: Sequence[str],
             extra: Sequence[Path] = ()) -> bool:
    """Whether the YAML of `option` spells out the key at `path` below the group."""
    return _node(group, option, path, extra) is not ABSENT


def check_value_shape(override: Override, overrides: Sequence[Override],
                      extra: Sequence[Path] = ()) -> None:
    """Refuse a mapping for a setting that holds a list (`search_spaces.tp={a: 1}`) or a list
    for one that holds settings of its own (`cluster.gpu=[1]`): Hydra would stop with status
    1 and "Cannot merge DictConfig with ListConfig"."""
    value = override.value() if override.type is OverrideType.CHANGE else None
    group, *path = override.key_or_group.split(".")
    if not isinstance(value, dict | list) or group not in GROUP_DIRS or not path:
        return
    for option in _chosen_options(group, overrides, extra):
        node = _node(group, option, path, extra)
        if isinstance(node, list) and isinstance(value, dict):
            raise LayoutSearchError(
                f"{override.input_line}: {override.key_or_group} holds a list in "
                f"{group}={option}, not settings of its own; give a list, e.g. "
                f"{override.key_or_group}=[...]")
        if isinstance(node, dict) and isinstance(value, list):
            first = next(iter(node), "<name>")
            raise LayoutSearchError(
                f"{override.input_line}: {override.key_or_group} holds settings of its own in "
                f"{group}={option} ({', '.join(map(str, node))}), not a list; set them by "
                f"name, e.g. {override.key_or_group}.{first}=...")


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
    _check_nesting(key, known)
    adds_top_level = override.type in (OverrideType.ADD, OverrideType.FORCE_ADD) and not parent
    if override.type is not OverrideType.CHANGE and not adds_top_level:
        return
    if parent in known and name not in known[parent]:
        where = f"{parent} field" if parent else "setting"
        hint = f"; {DP_IS_DERIVED}" if key == "search_spaces.dp" else ""
        raise LayoutSearchError(unknown_name_message(where, name, known[parent]) + hint)


def _megatron_fields_hint(setting: str, field: str) -> str:
    """How to set one field of Megatron-LM settings from the command line: Hydra cannot
    reach below a setting that holds a name, so the fields go in as a mapping."""
    return (f" (the name or YAML path of Megatron-LM settings, or a mapping of them: "
            f"'{setting}={{{field}:...}}' sets {field} and leaves the other fields at their "
            f"defaults; to keep a file's, set it in a copy of that file)")


def _check_nesting(key: str, known: Mapping[str, list[str]]) -> None:
    """Reject a key below a setting that holds one value (`megatron.log_dir=.`,
    `search_spaces.tp.x=1`) or below a field a spec does not have (`model.foo.bar=1`):
    Hydra would stop with status 1 ("Key 'foo' is not in struct") or a traceback. Keys
    below the groups whose options differ in their keys (cost_models, driver) are left to
    check_setting_key and Hydra."""
    segments = key.split(".")
    if len(segments) < 2:
        return
    if segments[0] not in GROUP_DIRS:
        hint = _megatron_fields_hint(segments[0], segments[1]) if segments[0] == "megatron" \
            else ""
        raise LayoutSearchError(f"{key}: {segments[0]} holds one value, not settings of its "
                                f"own{hint}; set {segments[0]}=...")
    node = segments[0]
    for segment in segments[1:-1]:
        if node not in known:
            return  # an option's own keys
        if segment not in known[node]:
            raise LayoutSearchError(f"{key}: " + unknown_name_message(f"{node} field", segment,
                                                                       known[node]))
        child = f"{node}.{segment}"
        if child not in known:
            raise LayoutSearchError(f"{key}: {child} holds one value, not settings of its "
                                    f"own; set {child}=...")
        node = child


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
        check_value_shape(override, overrides, extra)


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
        problem = unwritable_folder(value)
        if problem:
            raise LayoutSearchError(f"{override.key_or_group}={value}: {problem}")
