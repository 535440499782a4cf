"""Child processes that end with the search that started them.

A search killed with SIGKILL runs no clean-up of its own, so its children must learn of it
from the kernel: PR_SET_PDEATHSIG sends them SIGTERM when their parent dies (Linux only).
A trial the search stops itself (its time limit, Ctrl-C) is stopped with every process it
started, ranks included (`stop_process_tree`).

    subprocess.Popen(argv, preexec_fn=stop_with_parent())   # torchrun of a trial
    stop_process_tree(process)    # at the time limit: torchrun and all its ranks
    end_with_parent(search_pid)   # first thing in a worker; the pid taken before the fork
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PROC = "/proc"
"""Where Linux lists its processes (proc(5)): a trial's ranks are found there."""
STOP_GRACE_S = 30.0
"""Seconds a stopped trial's torchrun has, after SIGTERM, before whatever is left of the
trial is killed: torchrun itself gives its ranks as long after passing the signal on
(PContext.close's timeout=30, torch/distributed/elastic/multiprocessing/api.py)."""
KILLED_EXIT_S = 10.0
"""Seconds to wait for killed processes to be gone, so that the next trial finds their GPU
memory free (SIGKILL is acted on as the process next runs; one stuck in the driver may take
longer, and is left to the kernel)."""


def stop_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook that has the kernel send SIGTERM to the child when the search dies.

    A trial's torchrun runs in a session of its own (a process group to signal, out of reach
    of the terminal's Ctrl-C, which the search answers with `stop_process_tree`), and so is
    shielded from the signals that stop the search; without this a search killed with
    SIGKILL leaves its trial training on the GPUs. torchrun answers SIGTERM by passing it on
    to its ranks (each in a session of its own too) and waiting for them. Linux only
    (prctl(2)); elsewhere None. The libc function is looked up here, in the parent (the
    process's own symbols include libc's): the hook runs between fork and exec, where only
    the bare call is safe.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    return hook


def end_with_parent(parent_pid: int) -> None:
    """In a forked worker: be sent SIGTERM when the parent `parent_pid` dies, and exit now
    if it died before that was asked (then the worker was already re-parented)."""
    hook = stop_with_parent()
    if hook is not None:
        hook()
    if os.getppid() != parent_pid:
        raise SystemExit(1)


@dataclass(frozen=True, slots=True)
class _Process:
    pid: int
    parent: int
    group: int
    started: int
    """Start time, clock ticks after boot: with the pid, it tells the process from a later
    one given the same pid."""


ENDED_STATES = ("Z", "X")
"""The states (/proc/PID/stat's third field) of a process that has ended and awaits its
parent's wait(): nothing of it runs or holds anything, though its pid answers kill(2)."""


def _stat_fields(pid: str) -> list[str] | None:
    """The fields of /proc/PID/stat (proc(5)) from the third, the state, on; None where it
    cannot be read (the process is gone, or there is no /proc)."""
    try:
        with open(f"{PROC}/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    # Field 2, the command name, is in parentheses and may itself hold spaces and ')'.
    return stat[stat.rindex(")") + 2:].split()


def ended_unreaped(pid: int) -> bool:
    """Whether process `pid` has ended but its parent has not waited for it yet (a zombie).
    Linux only (/proc); False elsewhere, and where its state cannot be read."""
    fields = _stat_fields(str(pid))
    return fields is not None and fields[0] in ENDED_STATES


def _read_stat(pid: str) -> _Process | None:
    """One process from /proc/PID/stat (proc(5)); None if it is gone or a zombie."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ENDED_STATES:  # nothing left to stop
        return None
    return _Process(pid=int(pid), parent=int(fields[1]), group=int(fields[2]),
                    started=int(fields[19]))


def _processes() -> dict[int, _Process]:
    """Every live process by pid, read from /proc; empty where there is no /proc."""
    try:
        names = os.listdir(PROC)
    except OSError:
        return {}
    found = (_read_stat(name) for name in names if name.isdigit())
    return {p.pid: p for p in found if p is not None}


def _descendants(pid: int) -> list[_Process]:
    """The live processes `pid` started, and theirs, found by parent pid (Linux /proc;
    elsewhere none). Taken while `pid` lives: an orphan is re-parented, out of reach."""
    children: defaultdict[int, list[_Process]] = defaultdict(list)
    for process in _processes().values():
        children[process.parent].append(process)
    found: list[_Process] = []
    todo = [pid]
    while todo:
        for child in children[todo.pop()]:
            found.append(child)
            todo.append(child.pid)
    return found


def _signal_group(group: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(group, signum)


def _survivors(processes: Sequence[_Process]) -> list[_Process]:
    """Those of `processes` still alive, as they are now (a pid with another start time is
    another process's; a zombie holds nothing)."""
    now = (_read_stat(str(process.pid)) for process in processes)
    return [later for process, later in zip(processes, now, strict=True)
            if later is not None and later.started == process.started]


def _kill(processes: Iterable[_Process]) -> None:
    """SIGKILL each of `processes` with its process group (a rank's own helpers, such as
    data-loader workers, share it); never the search's own group."""
    own_group = os.getpgrp()
    for process in processes:
        if process.group != own_group:
            _signal_group(process.group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGKILL)


def _wait_gone(processes: Sequence[_Process], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _survivors(processes) and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_process_tree(process: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """Stop `process` (a trial's torchrun, leading a session of its own) and every process
    it started, then reap it.

    torchrun starts each rank in a session of its own (start_new_session=True in
    SubprocessHandler._popen, torch/distributed/elastic/multiprocessing/subprocess_handler),
    so torchrun's group holds torchrun alone, and a rank outlives a SIGKILL of it, holding
    its GPU. So the ranks are found by parent pid first; then torchrun's group gets
    SIGTERM, which torchrun passes on to its ranks; after `grace_s` whatever is left of
    them is killed, and waited for (KILLED_EXIT_S at most). A second Ctrl-C during the
    grace period goes straight to the kill.
    """
    tree = _descendants(process.pid)
    try:
        _signal_group(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass  # torchrun did not stop in time: it and what it left are killed below
    finally:
        if process.returncode is None:  # not reaped: its pid and group are still its own
            tree += _descendants(process.pid)  # ranks it started since (a restart)
            _signal_group(process.pid, signal.SIGKILL)
        survivors = _survivors(tree)
        _kill(survivors)
        process.wait()
        _wait_gone(survivors, KILLED_EXIT_S)
