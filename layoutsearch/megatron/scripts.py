"""Launch scripts for a Megatron-LM command: torchrun on one node, sbatch for several.

Every user-given value reaches the script through `shlex.quote`/`shlex.join`; nothing is
pasted into a shell string unquoted. A one-node job gets a bash script that runs torchrun;
a multi-node job gets an sbatch script that starts one torchrun per node with `srun`, all
meeting at a c10d rendezvous on the first node of the allocation (Slurm's variables).
Either first moves into the Megatron-LM checkout, where the local launcher runs torchrun, so
that a script run from any folder reads and writes the same files as a local trial.

    path = write_script(command, settings, Path("run_01.sh"), label="tp2 pp4 dp16 mb1")
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from layoutsearch.errors import LayoutSearchError
from layoutsearch.megatron.args import MegatronCommand
from layoutsearch.megatron.settings import MegatronSettings
from layoutsearch.megatron.slurm_options import (
    sbatch_options,
    sbatch_quote,
    sbatch_seconds,
    script_lines,
    srun_options,
    whole_minutes,
    with_slurm_defaults,
)

DEFAULT_TIMEOUT_S = 1800.0
"""Seconds (s) a trial may run when neither the user nor a prediction says otherwise."""
STARTUP_ALLOWANCE_S = 600.0
"""Seconds (s) a job spends before its first step: process start, NCCL init and model build.
The predicted step time leaves them out; without them a run sized to its steps is killed."""

STEP_TIME_MARGIN = 1.5
"""A trial may run this much slower than its predicted step time before its limit kills
it: the analytic model's step times are ~5-10 % off on the cluster it was fitted on
(README, benchmarks/fidelity.py) and can be tens of % off on another one."""


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


def enter_checkout(settings: MegatronSettings) -> str:
    """The shell line that moves a launch into the Megatron-LM checkout, where the local
    launcher starts torchrun: relative paths in `extra_args` and `env` (`--save ckpt`)
    then name the same files however the run is started. `exit 1` stops a job
    whose checkout is missing even without `set -e` (submitit's sbatch scripts), before it
    runs anything in the wrong folder; Slurm would run the steps in /tmp instead."""
    return f"cd {shlex.quote(str(settings.checkout))} || exit 1"


def _exports(env: Mapping[str, str]) -> list[str]:
    return [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]


def _header(command: MegatronCommand, label: str) -> list[str]:
    lines = [f"# layoutsearch: {label}" if label else "# layoutsearch launch script"]
    lines += [f"# needs: {need}" for need in command.requires]
    lines += [f"# caveat: {note}" for note in command.notes]
    return lines


def torchrun_script(command: MegatronCommand, settings: MegatronSettings,
                    label: str = "") -> str:
    """A bash script that runs the command with torchrun on this node, in the checkout."""
    return "\n".join([
        "#!/usr/bin/env bash",
        *_header(command, label),
        "set -euo pipefail",
        enter_checkout(settings),
        *_exports(command.env),
        shlex.join(torchrun_argv(command, settings)),
        "",
    ])


def predicted_run_s(settings: MegatronSettings, step_time_s: float) -> float:
    """Seconds (s) one run may need: `train_iters` steps of `step_time_s`, with the
    STEP_TIME_MARGIN, plus the start-up."""
    if not (math.isfinite(step_time_s) and step_time_s > 0):
        raise LayoutSearchError(
            f"step_time_s={step_time_s!r}: must be a positive, finite number of seconds")
    return settings.train_iters * step_time_s * STEP_TIME_MARGIN + STARTUP_ALLOWANCE_S


def trial_time_limit_s(settings: MegatronSettings, step_time_s: float | None) -> float:
    """Wall-clock limit (s) of one trial: the user's `timeout_s` as given; without one,
    DEFAULT_TIMEOUT_S raised to the predicted run when the layout's predicted seconds per
    step are known, so that a slow but healthy layout is not recorded as a hang."""
    if settings.timeout_s is not None:
        return settings.timeout_s
    if step_time_s is None:
        return DEFAULT_TIMEOUT_S
    return max(DEFAULT_TIMEOUT_S, predicted_run_s(settings, step_time_s))


def _clock(seconds: float) -> str:
    """An sbatch --time of whole minutes, rounded up (at least one): HH:MM:00."""
    minutes = whole_minutes(seconds)
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _directive(name: str, value: Any) -> list[str]:
    """One `#SBATCH` line: True is a bare flag (--exclusive); False leaves the option out."""
    if value is True:
        return [f"#SBATCH --{name}"]
    if value is False:
        return []
    return [f"#SBATCH --{name}={sbatch_quote(str(value))}"]  # checked: one line of text


def _time_warning(setting: str, value: Any, limit_s: float | None,
                  settings: MegatronSettings, step_time_s: float | None) -> list[str]:
    """A comment when a time limit the user set is below the predicted run."""
    if step_time_s is None or limit_s is None:
        return []
    needed_s = predicted_run_s(settings, step_time_s)
    if limit_s >= needed_s:
        return []
    return [f"# warning: {setting}={value} ({_clock(limit_s)}) is below the predicted run "
            f"time {_clock(needed_s)} ({settings.train_iters} iterations x "
            f"{step_time_s:.1f} s x {STEP_TIME_MARGIN} margin + {STARTUP_ALLOWANCE_S:.0f} s "
            "start-up); Slurm may kill the job before it ends"]


def _time_limit(user: Mapping[str, tuple[str, Any]], settings: MegatronSettings,
                step_time_s: float | None) -> tuple[Any, list[str]]:
    """The --time line's value, and a warning naming the user's setting when it is short: a
    time in `slurm` wins, then an explicit `timeout_s`, then the automatic limit."""
    if "time" in user:
        setting, value = user["time"]
        # False: no --time line, the partition's default limit applies.
        limit_s = None if value is False else sbatch_seconds(setting, value)
    else:
        setting, value = "timeout_s", _clock(trial_time_limit_s(settings, step_time_s))
        limit_s = settings.timeout_s
    return value, _time_warning(setting, value, limit_s, settings, step_time_s)


def sbatch_script(command: MegatronCommand, settings: MegatronSettings, label: str = "",
                  job_name: str = "layoutsearch", step_time_s: float | None = None) -> str:
    """An sbatch script: one torchrun per node, c10d rendezvous on the first node.

    The time limit is `trial_time_limit_s`; a time in `slurm` wins. Either, set by the user
    and shorter than the predicted run, gets a warning. The job moves into the checkout
    first; the user's `slurm_setup` lines run there next, before the command's environment
    is exported, `slurm_teardown` lines after torchrun.
    """
    user = sbatch_options(with_slurm_defaults(settings.slurm))
    time_value, warning = _time_limit(user, settings, step_time_s)
    options: dict[str, Any] = {
        "job-name": job_name,
        "nodes": str(command.nodes),
        "ntasks-per-node": "1",
        "gpus-per-node": str(command.nproc_per_node),
        "time": time_value,  # the user's own, when `user` has one
        **{name: value for name, (_, value) in user.items()},
    }
    directives = [line for name, value in options.items() for line in _directive(name, value)]
    srun = ["srun", "--ntasks-per-node=1", *srun_options(settings.slurm)]
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
        # The whole job runs in the checkout, setup lines and srun's steps (which start in
        # the folder srun is called from) alike, as in the slurm launcher.
        enter_checkout(settings),
        # The user's setup lines first: a module or an activate script may export NCCL or
        # CUDA settings of its own, and the command's must win, as in the slurm launcher.
        *_lenient(script_lines(settings.slurm, "setup")),
        *_exports(command.env),
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"MASTER_PORT={settings.master_port}",
        "export MASTER_ADDR MASTER_PORT",
        *_then_teardown(f"{shlex.join(srun)} {shlex.join(torchrun)} {rendezvous} {tail}",
                        _lenient(script_lines(settings.slurm, "teardown"))),
        "",
    ])


def _lenient(lines: list[str]) -> list[str]:
    """The user's shell lines with unset variables allowed while they run: conda's
    activation scripts and environment-module files read variables such as PS1 that a batch
    shell leaves unset, and fail under `set -u` (conda/conda#3200, #8186). A failing line
    still stops the script (`set -e` stays on)."""
    if not lines:
        return []
    return ["set +u  # the user's lines below may read unset variables", *lines, "set -u"]


def _then_teardown(run: str, teardown: list[str]) -> list[str]:
    """The run line, followed by the user's teardown lines even when the run fails (as
    submitit's scripts do), the script still exiting with the run's status."""
    if not teardown:
        return [run]
    return ["status=0", f"{run} || status=$?", *teardown, 'exit "$status"']


def needs_sbatch(command: MegatronCommand, settings: MegatronSettings) -> bool:
    """Whether the command is launched by an sbatch script rather than torchrun on this
    node: it runs on several nodes, or the settings are for Slurm (a `slurm` mapping or the
    slurm launcher), where a one-node torchrun line would leave out the partition, account
    and setup lines."""
    return command.nodes > 1 or bool(settings.slurm) or settings.launcher == "slurm"


def write_script(command: MegatronCommand, settings: MegatronSettings, path: Path,
                 label: str = "", step_time_s: float | None = None) -> Path:
    """Write the sbatch script (several nodes, or one where the settings are for Slurm: a
    `slurm` mapping or the slurm launcher) or the torchrun script (one node); executable.

    `step_time_s`, the layout's predicted seconds per step, sizes the sbatch time limit;
    the torchrun script has none (it runs until torchrun ends).
    """
    text = (sbatch_script(command, settings, label, job_name=path.stem,
                          step_time_s=step_time_s) if needs_sbatch(command, settings)
            else torchrun_script(command, settings, label))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path
