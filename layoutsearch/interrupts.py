"""Ctrl-C that a long search does not miss.

CPython raises KeyboardInterrupt at the main thread's next bytecode. When that bytecode is a
finalizer's (a weakref callback or `__del__` run by the garbage collector), the exception
cannot leave it: it is printed as "Exception ignored in: ..." and lost, and the search goes
on as if Ctrl-C had never been pressed (about one press in ten, on an optuna search over the
default space, which collects many pandas objects). Inside `noticing_interrupts()` each
Ctrl-C is also remembered, so that a loop raises it at its next safe point, and the
"Exception ignored" traceback of one that a finalizer swallowed is not printed: it is
not lost.

Inside `deferring_interrupts()` a Ctrl-C waits for the block to end: a measured search
records a finished run (an hour of training) before the press stops it.

    with noticing_interrupts():
        while searching: raise_if_interrupted(); ...
    with deferring_interrupts():
        file.append(row)   # Ctrl-C pressed here is raised once the row is written
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

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


@contextmanager
def deferring_interrupts() -> Iterator[None]:
    """Hold off a Ctrl-C pressed while the block runs, and deliver it, to the handler the
    block found, once the block has ended (not when it raised: that stops the caller
    anyway). A second press inside the block is raised at once, so that a block stuck
    (on a lock another process holds) can still be left. In the main thread only, where
    Python runs signal handlers; elsewhere, and under a handler installed outside Python
    (which could not be put back), the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:
        yield
        return
    presses = 0

    def hold_the_first(signum: int, frame: FrameType | None) -> None:
        nonlocal presses
        presses += 1
        if presses > 1:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, hold_the_first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if presses:
        # Delivered again rather than raised: Python's handler raises KeyboardInterrupt,
        # `noticing_interrupts` also remembers it, and a handler of the user's does its own.
        signal.raise_signal(signal.SIGINT)
