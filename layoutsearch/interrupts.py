"""Ctrl-C that a long search does not miss.

CPython raises KeyboardInterrupt at the main thread's next bytecode. When that bytecode is a
finalizer's (a weakref callback or `__del__` run by the garbage collector), the exception
cannot leave it: it is printed as "Exception ignored in: ..." and lost, and the search goes
on as if Ctrl-C had never been pressed (about one press in ten, on an optuna search over the
default space, which collects many pandas objects). Inside `noticing_interrupts()` each
Ctrl-C is also remembered, so that a loop raises it at its next safe point, and the
"Exception ignored" traceback of one that a finalizer swallowed is not printed: it is
not lost.

    with noticing_interrupts():
        while searching: raise_if_interrupted(); ...
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
