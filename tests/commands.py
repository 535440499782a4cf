"""The `layoutsearch` command run in the test's own process: `layoutsearch.cli.main`, the
console script's entry point, with a command line, from a folder, its exit status and output.

A process of its own would import the package anew, most of a small search's time. What a
process adds (Ctrl-C delivered as a signal, the console script itself) is tested with
processes: tests/test_cli.py runs the command as a user does.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from layoutsearch.cli import main
from layoutsearch.reporting.sweep import mark_sweep_end


@dataclass(frozen=True)
class Finished:
    """What a command left, as `subprocess.run(..., capture_output=True, text=True)` has it."""

    returncode: int
    stdout: str
    stderr: str


Command = Callable[..., Finished]


def command_in_this_process(monkeypatch: pytest.MonkeyPatch,
                            capfd: pytest.CaptureFixture[str]) -> Command:
    """`run(*args, cwd=folder)`: `layoutsearch *args` run from `folder` in this process; what
    it printed includes its child processes' output (launches), as a shell shows it."""

    def run(*args: str, cwd: Path) -> Finished:
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["layoutsearch", *args])
        capfd.readouterr()  # what the test printed before is not the command's
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        # hydra/job_logging=disabled configures logging with disable_existing_loggers: every
        # logger there was (optuna's among them) stays off for the commands after it.
        loggers = [logger for logger in logging.Logger.manager.loggerDict.values()
                   if isinstance(logger, logging.Logger)]
        disabled = {logger: logger.disabled for logger in loggers}
        try:
            main()
            status = 0
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        finally:
            # Hydra's job logging replaced the root logger's handlers (the console, the
            # job's log file): a process of its own would close them as it ended.
            for handler in root.handlers:
                if handler not in handlers:
                    handler.close()
            root.handlers[:] = handlers
            root.setLevel(level)
            for logger, was_disabled in disabled.items():
                logger.disabled = was_disabled
            mark_sweep_end()  # a sweep stopped by Ctrl-C ends with its process
        out, err = capfd.readouterr()
        return Finished(status, out, err)

    return run
