"""Child processes that end with the search that started them.

A search killed with SIGKILL runs no clean-up of its own, so its children must learn of it
from the kernel: PR_SET_PDEATHSIG sends them SIGTERM when their parent dies (Linux only).

    subprocess.Popen(argv, preexec_fn=stop_with_parent())   # torchrun of a trial
    end_with_parent(search_pid)   # first thing in a worker; the pid taken before the fork
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def stop_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook that has the kernel send SIGTERM to the child when the search dies.

    A trial runs in a session of its own (so that a timeout can kill every rank), which also
    shields it from the signals that stop the search; without this a search killed with
    SIGKILL leaves its trial training on the GPUs. torchrun answers SIGTERM by stopping its
    ranks. Linux only (prctl(2)); elsewhere None. The libc function is looked up here, in
    the parent (the process's own symbols include libc's): the hook runs between fork and
    exec, where only the bare call is safe.
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
