"""A command put to the user's own Megatron-LM before it is launched or written.

layoutsearch's copy of Megatron-LM's argument rules (validation.py) follows Megatron-LM main;
the checkout a user trains with may be older or newer. Where that checkout is on this
machine, its own `parse_args` and `validate_args` are run on each command, by the Python
that trains, on the CPU (checkout_worker.py, one process for all the commands of a search):
a flag it does not know, or a rule it has that the copy lacks, is found before a job waits
in a queue for hundreds of GPUs.

    with CheckoutCheck(settings) as check:
        verdict = check.verdict(command, env)   # None where the setting says not to check
        if verdict and verdict.outcome == "rejected": ...
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from layoutsearch.errors import LayoutSearchError
from layoutsearch.megatron.args import MegatronCommand
from layoutsearch.megatron.settings import MegatronSettings, program
from layoutsearch.progress import say

WORKER = Path(__file__).resolve().parent / "checkout_worker.py"
START_TIMEOUT_S = 300.0
"""Seconds the worker has to import Megatron-LM (torch, megatron.core, Transformer Engine
where installed): minutes on a login node's shared file system, seconds elsewhere."""
CHECK_TIMEOUT_S = 120.0
"""Seconds one parse_args + validate_args may take; milliseconds as a rule."""
JSON_LINE_LIMIT = 1 << 20
"""Bytes of one answer line read at most (answers are a few hundred bytes)."""
WRITTEN_FOR = "those of Megatron-LM main (2025-2026)"
"""Which Megatron-LM's flags layoutsearch writes, as messages say when a checkout refuses
them."""
READ_BYTES = 1 << 16
"""Bytes asked of the worker's stdout at a time."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the checkout's Megatron-LM says of one command."""

    outcome: str
    """`passed`, `rejected` (one of its rules), or `unchecked` (it could not be asked: no
    torch where the check ran, a CUDA query without a GPU, the worker's own failure)."""
    message: str = ""
    """Megatron-LM's message (with the file and line of the rule), or why it was not asked."""
    stage: str = ""
    """`parse_args` (a flag or value the checkout does not take) or `validate_args`."""

    @property
    def refuses_the_flags(self) -> bool:
        """parse_args refused a flag or value: the checkout's version, not the layout, is at
        fault, and every command would fail alike."""
        return self.outcome == "rejected" and self.stage == "parse_args"

    def __str__(self) -> str:
        return f"{self.stage}: {self.message}" if self.stage else self.message


class CheckoutCheck:
    """Megatron-LM's own argument checks from the settings' checkout, one process for many
    commands; answers are kept, so a command asked again is not checked again."""

    def __init__(self, settings: MegatronSettings, *, start_timeout_s: float = START_TIMEOUT_S,
                 check_timeout_s: float = CHECK_TIMEOUT_S) -> None:
        self.settings = settings
        self.start_timeout_s = start_timeout_s
        self.check_timeout_s = check_timeout_s
        self.module = ""
        """The arguments module the checkout's Python imported, once it has."""
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._broken = ""  # why the worker answers nothing more ("" while it answers)
        self._busy = False  # it imports Megatron-LM or checks a command: an answer is to come
        self._unread = b""  # what it wrote after the last line read
        self._verdicts: dict[tuple[Any, ...], Verdict] = {}
        self._told_unchecked = False

    @property
    def where(self) -> str:
        """The checkout, as the messages name it."""
        return f"Megatron-LM in {self.settings.checkout}"

    def verdict(self, command: MegatronCommand, env: Mapping[str, str]) -> Verdict | None:
        """The checkout's verdict on the command run with `env` on top of the settings'
        environment; None where `validate_args` says not to ask. With `validate_args:
        true`, a command that cannot be checked stops with an error; with `auto` that is
        said once and the command counts as unchecked."""
        if not self.settings.checks_in_checkout:
            return None
        key = (command.argv, tuple(sorted(env.items())), command.num_gpus,
               command.compute_capability)
        if key not in self._verdicts:
            try:
                self._verdicts[key] = self._ask(command, env)
            except BaseException:
                # A Ctrl-C while the worker imports or checks: the answer on its way would
                # be read as the next command's. The next command starts another worker.
                self.close()
                raise
        verdict = self._verdicts[key]
        if verdict.outcome == "unchecked":
            if self.settings.validate_args is True:
                raise LayoutSearchError(
                    f"megatron.validate_args=true: {self.where} could not check the command "
                    f"with its own validate_args: {verdict.message}. Run it where "
                    f"megatron.python imports Megatron-LM, or set validate_args: auto to go on "
                    "with layoutsearch's copy of its rules")
            if not self._told_unchecked:
                self._told_unchecked = True
                say(f"note: {self.where} could not check a command with its own "
                    f"validate_args ({verdict.message}); layoutsearch's copy of its rules "
                    "checks such commands")
        return verdict

    def _ask(self, command: MegatronCommand, env: Mapping[str, str]) -> Verdict:
        if self._process is None and not self._broken:
            self._start()
        if self._broken:
            return Verdict("unchecked", self._broken)
        request = {"argv": list(command.argv), "env": dict(env), "world_size": command.num_gpus,
                   "compute_capability": command.compute_capability}
        answer = self._exchange(request)
        if answer is None:
            return Verdict("unchecked", self._broken)
        return Verdict(str(answer.get("outcome")), str(answer.get("message", "")),
                       str(answer.get("stage", "")))

    def _start(self) -> None:
        # Megatron-LM prints every argument: a pipe nobody reads would fill and stop it.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        try:
            self._process = subprocess.Popen(
                [program(self.settings.python), str(WORKER), str(self.settings.checkout)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                cwd=self.settings.checkout, env={**os.environ, **self.settings.env},
                # A Ctrl-C is the search's to handle; the worker is stopped by close().
                start_new_session=True)
        except OSError as error:
            self._broken = f"megatron.python={self.settings.python!r} did not start: {error}"
            return
        self._busy = True
        deadline = time.monotonic() + self.start_timeout_s
        ready = None
        while ready is None or "ready" not in ready:
            # Lines before the worker's own (what a `python` wrapper, such as a module
            # system's, says on stdout first) are not answers.
            line = self._line(deadline, self.start_timeout_s,
                              "import Megatron-LM's arguments module")
            if line is None:
                return
            ready = _json_object(line)
        self._busy = False
        if not ready.get("ready"):
            self._broken = f"megatron.python cannot import it: {ready.get('message')}"
            self.close()
            return
        self.module = str(ready.get("module", ""))

    def _exchange(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """The worker's answer to `request`; None, with `_broken` saying why, where it
        gives none."""
        assert self._process is not None and self._process.stdin is not None
        self._busy = True
        try:
            self._process.stdin.write((json.dumps(request) + "\n").encode())
            self._process.stdin.flush()
        except OSError:
            self._stopped("stopped before it was asked")
            return None
        line = self._line(time.monotonic() + self.check_timeout_s, self.check_timeout_s,
                          "check a command")
        if line is None:
            return None
        answer = _json_object(line)
        if answer is None:
            self._stopped(f"answered {line[:200]!r}, not a JSON object")
            return None
        self._busy = False
        return answer

    def _line(self, deadline: float, timeout_s: float, doing: str) -> bytes | None:
        """The worker's next line, without its newline; None, with `_broken` saying why,
        where it exits first, or writes none by `deadline` (time.monotonic(), `timeout_s`
        from when it began `doing` that). Read from the pipe's descriptor, so that a line
        already read from it is never waited for: one read may bring more than a line."""
        assert self._process is not None and self._process.stdout is not None
        pipe = self._process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(pipe, selectors.EVENT_READ)
            while b"\n" not in self._unread:
                if len(self._unread) > JSON_LINE_LIMIT:
                    self._stopped(f"wrote a line of over {JSON_LINE_LIMIT} bytes")
                    return None
                if not selector.select(max(0.0, deadline - time.monotonic())):
                    if time.monotonic() >= deadline:
                        self._stopped(f"took over {timeout_s:.0f} s to {doing}")
                        return None
                    continue
                read = os.read(pipe, READ_BYTES)
                if not read:
                    self._stopped(f"exited before it could {doing}")
                    return None
                self._unread += read
        line, _, self._unread = self._unread.partition(b"\n")
        return line

    def _stopped(self, what: str) -> None:
        tail = self._log_tail()
        self._broken = f"{program(self.settings.python)} {WORKER.name} {what}" + (
            f": {tail}" if tail else "")
        self.close()

    def _log_tail(self) -> str:
        """The last line the worker wrote to stderr (a traceback's last line says why)."""
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = [line.strip() for line in self._log.read().decode(errors="replace")
                 .splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""

    def close(self) -> None:
        """Stop the worker: at the end of its input where it waits for a command, at once
        where its answer would come to no one. A later verdict on a new command starts
        another (unless the worker could not import Megatron-LM: that is not asked again)."""
        process, self._process = self._process, None
        busy, self._busy, self._unread = self._busy, False, b""
        if process is not None:
            if busy:
                process.kill()
            if process.stdin is not None:
                # A worker already gone leaves a request unsent: closing retries it.
                with contextlib.suppress(OSError):
                    process.stdin.close()  # the worker ends at the end of its input
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> CheckoutCheck:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _json_object(line: bytes) -> dict[str, Any] | None:
    """The JSON object on the line; None where it holds none."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
