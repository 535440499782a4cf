"""Launch scripts for a Megatron-LM command: torchrun on one node, sbatch for several.

Every user-given value reaches the script through `shlex.quote`/`shlex.join`; nothing is
pasted into a shell string unquoted. A one-node job gets a bash script that runs torchrun;
a multi-node job gets an sbatch script that starts one torchrun per node with `srun`, all
meeting at a c10d rendezvous on the first node of the allocation (Slurm's variables).

    path = write_script(command, settings, Path("run_01.sh"), label="tp2 pp4 dp16 mb1")
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from layoutsearch.errors import LayoutSearchError
from layoutsearch.megatron.args import MegatronCommand
from layoutsearch.megatron.settings import MegatronSettings

STARTUP_ALLOWANCE_S = 600.0
"""Seconds (s) a job spends before its first step: process start, NCCL init and model build.
The predicted step time leaves them out; without them a run sized to its steps is killed."""

SBATCH_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
"""sbatch's --time forms: minutes[:seconds], hours:minutes:seconds and
days-hours[:minutes[:seconds]]."""


def torchrun_argv(command: MegatronCommand, settings: MegatronSettings, *,
                  master_addr: str = "localhost", node_rank: int = 0) -> list[str]:
    """The full argv of one node's torchrun (single-node form, explicit rank and master)."""
    return [
        *settings.launch_prefix(),
        "--nproc_per_node", str(command.nproc_per_node),
        "--nnodes", str(command.nodes),
        "--node_rank", str(node_rank),
        "--master_addr", master_addr,
        "--master_port", str(settings.master_port),
        str(settings.script_path),
        *command.argv,
    ]


def _exports(env: Mapping[str, str]) -> list[str]:
    return [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]


def _header(command: MegatronCommand, label: str) -> list[str]:
    lines = [f"# layoutsearch: {label}" if label else "# layoutsearch launch script"]
    lines += [f"# caveat: {note}" for note in command.notes]
    return lines


def torchrun_script(command: MegatronCommand, settings: MegatronSettings,
                    label: str = "") -> str:
    """A bash script that runs the command with torchrun on this node."""
    return "\n".join([
        "#!/usr/bin/env bash",
        *_header(command, label),
        "set -euo pipefail",
        *_exports(command.env),
        shlex.join(torchrun_argv(command, settings)),
        "",
    ])


def predicted_run_s(settings: MegatronSettings, step_time_s: float) -> float:
    """Seconds (s) one run needs: `train_iters` steps of `step_time_s` plus the start-up."""
    if not (math.isfinite(step_time_s) and step_time_s > 0):
        raise LayoutSearchError(
            f"step_time_s={step_time_s!r}: must be a positive, finite number of seconds")
    return settings.train_iters * step_time_s + STARTUP_ALLOWANCE_S


def _clock(seconds: float) -> str:
    """An sbatch --time of whole minutes, rounded up (at least one): HH:MM:00."""
    minutes = max(1, math.ceil(seconds / 60))
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _sbatch_seconds(setting: str, value: Any) -> float | None:
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


def _sbatch_name(key: str) -> str:
    # submitit-style names (slurm_partition) become sbatch options (--partition).
    return key.removeprefix("slurm_").replace("_", "-")


def _slurm_options(slurm: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """The user's Slurm settings as sbatch option -> (setting name, value), with submitit's
    pass-through mapping `slurm_additional_parameters` spread into one option per entry."""
    options: dict[str, tuple[str, Any]] = {}
    for key, value in slurm.items():
        name = _sbatch_name(str(key))
        if value is None:
            continue  # unset, as submitit reads None: the default (if any) stays
        if name != "additional-parameters":
            options[name] = (str(key), value)
            continue
        if not isinstance(value, Mapping):
            raise LayoutSearchError(
                f"megatron.slurm.{key}={value!r}: must be a mapping of sbatch option to value, "
                "e.g. {reservation: my_reservation}")
        for inner, inner_value in value.items():
            if inner_value is None:
                continue
            options[_sbatch_name(str(inner))] = (f"{key}.{inner}", inner_value)
    return options


def _directive(name: str, setting: str, value: Any) -> list[str]:
    """One `#SBATCH` line: True is a bare flag (--exclusive); False leaves the option out."""
    if value is True:
        return [f"#SBATCH --{name}"]
    if value is False:
        return []
    if isinstance(value, str | int | float):
        return [f"#SBATCH --{name}={shlex.quote(str(value))}"]
    raise LayoutSearchError(
        f"megatron.slurm.{setting}={value!r}: an sbatch option takes a string, a number or a "
        "boolean (a bare flag); only slurm_additional_parameters may be a mapping")


def _time_warning(setting: str, value: Any, settings: MegatronSettings,
                  step_time_s: float | None) -> list[str]:
    """A comment when the user's own Slurm time is below the predicted run."""
    if step_time_s is None or value is False:
        return []  # no prediction, or no --time line: the partition's default limit applies
    limit_s = _sbatch_seconds(setting, value)
    needed_s = predicted_run_s(settings, step_time_s)
    if limit_s is None or limit_s >= needed_s:
        return []
    return [f"# warning: {setting}={value} ({_clock(limit_s)}) is below the predicted run "
            f"time {_clock(needed_s)} "
            f"({settings.train_iters} iterations x {step_time_s:.1f} s + "
            f"{STARTUP_ALLOWANCE_S:.0f} s start-up); Slurm may kill the job before it ends"]


def sbatch_script(command: MegatronCommand, settings: MegatronSettings, label: str = "",
                  job_name: str = "layoutsearch", step_time_s: float | None = None) -> str:
    """An sbatch script: one torchrun per node, c10d rendezvous on the first node.

    The time limit is `timeout_s`, raised to the predicted run when `step_time_s` (the
    layout's predicted seconds per step) is given; a time in `slurm` wins, with a warning
    when it is shorter than the prediction.
    """
    limit_s = settings.timeout_s if step_time_s is None else max(
        settings.timeout_s, predicted_run_s(settings, step_time_s))
    options: dict[str, tuple[str, Any]] = {
        "job-name": ("job_name", job_name),
        "nodes": ("nodes", str(command.nodes)),
        "ntasks-per-node": ("ntasks_per_node", "1"),
        "gpus-per-node": ("gpus_per_node", str(command.nproc_per_node)),
        "time": ("timeout_s", _clock(limit_s)),
    }
    user = _slurm_options(settings.slurm)
    warning = _time_warning(*user["time"], settings, step_time_s) if "time" in user else []
    options.update(user)
    directives = [line for name, (setting, value) in options.items()
                  for line in _directive(name, setting, value)]
    torchrun = [
        *settings.launch_prefix(),
        "--nproc_per_node", str(command.nproc_per_node),
        "--nnodes", str(command.nodes),
        "--rdzv_backend", "c10d",
    ]
    # The rendezvous id and endpoint come from Slurm at run time, so they stay shell
    # variables; everything else is quoted literally.
    rendezvous = '--rdzv_id "$SLURM_JOB_ID" --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT"'
    tail = shlex.join([str(settings.script_path), *command.argv])
    return "\n".join([
        "#!/usr/bin/env bash",
        *directives,
        *_header(command, label),
        *warning,
        "set -euo pipefail",
        *_exports(command.env),
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"MASTER_PORT={settings.master_port}",
        "export MASTER_ADDR MASTER_PORT",
        f"srun --ntasks-per-node=1 {shlex.join(torchrun)} {rendezvous} {tail}",
        "",
    ])


def write_script(command: MegatronCommand, settings: MegatronSettings, path: Path,
                 label: str = "", step_time_s: float | None = None) -> Path:
    """Write the torchrun (one node) or sbatch (several) script; executable.

    `step_time_s`, the layout's predicted seconds per step, sizes the sbatch time limit;
    the torchrun script has none (it runs until torchrun ends).
    """
    text = (torchrun_script(command, settings, label) if command.nodes == 1
            else sbatch_script(command, settings, label, job_name=path.stem,
                               step_time_s=step_time_s))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path
