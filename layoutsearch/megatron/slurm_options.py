"""The user's Slurm settings (`megatron.slurm`, in submitit's names) for both Slurm paths.

One mapping drives the Slurm launcher, which hands it to submitit's AutoExecutor, and the
dry run's sbatch scripts, which turn it into `#SBATCH` lines the way submitit does
(submitit 1.5, `slurm/slurm.py`: `_equivalence_dict`, `_make_sbatch_string`):
- submitit's generic names: name → --job-name, timeout_min → --time (minutes),
  mem_gb → --mem (whole GB as `<n>GB`, else `<n>MB`), cpus_per_task → --cpus-per-task;
- `slurm_<option>` → --<option>, underscores to dashes (slurm_partition → --partition); a
  Slurm-specific name wins over the generic one it shadows (slurm_time over timeout_min);
- `slurm_additional_parameters`: one option per entry, applied last (as in submitit);
- `slurm_setup` / `slurm_teardown`: the user's shell lines, run before / after the training;
- submitit's own mechanics (signal_delay_s, array_parallelism, srun_args, use_srun,
  stderr_to_stdout) have no sbatch option: a plain script leaves them out, except
  `slurm_srun_args`, which its srun line carries as submitit's does (`srun_options`);
- false leaves an option out. A script without --time gets the partition's default limit;
  submitit always writes a --time, so the Slurm launcher then asks for the trial's own limit
  (`scripts.trial_time_limit_s`), the one the local launcher waits for.
Other names without `slurm_` are refused (submitit refuses or ignores them), as are values of
the wrong type for a generic name. The job's shape (nodes, tasks and GPUs per node) is the
layout's: a setting of it is refused too.

    options = sbatch_options(settings.slurm)   # {"partition": ("slurm_partition", "gpu")}
    parameters = submitit_parameters(settings.slurm, nodes=4, gpus_per_node=8,
                                     time_limit_s=2400, name="tp2_pp4")
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from layoutsearch.errors import LayoutSearchError

GENERIC_OPTIONS = {"name": "job-name", "timeout_min": "time", "mem_gb": "mem",
                   "cpus_per_task": "cpus-per-task"}
"""submitit's generic (cluster-independent) names and the sbatch option each becomes."""
GENERIC_TYPES: dict[str, tuple[type | tuple[type, ...], str]] = {
    "name": (str, "a string"), "timeout_min": (int, "a whole number of minutes"),
    "mem_gb": ((int, float), "a number of gigabytes"),
    "cpus_per_task": (int, "a whole number"), "nodes": (int, "a whole number"),
    "gpus_per_node": (int, "a whole number"), "tasks_per_node": (int, "a whole number"),
    "stderr_to_stdout": (bool, "true or false"),
}
"""submitit AutoExecutor's generic names and the types it asserts (auto.py)."""
POSITIVE = frozenset({"timeout_min", "mem_gb", "cpus_per_task"})
"""Generic names whose sbatch option (--time, --mem, --cpus-per-task) needs a value above 0."""
JOB_SHAPE = frozenset({"nodes", "tasks_per_node", "ntasks_per_node", "ntasks", "gpus_per_node",
                       "num_gpus", "gpus_per_task", "gpus"})
"""Names (without `slurm_`) that would change how many ranks run where: set by the layout."""
SCRIPT_LINES = ("setup", "teardown")
"""`slurm_setup` / `slurm_teardown`: lists of shell lines, not options."""
LIST_SETTINGS = {"setup": "a list of shell lines, e.g. ['module load cuda']",
                 "teardown": "a list of shell lines, e.g. ['echo done']",
                 "srun_args": "a list of srun options, e.g. ['--cpu-bind=none']"}
"""Settings that are lists of strings (a string would be split into its characters)."""
SUBMITIT_ONLY = frozenset({"signal_delay_s", "array_parallelism", "srun_args", "use_srun",
                           "stderr_to_stdout"})
"""submitit settings with no sbatch option of their own."""
SBATCH_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
"""sbatch's --time forms: minutes[:seconds], hours:minutes:seconds and
days-hours[:minutes[:seconds]]."""


def _bare(key: str) -> str:
    return key.removeprefix("slurm_")


def _check_type(key: str, value: Any) -> None:
    # AutoExecutor asserts these types when a trial is submitted; say so before any launch.
    expected = GENERIC_TYPES.get(_bare(key))
    if expected is None or value is None:
        return
    kinds, words = expected
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise LayoutSearchError(f"megatron.slurm.{key}={value!r}: must be {words}")
    if key in POSITIVE and isinstance(value, int | float) and not 0 < value < math.inf:
        # submitit passes it on; sbatch refuses the job at submission, after the search. A
        # NaN or infinite mem_gb has no whole megabytes (_mem): it failed as scripts were written.
        rule = f"{words} above 0" if value <= 0 else f"a finite {words.removeprefix('a ')}"
        raise LayoutSearchError(f"megatron.slurm.{key}={value!r}: must be {rule}")


SBATCH_SPECIAL = re.compile(r'[\s"\\#]')
"""What sbatch's own parser of #SBATCH lines treats specially (src/sbatch/opt.c,
_get_argument): whitespace ends a value outside double quotes, `\\` escapes, `"` toggles
quoting and an unescaped `#` starts a comment even inside quotes. It is no shell: a single
quote is a literal character."""


def sbatch_quote(text: str) -> str:
    """A value as sbatch reads it back: bare when plain, else double-quoted with `\\`, `"`
    and `#` escaped."""
    if not SBATCH_SPECIAL.search(text):
        return text
    return '"' + re.sub(r'(["\\#])', r"\\\1", text) + '"'


def _check_option_value(shown: str, value: Any) -> None:
    # One sbatch option: a string, a number, or a boolean (a bare flag / left out).
    if not isinstance(value, str | int | float):  # bool is an int
        raise LayoutSearchError(
            f"megatron.slurm.{shown}={value!r}: an sbatch option takes a string, a number or a "
            "boolean (a bare flag); only slurm_additional_parameters may be a mapping")
    if isinstance(value, str) and ("\n" in value or "\r" in value):
        raise LayoutSearchError(
            f"megatron.slurm.{shown}={value!r}: an sbatch option is one line of the script; "
            "remove the line break")
    if _bare(shown.rpartition(".")[2]) == "time" and value is not False:
        sbatch_seconds(shown, value)  # refuses what is not an sbatch time


def check_slurm_settings(slurm: Mapping[str, Any]) -> None:
    """Refuse what submitit or sbatch would refuse or ignore, and anything that would launch
    another job than the layout's, naming the setting: once, for both Slurm paths."""
    for key, value in slurm.items():
        key = str(key)
        if value is None:
            continue  # unset
        if key not in GENERIC_TYPES and not key.startswith("slurm_"):
            raise LayoutSearchError(
                f"megatron.slurm.{key}={value!r}: submitit takes Slurm options as slurm_<name> "
                f"(e.g. slurm_{key}) or as its generic names ({', '.join(GENERIC_TYPES)})")
        bare = _bare(key)
        if bare == "additional_parameters" and not isinstance(value, Mapping):
            raise LayoutSearchError(
                f"megatron.slurm.{key}={value!r}: must be a mapping of sbatch option to "
                "value, e.g. {reservation: my_reservation}")
        # Each option as shown to the user, and its name as submitit reads it.
        options = ({f"{key}.{k}": (str(k).replace("-", "_"), v) for k, v in value.items()
                    if v is not None} if bare == "additional_parameters" else {key: (bare, value)})
        for shown, (name, option) in options.items():
            if name in JOB_SHAPE:
                raise LayoutSearchError(
                    f"megatron.slurm.{shown}: the nodes, tasks and GPUs per node follow from "
                    "the layout (num_gpus and gpus_per_node); leave it out")
            if name not in SCRIPT_LINES and name not in SUBMITIT_ONLY:
                _check_option_value(shown, option)
        _check_type(key, value)
        if bare in LIST_SETTINGS and (not isinstance(value, Sequence) or isinstance(
                value, str) or not all(isinstance(item, str) for item in value)):
            raise LayoutSearchError(
                f"megatron.slurm.{key}={value!r}: must be {LIST_SETTINGS[bare]}")


def _mem(value: Any) -> str:
    # submitit's _convert_mem: whole gigabytes as GB, else megabytes.
    gb = float(value)
    return f"{int(gb)}GB" if gb == int(gb) else f"{int(gb * 1024)}MB"


def sbatch_options(slurm: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """The user's options as sbatch option → (setting name, value), None values left out.

    In submitit's order: a Slurm-specific name wins over the generic one for the same
    option, and slurm_additional_parameters win over both.
    """
    options: dict[str, tuple[str, Any]] = {}
    generic = [k for k in slurm if str(k) in GENERIC_OPTIONS]
    additional = [k for k in slurm if _bare(str(k)) == "additional_parameters"]
    specific = [k for k in slurm if k not in generic and k not in additional]
    for key in [*generic, *specific, *additional]:
        value, bare = slurm[key], _bare(str(key))
        if value is None or bare in SCRIPT_LINES or bare in SUBMITIT_ONLY:
            continue  # None is unset, as submitit reads it
        if bare in GENERIC_OPTIONS:
            options[GENERIC_OPTIONS[bare]] = (str(key), _mem(value) if bare == "mem_gb"
                                              else value)
        elif bare == "additional_parameters":  # a mapping (check_slurm_settings)
            for inner, inner_value in value.items():
                if inner_value is not None:
                    options[str(inner).replace("_", "-")] = (f"{key}.{inner}", inner_value)
        else:
            options[bare.replace("_", "-")] = (str(key), value)
    return options


def script_lines(slurm: Mapping[str, Any], part: str) -> list[str]:
    """The user's `slurm_setup` or `slurm_teardown` shell lines (checked to be strings)."""
    return [str(line) for line in slurm.get(f"slurm_{part}") or ()]


def whole_minutes(seconds: float) -> int:
    """A time limit in Slurm's whole minutes, rounded up (at least one): never shorter."""
    return max(1, math.ceil(seconds / 60))


def sbatch_seconds(setting: str, value: Any) -> float | None:
    """Seconds (s) of an sbatch --time value (a number is minutes); None for no limit."""
    text = str(value).strip() if isinstance(value, str | int) and value is not True else ""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    match = SBATCH_TIME.fullmatch(text)
    if match is None:
        raise LayoutSearchError(
            f"megatron.slurm.{setting}={value!r}: not an sbatch time; use minutes, "
            "minutes:seconds, hours:minutes:seconds or days-hours[:minutes[:seconds]]")
    days, *rest = match.groups()
    fields = [int(part) for part in rest if part is not None]
    # With a day count the fields start at hours; without one, a lone field is minutes.
    units = (3600, 60, 1) if days is not None else {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[
        len(fields)]
    seconds = int(days or 0) * 86400 + sum(f * u for f, u in zip(fields, units, strict=False))
    return seconds or None  # 0 asks Slurm for no limit


def check_submitit_values(slurm: Mapping[str, Any]) -> None:
    """Refuse sbatch values that submitit would garble, naming the setting.

    submitit writes `#SBATCH --name=<shlex.quote(value)>`, but sbatch's reader is no shell: it
    keeps the single quotes in the value. Only values shlex leaves bare arrive intact.
    """
    for key, value in slurm.items():
        bare = _bare(str(key))
        if value is None or bare in SUBMITIT_ONLY or bare in SCRIPT_LINES:
            continue  # None is unset (a null slurm_additional_parameters has no items)
        values = (value.items() if bare == "additional_parameters"
                  else [(None, value)])
        for inner, option in values:
            if isinstance(option, str) and shlex.quote(option) != option:
                shown = key if inner is None else f"{key}.{inner}"
                raise LayoutSearchError(
                    f"megatron.slurm.{shown}={option!r}: submitit would write it in single "
                    "quotes, which sbatch keeps as part of the value; use launcher=dry_run to "
                    "write sbatch scripts (quoted for sbatch) and submit them, or a value of "
                    "letters, digits and @%+=:,./-_ only")


SLURM_DEFAULTS: dict[str, Any] = {"slurm_exclusive": True}
"""What a trial asks of Slurm unless the user says otherwise: whole nodes, for their CPUs
(Slurm's default is one CPU per task, shared by torchrun's ranks) and so that no neighbour
slows the step time being measured. `slurm_exclusive: false` leaves it out."""


KILL_ON_BAD_EXIT = "--kill-on-bad-exit=1"
"""srun's option that ends a step's other tasks once one exits with an error. Without it a
node whose ranks fail (out of memory on one pipeline stage) leaves the others' ranks
waiting in NCCL collectives until their timeout (10 minutes by Megatron-LM's
--distributed-timeout-minutes), holding every node of the job; torchrun's c10d rendezvous
does not stop them."""


def srun_options(slurm: Mapping[str, Any]) -> list[str]:
    """The options of the srun that starts torchrun on every node, on both Slurm paths:
    KILL_ON_BAD_EXIT, then the user's `slurm_srun_args` (as submitit places them)."""
    return [KILL_ON_BAD_EXIT, *(str(arg) for arg in slurm.get("slurm_srun_args") or ())]


def with_slurm_defaults(slurm: Mapping[str, Any]) -> dict[str, Any]:
    """The user's Slurm settings over SLURM_DEFAULTS: one policy for scripts and submitit."""
    return {**SLURM_DEFAULTS, **slurm}


def submitit_parameters(slurm: Mapping[str, Any], *, nodes: int, gpus_per_node: int,
                        time_limit_s: float, name: str,
                        first_lines: Sequence[str] = ()) -> dict[str, Any]:
    """AutoExecutor.update_parameters keywords: the job's shape and time, then the user's.

    A time or name the user set wins (as in the sbatch scripts); the time limit is rounded
    up to whole minutes, so that the run is never cut shorter than `time_limit_s`.
    `first_lines` run before the user's `slurm_setup` lines, as in the sbatch scripts.
    """
    check_submitit_values(slurm)
    user: dict[str, Any] = {}
    for key, value in with_slurm_defaults(slurm).items():
        key = str(key)
        if value is None or (value is False and _bare(key) not in SUBMITIT_ONLY):
            continue  # unset; False leaves an sbatch option out (submitit would write =False)
        if _bare(key) == "additional_parameters":
            value = {k: v for k, v in value.items() if v is not None and v is not False}
        user[key] = value
    user.pop("slurm_srun_args", None)
    user["slurm_setup"] = [*first_lines, *script_lines(slurm, "setup")]
    return {
        "nodes": nodes, "tasks_per_node": 1, "gpus_per_node": gpus_per_node,
        "timeout_min": whole_minutes(time_limit_s), "name": name, **user,
        "slurm_srun_args": srun_options(slurm),
    }
