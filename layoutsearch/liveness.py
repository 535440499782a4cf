"""Whether the process holding something (an optuna trial, a claim on a layout) still runs.

A search marks what it holds with its host and pid, and stamps it with the time every
HEARTBEAT_S while it works; another search judges it by its pid on the same host, and by
its stamp, which STALE_S without a new one makes stale, anywhere.

    with Heartbeat(lambda: trial.set_user_attr("heartbeat", time.time())):
        ...  # a training run of an hour
    pid_alive(4242)   # False once process 4242 of this host is gone
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable

from layoutsearch.lifetime import ended_unreaped

HEARTBEAT_S = 30.0
"""How often a search stamps what it holds with the time (seconds): an evaluation with a
measured cost model is a training launch that may run for an hour."""
STALE_S = 600.0
"""What a search last stamped longer ago than this lost its process (seconds): twenty missed
stamps, so a database or file system stalled for minutes, or clocks a few minutes apart
(the stamp is one machine's wall clock, read by another), lose nothing live."""
HOST = socket.gethostname()
"""This machine's name, as a search records it beside its pid."""


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host runs (a process of another user counts; one that
    ended and that its parent has not waited for yet does not, on Linux)."""
    if sys.platform == "win32":  # os.kill(pid, 0) would end it there: assume it runs
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    # A zombie answers kill(0) until its parent waits for it, which may be never: a script
    # that started two searches and waits for the one waiting on the dead one's claim.
    return not ended_unreaped(pid)


class Heartbeat:
    """Calls `stamp()` now and every `interval_s` while the block runs; a stamp that fails
    in between (a busy database) is made good by the next one.

        with Heartbeat(stamp):
            ...  # the work the stamps say is alive
    """

    def __init__(self, stamp: Callable[[], None], interval_s: float = HEARTBEAT_S) -> None:
        self.stamp, self.interval_s = stamp, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.stamp()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.stamp()
            except Exception:
                continue
