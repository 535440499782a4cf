"""Megatron-LM commands for ranked results: a `megatron_args` column and launch scripts.

    ranked = with_megatron_args(ranked, job)                  # adds megatron_args
    paths = write_launch_scripts(ranked, job, "out", top_k=5)  # one script per layout
"""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from layoutsearch.drivers.paper import PASSED_OVER, RULE_COLUMN
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import LAYOUT_COLUMNS, Layout
from layoutsearch.megatron.args import MegatronCommand, build_command
from layoutsearch.megatron.checkout_check import WRITTEN_FOR, CheckoutCheck
from layoutsearch.megatron.checks import every_command_rejected, rejection
from layoutsearch.megatron.launchers import DRY_RUN_REASON
from layoutsearch.megatron.scripts import needs_sbatch, torchrun_argv, write_script
from layoutsearch.megatron.settings import MegatronSettings, resolve_settings
from layoutsearch.megatron.validation import Problem
from layoutsearch.progress import say
from layoutsearch.results import COMMAND_REJECTED, job_of
from layoutsearch.specs import Job

SettingsSpec = str | Path | Mapping[str, Any] | MegatronSettings | None


def _command(row: Mapping[str, Any], job: Job, settings: MegatronSettings,
             ) -> MegatronCommand | None:
    layout = Layout.from_row(row)
    if layout.dp <= 0 or layout.dp * layout.model_parallel_size != job.num_gpus:
        return None  # the rules reject such rows; there is no command for them
    return build_command(layout, job, settings)


def _settings_refusal(row: Mapping[str, Any], job: Job, settings: MegatronSettings,
                      error: Problem) -> str:
    """The message of a rejected command when the settings' extra flags are what Megatron-LM
    rejects (every command then fails alike); "" when the layout's own command fails."""
    return every_command_rejected(error, partial(build_command, Layout.from_row(row), job),
                                  settings, lambda built: built.env)


def check_settings(candidates: pd.DataFrame, job: Job, settings: MegatronSettings) -> None:
    """Refuse, before a search, Megatron-LM settings whose extra flags break every command:
    tried on the first of the rule-passing `candidates`, as such a flag breaks a rule no
    layout has a say in."""
    for row in candidates.head(1).to_dict("records"):
        record = {str(k): v for k, v in row.items()}
        command = _command(record, job, settings)
        error = rejection(command, command.env) if command else None
        refusal = _settings_refusal(record, job, settings, error) if error else ""
        if refusal:
            raise LayoutSearchError(f"{refusal}; nothing was searched")


def command_rejections(rows: pd.DataFrame, job: Job, settings: MegatronSettings,
                       ) -> pd.Series:
    """Why Megatron-LM would reject each row's command with the settings' extra flags
    (COMMAND_REJECTED + its rule), "" where it would start; on the rows' index.

    A flag may break some layouts only: after --no-overlap-p2p-communication, interleaving
    needs pp > 2. A search checks the layouts its cost model finds to fit (about 0.2 ms
    each), so that `fits` means "can be launched as the settings stand" for every driver.
    Without extra flags every layout that passes the rules gets a command Megatron-LM
    accepts, so nothing is checked (tests/megatron/test_args.py checks that on two jobs of
    the default space).
    """
    reasons = pd.Series("", index=rows.index, dtype=object)
    if not settings.extra_args:
        return reasons
    columns = [c for c in LAYOUT_COLUMNS if c in rows.columns]
    for i, values in zip(rows.index, rows[columns].itertuples(index=False, name=None),
                         strict=True):
        command = _command(dict(zip(columns, values, strict=True)), job, settings)
        error = rejection(command, command.env) if command else None
        if error:
            reasons.loc[i] = f"{COMMAND_REJECTED}{error.rule}: {error.message}"
    return reasons


MEGATRON_SETTINGS = "megatron_settings"
"""`ranked.attrs` entry: the Megatron-LM settings the `megatron_args` column was built with,
as `MegatronSettings.to_record` writes them (api.search)."""
SCRIPTS_DIR = "megatron"
"""The folder of a job's output directory that `emit=megatron` writes launch scripts into."""


def with_megatron_args(ranked: pd.DataFrame, job: Job, settings: SettingsSpec = None,
                       ) -> pd.DataFrame:
    """`ranked` with `megatron_args`: the `pretrain_gpt.py` arguments of each row, quoted.

    Rows whose tp·pp·cp does not divide the GPUs get "". Identical layouts share one build.
    """
    resolved = resolve_settings(settings)
    columns = [c for c in LAYOUT_COLUMNS if c in ranked.columns]
    cache: dict[tuple[Any, ...], str] = {}
    out: list[str] = []
    for values in ranked[columns].itertuples(index=False, name=None):
        if values not in cache:
            command = _command(dict(zip(columns, values, strict=True)), job, resolved)
            cache[values] = command.shell() if command else ""
        out.append(cache[values])
    result = ranked.copy()
    result["megatron_args"] = out
    return result


def write_launch_scripts(ranked: pd.DataFrame, job: Job, out_dir: str | Path,
                         top_k: int = 5, settings: SettingsSpec = None) -> list[Path]:
    """Launch scripts for the `top_k` best feasible rows with distinct commands: torchrun
    (one node) or sbatch.

    A row whose command is the same as a better row's (e.g. flash1 and flash2, both
    `--attention-backend flash`) gets no script of its own: it would measure the same run
    twice. That script's comment names it, and the next distinct row takes its place. A
    script's file name starts with its row's rank among the feasible rows ("03_…").
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0:
        raise LayoutSearchError(f"top_k={top_k!r}: must be a positive integer")
    resolved = resolve_settings(settings)
    feasible = ranked[ranked["fits"].astype(bool)] if "fits" in ranked.columns else ranked
    chosen: dict[tuple[Any, ...], tuple[int, dict[str, Any], MegatronCommand, list[str]]] = {}
    records = ({str(k): v for k, v in r.items()} for r in feasible.to_dict("records"))
    for rank, row in enumerate(records, start=1):
        command = _command(row, job, resolved)
        if command is None:
            continue
        key = (command.argv, tuple(sorted(command.env.items())))
        if key in chosen:
            chosen[key][3].append(f"rank {rank} ({Layout.from_row(row).describe()})")
        elif len(chosen) < top_k:
            error = rejection(command, command.env)
            if error:
                # Checked before any file is written: a script that cannot start is no answer.
                refusal = (_settings_refusal(row, job, resolved, error) or
                           f"Megatron-LM would reject the command of rank {rank} "
                           f"({Layout.from_row(row).describe()}): {error}")
                raise LayoutSearchError(f"no launch scripts written: {refusal}")
            chosen[key] = (rank, row, command, [])
    _check_in_checkout(chosen.values(), resolved)
    paths: list[Path] = []
    # Ranks of one width, so that a listing (and `for f in *.sh`) goes in rank order.
    width = max([2, *(len(str(rank)) for rank, *_ in chosen.values())])
    for rank, row, command, twins in chosen.values():
        layout = Layout.from_row(row)
        name = f"{rank:0{width}d}_" + layout.describe().replace(" ", "_").replace("=", "-") \
            .replace("+", "-")
        mfu = row.get("mfu")
        label = f"rank {rank}: {layout.describe()}" + (
            f" (predicted MFU {float(mfu):.3f})" if pd.notna(mfu) else "")
        if twins:
            label += "; the same command runs " + ", ".join(twins)
        rule = row.get(RULE_COLUMN)
        if isinstance(rule, str) and rule.startswith(PASSED_OVER):
            label += f"; {rule}"  # driver=paper priced it on the way to its pick
        # The predicted step time sizes the sbatch time limit (s); none when unpredicted.
        step = row.get("step_time_s")
        step_time_s = float(step) if pd.notna(step) else None
        paths.append(write_script(command, resolved, Path(out_dir) / f"{name}.sh", label,
                                  step_time_s=step_time_s))
    return paths


def _check_in_checkout(chosen: Iterable[tuple[int, dict[str, Any], MegatronCommand, list[str]]],
                       settings: MegatronSettings) -> None:
    """Put the chosen commands to the checkout's own parse_args and validate_args, where
    `validate_args` says to (checkout_check.py): a command it rejects writes no script."""
    with CheckoutCheck(settings) as check:
        verdicts = [(rank, row, check.verdict(command, command.env))
                    for rank, row, command, _ in chosen]
    anyway = "set validate_args: false in the Megatron-LM settings to write the scripts anyway"
    for rank, row, verdict in verdicts:
        if verdict is not None and verdict.outcome == "rejected":
            advice = (f"it does not take the flags layoutsearch writes, {WRITTEN_FOR}: use "
                      f"such a checkout, or {anyway}" if verdict.refuses_the_flags else
                      f"leave such layouts out (pin a knob), or {anyway}")
            raise LayoutSearchError(
                f"no launch scripts written: {check.where} rejects the command of rank {rank} "
                f"({Layout.from_row(row).describe()}), which layoutsearch's copy of its rules "
                f"passes: {verdict}; {advice}")
    passed = sum(verdict is not None and verdict.outcome == "passed" for *_, verdict in verdicts)
    if passed:
        say(f"{check.where} ({check.module}): its parse_args and validate_args pass the "
            f"{passed} command{'s' * (passed != 1)}")


def emit_megatron(ranked: pd.DataFrame, output_dir: Path, top_k: int = 5) -> None:
    """The CLI's `emit=megatron`: launch scripts of the best layouts in `<run dir>/megatron/`.

    The job and the Megatron-LM settings come from `ranked.attrs` (set by
    `layoutsearch.search`, which built the `megatron_args` column with them), so the scripts
    run the commands the ranking shows.
    """
    job = job_of(ranked, "emit=megatron")
    # A ranking without them (its job set by hand) gets the shipped settings.
    settings = resolve_settings(ranked.attrs.get(MEGATRON_SETTINGS))
    if not ranked["fits"].astype(bool).any():
        dry_run = [Path(reason.removeprefix(DRY_RUN_REASON)) for reason in ranked["reason"]
                   if isinstance(reason, str) and reason.startswith(DRY_RUN_REASON)]
        if dry_run:
            # Nothing fits because nothing was measured: the dry run's scripts are the ones
            # to launch, and a copy of them here would rank nothing.
            folders = ", ".join(sorted({str(path.parent) for path in dry_run}))
            print(f"wrote no Megatron-LM launch scripts to {Path(output_dir) / SCRIPTS_DIR}: "
                  f"the dry run measured no layout, so none is ranked; it wrote "
                  f"{len(dry_run)} launch script{'s' * (len(dry_run) != 1)} to {folders}")
            return
        print("wrote no Megatron-LM launch scripts: no layout fits")
        return
    paths = write_launch_scripts(ranked, job, Path(output_dir) / SCRIPTS_DIR, top_k=top_k,
                                 settings=settings)
    ranks = [int(path.name.split("_", 1)[0]) for path in paths]
    merged = max(ranks) - len(ranks)
    same = (f"; {merged} layout ranked among them runs the same command as a better one "
            "and got no script of its own" if merged == 1 else
            f"; {merged} layouts ranked among them run the same command as a better one "
            "and got no script of their own" if merged else "")
    print(f"wrote {len(paths)} Megatron-LM launch script{'s' * (len(paths) != 1)} to "
          f"{Path(output_dir) / 'megatron'}{same}")
    if paths and not settings.script_path.is_file():
        # Scripts are often written where they are not run (a laptop, a login node): say
        # where they will look, not fail.
        print(f"note: the scripts run {settings.script_path}, which is not on this machine; "
              f"where Megatron-LM is elsewhere, set megatron_path in a copy of "
              f"cost_models/megatron.yaml and pass it as megatron=<that file>")


def _shell_lines(segments: Sequence[Sequence[str]], width: int) -> list[str]:
    """Shell words (quoted), a flag kept on one line with its values, filled to `width`
    columns and continued with backslashes, so that the lines paste into a shell as one
    command. Each segment (the environment, the launcher, the script) starts a line."""
    fill = width - len("  ") - len(" \\")  # the indent and the continuation
    lines: list[str] = []
    for segment in segments:
        line = ""
        groups: list[list[str]] = []
        for word in segment:
            if not groups or word.startswith("-"):
                groups.append([])
            groups[-1].append(word)
        for group in map(" ".join, groups):
            if line and len(line) + 1 + len(group) > fill:
                lines.append(line)
                line = group
            else:
                line = f"{line} {group}" if line else group
        if line:
            lines.append(line)
    return [f"  {line}" + (" \\" if i < len(lines) - 1 else "") for i, line in enumerate(lines)]


def _best_command(ranked: pd.DataFrame) -> tuple[MegatronCommand, MegatronSettings] | None:
    """The best row's command and the settings it was built with; None where the row has
    no `megatron_args` (nothing fits, a dry run's rows)."""
    args = ranked["megatron_args"].iloc[0] if len(ranked) and "megatron_args" in ranked else ""
    if not isinstance(args, str) or not args:
        return None
    settings = resolve_settings(ranked.attrs.get(MEGATRON_SETTINGS))
    row = {str(k): v for k, v in ranked.iloc[0].items()}
    command = _command(row, job_of(ranked, "the best layout's command"), settings)
    return None if command is None else (command, settings)


def environment_words(env: Mapping[str, str]) -> list[str]:
    """`NAME=value` words of a command's environment, quoted for a shell, sorted."""
    return [f"{name}={shlex.quote(value)}" for name, value in sorted(env.items())]


def best_command_requirements(ranked: pd.DataFrame) -> list[str]:
    """What the best row's run needs installed besides Megatron-LM and Transformer Engine
    (MegatronCommand.requires); [] where nothing, or the row has no command."""
    best = _best_command(ranked)
    return [] if best is None else list(best[0].requires)


def best_command_environment(ranked: pd.DataFrame) -> list[str]:
    """The environment the best row's command needs (CUDA_DEVICE_MAX_CONNECTIONS=1 with tp
    or cp > 1, Transformer Engine's attention switches), as `NAME=value` words; [] where
    it needs none or the row has no command."""
    best = _best_command(ranked)
    return [] if best is None else environment_words(best[0].env)


def best_command_lines(ranked: pd.DataFrame, width: int = 88) -> list[str]:
    """The best row's Megatron-LM command as the CLI prints it: on one node, the torchrun
    line of its `emit=megatron` script, run in the Megatron-LM checkout, with the
    environment the run needs
    (CUDA_DEVICE_MAX_CONNECTIONS=1 with tp or cp > 1, Transformer Engine's attention
    switches); where the script is an sbatch one, the `pretrain_gpt.py` arguments, naming
    that environment. Built as `megatron_args` and the scripts are (`ranked.attrs`'s job and
    settings); none when the best row has no command (nothing fits, a dry run's rows, a
    frame without `megatron_args`)."""
    best = _best_command(ranked)
    if best is None:
        return []
    command, settings = best
    env = environment_words(command.env)
    if needs_sbatch(command, settings):
        nodes = f"{command.nodes} node{'s' * (command.nodes != 1)}"
        header = ("best layout's command (pretrain_gpt.py arguments; emit=megatron writes the "
                  f"sbatch script that runs them on {nodes}"
                  + (f", with {' '.join(env)}" if env else "") + "):")
        segments: list[Sequence[str]] = [list(map(shlex.quote, command.argv))]
    else:
        header = "best layout's launch command (one node; emit=megatron writes it as a script):"
        launcher = list(map(shlex.quote, torchrun_argv(command, settings)))
        script = len(launcher) - len(command.argv) - 1  # the script, then its arguments
        # In the checkout, as the script runs it: relative paths in extra_args and env
        # (`--save ckpt`) name the same files wherever the line is pasted.
        checkout = ["cd", shlex.quote(str(settings.checkout)), "&&"]
        segments = [checkout, env, launcher[:script], launcher[script:]]
    wrap = partial(textwrap.wrap, width=width, break_long_words=False, break_on_hyphens=False)
    return [*wrap(header), *_shell_lines(segments, width),
            *(line for need in command.requires for line in wrap(f"needs: {need}")),
            *(line for note in command.notes for line in wrap(f"caveat: {note}"))]
