"""Megatron-LM backend: layouts as command lines, launchers, and the log parser.

Only this package knows Megatron-LM's flag names and log formats.

    from layoutsearch.megatron import best_command_lines, build_command, parse_log, validate_argv
    command = build_command(layout, job)
    print("\n".join(best_command_lines(ranked)))  # as the CLI prints it, with its environment
"""

from __future__ import annotations

from layoutsearch.megatron.args import MegatronCommand, build_command, command_of_row, job_of_row
from layoutsearch.megatron.emit import (
    best_command_lines,
    emit_megatron,
    with_megatron_args,
    write_launch_scripts,
)
from layoutsearch.megatron.launchers import (
    DryRunLauncher,
    Launcher,
    LocalLauncher,
    SlurmLauncher,
    Trial,
    TrialLog,
    build_launcher,
)
from layoutsearch.megatron.logs import LogResult, parse_log
from layoutsearch.megatron.settings import MegatronSettings, resolve_settings
from layoutsearch.megatron.validation import Problem, parse_argv, validate_argv

__all__ = [
    "DryRunLauncher",
    "Launcher",
    "LocalLauncher",
    "LogResult",
    "MegatronCommand",
    "MegatronSettings",
    "Problem",
    "SlurmLauncher",
    "Trial",
    "TrialLog",
    "best_command_lines",
    "build_command",
    "build_launcher",
    "command_of_row",
    "emit_megatron",
    "job_of_row",
    "parse_argv",
    "parse_log",
    "resolve_settings",
    "validate_argv",
    "with_megatron_args",
    "write_launch_scripts",
]
