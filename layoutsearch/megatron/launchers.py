"""Run one Megatron-LM trial: write its script (dry run), run torchrun here, or on Slurm.

A launcher takes a `Trial` (a command, a name, a log path) and returns a `TrialLog`: the
combined output, the exit status and whether the time limit killed it. `logs.parse_log`
turns that into a status and figures; launchers never interpret output.

    launcher = build_launcher(settings)
    outcome = launcher.run(Trial(name="tp2_pp4", command=command, log_path=path))
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from layoutsearch.errors import LayoutSearchError
from layoutsearch.interrupts import start_deferring_interrupts
from layoutsearch.lifetime import STOP_GRACE_S, stop_process_tree, stop_with_parent
from layoutsearch.megatron.args import MegatronCommand
from layoutsearch.megatron.gpu_lock import holding_the_gpus
from layoutsearch.megatron.scripts import (
    enter_checkout,
    torchrun_argv,
    trial_time_limit_s,
    write_script,
)
from layoutsearch.megatron.settings import MegatronSettings
from layoutsearch.megatron.slurm_options import submitit_parameters


@dataclass(frozen=True, kw_only=True, slots=True)
class Trial:
    name: str
    """A file-name-safe label of the layout."""
    command: MegatronCommand
    log_path: Path
    """Where the trial's combined stdout and stderr go."""
    step_time_s: float | None = None
    """The layout's predicted seconds per step (None: no prediction); it raises the trial's
    wall-clock limit above `timeout_s` for a long run (`scripts.trial_time_limit_s`)."""
    on_start: Callable[[], None] | None = None
    """Called as the trial starts, to say so: a local torchrun once this machine's GPUs are
    free (a trial of another search may hold them), a Slurm job as it is submitted."""
    said_as: str = ""
    """How the lines a launcher says of the trial name it ("local: launch 3 of 8: NAME", as
    the measured search's own lines do); "" for the launcher's name and `name`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialLog:
    text: str
    """Combined stdout and stderr ("" when nothing ran)."""
    returncode: int | None
    """Exit status; None when nothing ran (dry run)."""
    timed_out: bool = False
    ran: bool = True
    """False for a dry run: a script was written, nothing measured."""


class Launcher(Protocol):
    name: str
    trains: bool
    """Whether `run` trains the layout (and may take hours), rather than writing a script."""

    def preflight(self, command: MegatronCommand) -> str | None:
        """Why this launcher cannot start the command at all (None: it can).

        A setup problem (no checkout, no torchrun, too many nodes) is not a measurement
        of the layout: the measured cost model stops on it instead of recording it.
        """
        ...

    def environment(self, command: MegatronCommand) -> Mapping[str, str]:
        """The environment the command's ranks start with, as far as it is known here (the
        NVTE_* attention switches Megatron-LM checks against --attention-backend)."""
        ...

    def run(self, trial: Trial) -> TrialLog:
        """Run the trial and return its log. A launcher that trains calls
        `interrupts.start_deferring_interrupts()` once the trial has ended: a Ctrl-C from
        there on waits until the caller has recorded the run (one during the run stops
        it). Where it does not, the caller starts deferring as `run` returns."""
        ...


def _missing_checkout(settings: MegatronSettings) -> str | None:
    """Why the training script or the checkout, the folder every trial runs in, is not
    there (None: both are)."""
    script = settings.script_path
    if not script.is_file():
        return (f"megatron_path={settings.megatron_path!r}: {script} does not exist; set "
                f"megatron_path (cost_models/megatron.yaml) to a Megatron-LM checkout")
    if not settings.checkout.is_dir():
        # An absolute `script` elsewhere: the run would fail to start in its folder.
        return (f"megatron_path={settings.megatron_path!r}: {settings.checkout} is not a "
                "folder; trials run in the Megatron-LM checkout: set megatron_path "
                "(cost_models/megatron.yaml) to one")
    return None


DRY_RUN_WROTE = "dry run: wrote "
"""How a dry run's trial log begins, before the script's path (a measured search's reason
for the row reads "not measured: dry run: wrote <path>")."""
DRY_RUN_REASON = f"not measured: {DRY_RUN_WROTE}"
"""The reason of a row a measured search's dry run wrote a script for (measured.py)."""


class DryRunLauncher:
    """Writes each trial's launch script next to its log path and runs nothing."""

    name = "dry_run"
    trains = False

    def __init__(self, settings: MegatronSettings) -> None:
        self.settings = settings

    def preflight(self, command: MegatronCommand) -> str | None:
        return None  # a script can be written for any layout, wherever Megatron-LM is

    def environment(self, command: MegatronCommand) -> Mapping[str, str]:
        return command.env  # the script runs later, in a shell not known here

    def run(self, trial: Trial) -> TrialLog:
        path = write_script(trial.command, self.settings, trial.log_path.with_suffix(".sh"),
                            label=trial.name, step_time_s=trial.step_time_s)
        return TrialLog(text=f"{DRY_RUN_WROTE}{path}", returncode=None, ran=False)


class LocalLauncher:
    """torchrun as a subprocess on this node, with a wall-clock limit and a log per trial."""

    name = "local"
    trains = True

    def __init__(self, settings: MegatronSettings, max_nodes: int | None = 1,
                 stop_grace_s: float = STOP_GRACE_S, holds_gpus: bool = True) -> None:
        self.settings = settings
        self.max_nodes = max_nodes
        """Nodes one torchrun may span (1 on a real node; None for a fake cluster)."""
        self.holds_gpus = holds_gpus
        """Whether a trial holds this machine's GPUs while it runs, so that the trials of
        other searches here wait for it (gpu_lock.py); False for the fake Megatron-LM,
        whose trials use no GPU."""
        self.stop_grace_s = stop_grace_s
        """Seconds a stopped trial's torchrun has to stop its ranks before all are killed."""

    def preflight(self, command: MegatronCommand) -> str | None:
        if self.max_nodes is not None and command.nodes > self.max_nodes:
            return (f"the local launcher runs one node; this job needs {command.num_gpus} "
                    f"GPUs, {command.nodes} nodes of {command.gpus_per_node} (use "
                    f"cost_models.launcher=slurm on the command line, launcher: slurm in "
                    f"cost_models/megatron.yaml, or a job of at most {command.gpus_per_node} "
                    "GPUs)")
        program = self.settings.launch_prefix()[0]
        if shutil.which(program) is None:
            return (f"the launcher program {program!r} is not found (settings python or "
                    f"torchrun, cost_models/megatron.yaml)")
        return _missing_checkout(self.settings)

    def environment(self, command: MegatronCommand) -> Mapping[str, str]:
        return {**os.environ, **command.env}  # torchrun inherits this process's environment

    def run(self, trial: Trial) -> TrialLog:
        command = trial.command
        problem = self.preflight(command)
        if problem:
            return TrialLog(text=problem, returncode=None, ran=False)
        argv = torchrun_argv(command, self.settings)
        trial.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(self.environment(command))
        said_as = trial.said_as or f"{self.name}: {trial.name}"
        gpus = holding_the_gpus(said_as) if self.holds_gpus else contextlib.nullcontext()
        # The time limit counts from the start, after any wait for the GPUs.
        with gpus, trial.log_path.open("w") as log:
            if trial.on_start:
                trial.on_start()
            try:
                # A session of its own: a group to signal, out of reach of the terminal.
                process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                           cwd=self.settings.checkout,
                                           start_new_session=True,
                                           preexec_fn=stop_with_parent())
            except OSError as error:
                # The launcher itself did not start: nothing about the layout was learned.
                log.write(f"error: cannot start {argv[0]!r}: {error}\n")
                return TrialLog(text=f"cannot start {argv[0]!r}: {error}", returncode=None,
                                ran=False)
            timed_out = False
            try:
                process.wait(timeout=trial_time_limit_s(self.settings, trial.step_time_s))
                start_deferring_interrupts()  # ended: its log is read and recorded first
            except subprocess.TimeoutExpired:
                timed_out = True
                self._stop_timed_out(process)
            except KeyboardInterrupt:
                if process.poll() is None:
                    raise  # still training: stopped below, and the search with it
                # It ended as Ctrl-C was pressed (wait() looks every 50 ms at most).
                start_deferring_interrupts(pressed=True)
            finally:
                if process.returncode is None:
                    # Ctrl-C or an error in the search: the trial, ranks and all, must not
                    # train on, unwatched.
                    stop_process_tree(process, self.stop_grace_s)
        return TrialLog(text=trial.log_path.read_text(errors="replace"),
                        returncode=process.returncode, timed_out=timed_out)

    def _stop_timed_out(self, process: subprocess.Popen[bytes]) -> None:
        """Stop a trial at its time limit. Its timeout is a result, which the caller records
        before a Ctrl-C stops the search; a press while the trial stops (its ranks have
        `stop_grace_s` to end) kills it at once, as it would a trial still training."""
        try:
            stop_process_tree(process, self.stop_grace_s)
        except KeyboardInterrupt:
            start_deferring_interrupts(pressed=True)
        start_deferring_interrupts()


def _run_node(argv: list[str], env: dict[str, str], cwd: str) -> int:
    """One Slurm task: torchrun on this node, rendezvous from Slurm's variables.

    `cwd` is the checkout, the step's folder already (the job moves there first); given
    again because a node that cannot enter it runs the step in /tmp (slurmstepd), where
    torchrun would start without a word."""
    nodes = os.environ.get("SLURM_JOB_NODELIST", "localhost")
    master = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True,
                            text=True, check=False).stdout.split() or ["localhost"]
    rendezvous = ["--rdzv_backend", "c10d", "--rdzv_id", os.environ.get("SLURM_JOB_ID", "0"),
                  "--rdzv_endpoint", f"{master[0]}:{env.get('MASTER_PORT', '29500')}"]
    full = [*argv[:argv.index("--node_rank")], *rendezvous, *argv[argv.index("--master_port") + 2:]]
    return subprocess.run(full, env={**os.environ, **env}, cwd=cwd, check=False).returncode


def _has_ended(job: Any) -> bool:
    """Whether a submitted job has ended, as submitit sees it (its result files, or Slurm's
    state). False when that is not learned (a second Ctrl-C while sacct answers, sacct
    failing): a job thought running is cancelled rather than left holding the nodes."""
    try:
        return bool(job.done())
    except (KeyboardInterrupt, Exception):
        return False


class SlurmLauncher:
    """One Slurm job per trial through submitit (the optional `slurm` extra)."""

    name = "slurm"
    trains = True

    def __init__(self, settings: MegatronSettings,
                 executor_factory: Callable[[Path], Any] | None = None) -> None:
        self.settings = settings
        if executor_factory is None:
            try:
                import submitit
            except ImportError:
                raise LayoutSearchError(
                    "launcher=slurm needs submitit: pip install 'layoutsearch[slurm]'"
                ) from None
            executor_factory = lambda folder: submitit.AutoExecutor(folder=folder)  # noqa: E731
            # Without sbatch, submitit's AutoExecutor would run the "job" on this machine.
            self.submits_with = "sbatch"
        self.executor_factory = executor_factory

    submits_with: str | None = None
    """The Slurm program the executor submits with (None: an injected executor)."""

    def preflight(self, command: MegatronCommand) -> str | None:
        if self.submits_with and shutil.which(self.submits_with) is None:
            return (f"launcher=slurm submits with Slurm's {self.submits_with}, which is not on "
                    "this machine's PATH; run the search on a login node of the cluster, or "
                    "write the sbatch scripts with launcher=dry_run")
        # The nodes see the submitting host's file system (the checkout is shared), so a
        # script missing here is missing there.
        return _missing_checkout(self.settings)

    def environment(self, command: MegatronCommand) -> Mapping[str, str]:
        return command.env  # the nodes' own environment is not known here

    def run(self, trial: Trial) -> TrialLog:
        command = trial.command
        folder = trial.log_path.with_suffix("")
        executor = self.executor_factory(folder)
        executor.update_parameters(**submitit_parameters(
            self.settings.slurm, nodes=command.nodes, gpus_per_node=command.nproc_per_node,
            time_limit_s=trial_time_limit_s(self.settings, trial.step_time_s), name=trial.name,
            first_lines=[enter_checkout(self.settings)]))
        env = {**command.env, "MASTER_PORT": str(self.settings.master_port)}
        if trial.on_start:
            trial.on_start()
        job = executor.submit(_run_node, torchrun_argv(command, self.settings), env,
                              str(self.settings.checkout))
        try:
            job.wait()  # until its result files are there, or Slurm says it ended
            start_deferring_interrupts()  # ended: its output is read and recorded first
        except KeyboardInterrupt:
            if not _has_ended(job):
                job.cancel(check=False)  # Ctrl-C: the job must not hold the nodes, unwatched
                raise
            # It ended as Ctrl-C was pressed (wait() looks once a second).
            start_deferring_interrupts(pressed=True)
        timed_out, returncode = False, None
        try:
            results = job.results()
            returncode = max(int(r) for r in results) if results else 1
        except Exception as error:  # submitit raises on a failed or timed-out job
            timed_out = "TIMEOUT" in str(getattr(job, "state", "")) or "timed out" in str(error)
            returncode = 1
        texts = [job.stdout() or "", job.stderr() or ""]
        text = "\n".join(t for t in texts if t)
        trial.log_path.parent.mkdir(parents=True, exist_ok=True)
        trial.log_path.write_text(text)
        return TrialLog(text=text, returncode=returncode, timed_out=timed_out)


LAUNCHER_TYPES: dict[str, Callable[[MegatronSettings], Launcher]] = {
    "dry_run": DryRunLauncher, "local": LocalLauncher, "slurm": SlurmLauncher,
}


def build_launcher(settings: MegatronSettings) -> Launcher:
    return LAUNCHER_TYPES[settings.launcher](settings)
