"""Ctrl-C that a long search does not miss.

CPython raises KeyboardInterrupt at the main thread's next bytecode. When that bytecode is a
finalizer's (a weakref callback or `__del__` run by the garbage collector), the exception
cannot leave it: it is printed as "Exception ignored in: ..." and lost, and the search goes
on as if Ctrl-C had never been pressed (about one press in ten, on an optuna search over the
default space, which collects many pandas objects). Inside `noticing_interrupts()` each
Ctrl-C is also remembered, so that a loop raises it at its next safe point, and the
"Exception ignored" traceback of one that a finalizer swallowed is not printed: it is
not lost.

Inside `deferring_interrupts_once_started()` a Ctrl-C is raised as usual until code in the
block calls `start_deferring_interrupts()`, and from there on waits for the block to end: a
launcher calls it once its trial has ended, so that a measured search records the finished
run (an hour of training) before the press stops it, while a trial still training is
stopped at once. `deferring_interrupts()` holds it from the block's start (a claim on a
layout made whole under a file lock).

    with noticing_interrupts():
        while searching: raise_if_interrupted(); ...
    with deferring_interrupts_once_started():
        log = launcher.run(trial)   # stopped by Ctrl-C while it trains; once it ended, held
        file.append(row_of(log))    # the held Ctrl-C is raised once the row is written
    with deferring_interrupts():
        make_claim()                # a Ctrl-C here is raised once the claim is made
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

_pressed = threading.Event()


def _remember_and_raise(signum: int, frame: FrameType | None) -> None:
    _pressed.set()
    raise KeyboardInterrupt


@contextmanager
def noticing_interrupts() -> Iterator[None]:
    """Remember each Ctrl-C while the block runs (besides raising it as usual). Only where
    Python's own handler is installed, in the main thread: a handler of the user's, or one
    of an enclosing block, is left as it is."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _pressed.clear()
    previous = signal.signal(signal.SIGINT, _remember_and_raise)
    report_unraisable = sys.unraisablehook

    def quiet_if_remembered(unraisable: sys.UnraisableHookArgs) -> None:
        if not (issubclass(unraisable.exc_type, KeyboardInterrupt) and _pressed.is_set()):
            report_unraisable(unraisable)

    sys.unraisablehook = quiet_if_remembered
    try:
        yield
    finally:
        sys.unraisablehook = report_unraisable
        signal.signal(signal.SIGINT, previous)
        _pressed.clear()  # raised as usual, or never checked: nothing left for a later search


def raise_if_interrupted() -> None:
    """Raise the KeyboardInterrupt of a Ctrl-C that a finalizer swallowed."""
    if _pressed.is_set():
        _pressed.clear()
        raise KeyboardInterrupt


class Deferral:
    """One deferring block: whether it holds Ctrl-C yet, the handler it found then, and the
    presses it holds."""

    def __init__(self) -> None:
        self.previous: signal.Handlers | Callable[[int, FrameType | None], Any] | int | None = None
        self.started = False
        """Whether a Ctrl-C is held from now on (`start`)."""
        self.presses = 0

    def start(self) -> None:
        """Hold a Ctrl-C from here to the block's end. Under a handler installed outside
        Python, which could not be put back, nothing is held."""
        previous = signal.getsignal(signal.SIGINT)
        if self.started or previous is None:
            return
        # Started once the handler is set: signal.signal() first runs a pending handler,
        # which may raise a Ctrl-C pressed just now; caught, a second start() holds it.
        signal.signal(signal.SIGINT, self._hold_the_first)
        self.previous, self.started = previous, True

    def _hold_the_first(self, signum: int, frame: FrameType | None) -> None:
        self.presses += 1
        if self.presses > 1:
            raise KeyboardInterrupt

    def stop(self) -> None:
        """Put back the handler `start` found."""
        if self.started:
            signal.signal(signal.SIGINT, self.previous)


_deferrals: list[Deferral] = []
"""The deferring blocks the main thread is in, innermost last."""


@contextmanager
def deferring_interrupts_once_started() -> Iterator[Deferral]:
    """Let a Ctrl-C stop the block as usual until `start_deferring_interrupts()` is called
    inside it; from then on, hold it off and deliver it, to the handler found then, once
    the block has ended (not when it raised: that stops the caller anyway). A second press
    is raised at once, so that a block stuck (on a lock another process holds) can still be
    left. In the main thread only, where Python runs signal handlers; elsewhere the block
    runs as it is."""
    deferral = Deferral()
    if threading.current_thread() is not threading.main_thread():
        yield deferral
        return
    _deferrals.append(deferral)
    try:
        yield deferral
    finally:
        _deferrals.remove(deferral)
        deferral.stop()
    if deferral.presses:
        # Delivered again rather than raised: Python's handler raises KeyboardInterrupt,
        # `noticing_interrupts` also remembers it, and a handler of the user's does its own.
        signal.raise_signal(signal.SIGINT)


def start_deferring_interrupts(*, pressed: bool = False) -> None:
    """From here on, hold a Ctrl-C until the innermost `deferring_interrupts_once_started()`
    block ends; outside one (or off the main thread) nothing is held. `pressed`: a Ctrl-C
    raised already, and caught as KeyboardInterrupt, is held too, as if pressed now (outside
    a block it is raised again)."""
    if threading.current_thread() is not threading.main_thread():
        if pressed:
            raise KeyboardInterrupt  # no handler runs here: a signal would go elsewhere
        return
    if _deferrals:
        _deferrals[-1].start()
    if pressed:
        signal.raise_signal(signal.SIGINT)  # to the holding handler, or Python's outside


@contextmanager
def deferring_interrupts() -> Iterator[None]:
    """Hold off a Ctrl-C for the whole block: `deferring_interrupts_once_started()`,
    started at once."""
    with deferring_interrupts_once_started():
        start_deferring_interrupts()
        yield
