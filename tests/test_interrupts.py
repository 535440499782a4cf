from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from layoutsearch.interrupts import (
    Deferral,
    deferring_interrupts_once_started,
    noticing_interrupts,
    raise_if_interrupted,
    start_deferring_interrupts,
)
from tests.presses import PressesCtrlCWhileFinalized

# The KeyboardInterrupt dropped in __del__ is what pytest reports as unraisable: expected.
lost_in_a_finalizer = pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning")


def test_a_ctrl_c_a_finalizer_swallowed_is_raised_at_the_next_check() -> None:
    unraisable: list[type[BaseException]] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: unraisable.append(u.exc_type)
    try:
        with noticing_interrupts():
            finalized = PressesCtrlCWhileFinalized()
            del finalized  # the KeyboardInterrupt is raised inside __del__ and lost
            with pytest.raises(KeyboardInterrupt):
                raise_if_interrupted()
            raise_if_interrupted()  # raised once: nothing left
    finally:
        sys.unraisablehook = hook
    # Not printed as "Exception ignored ... KeyboardInterrupt": it was raised after all.
    assert unraisable == []


def test_a_ctrl_c_raised_as_usual_leaves_nothing_for_a_later_search() -> None:
    with pytest.raises(KeyboardInterrupt), noticing_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1.0)  # interrupted here, as Python's own handler would
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    with noticing_interrupts():
        raise_if_interrupted()  # a notebook's next search does not stop at once


@lost_in_a_finalizer
def test_outside_the_block_a_swallowed_ctrl_c_stays_lost() -> None:
    # What the block adds: without it, nothing remembers the press.
    finalized = PressesCtrlCWhileFinalized()
    del finalized
    raise_if_interrupted()


@contextmanager
def deferring_interrupts() -> Iterator[Deferral]:
    """A block that holds Ctrl-C from its first line."""
    with deferring_interrupts_once_started() as deferral:
        start_deferring_interrupts()
        yield deferral


def test_a_ctrl_c_pressed_while_deferring_is_raised_once_the_block_has_ended() -> None:
    written = []
    with pytest.raises(KeyboardInterrupt), deferring_interrupts():
        signal.raise_signal(signal.SIGINT)
        written.append("the row")  # reached: the press waits
    assert written == ["the row"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_second_ctrl_c_leaves_a_deferring_block_at_once() -> None:
    # A block stuck on a lock another process holds can still be left.
    reached = []
    with pytest.raises(KeyboardInterrupt), deferring_interrupts():
        signal.raise_signal(signal.SIGINT)
        reached.append("after the first press")
        signal.raise_signal(signal.SIGINT)
        reached.append("after the second press")
    assert reached == ["after the first press"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_held_ctrl_c_goes_to_the_handler_the_block_found() -> None:
    pressed: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        with deferring_interrupts():
            signal.raise_signal(signal.SIGINT)
            assert pressed == []
        assert pressed == [signal.SIGINT]  # once, after the block; no KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_block_that_raises_its_own_error_is_not_overtaken_by_a_held_ctrl_c() -> None:
    with pytest.raises(ValueError), deferring_interrupts():
        signal.raise_signal(signal.SIGINT)
        raise ValueError("the search stops on this anyway")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_deferring_off_the_main_thread_runs_the_block_as_it_is() -> None:
    # Only the main thread may set a signal handler (signal.signal raises ValueError).
    ran: list[BaseException | str] = []

    def block() -> None:
        try:
            with deferring_interrupts():
                ran.append("ran")
        except BaseException as error:
            ran.append(error)

    thread = threading.Thread(target=block)
    thread.start()
    thread.join()
    assert ran == ["ran"]


def test_before_deferring_starts_a_ctrl_c_is_raised_at_once() -> None:
    # The trial still trains: the press stops it, and the search.
    reached = []
    with pytest.raises(KeyboardInterrupt), deferring_interrupts_once_started() as deferral:
        signal.raise_signal(signal.SIGINT)
        reached.append("after the press")
    assert reached == [] and not deferral.started
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_from_the_start_a_ctrl_c_waits_for_the_block_to_end() -> None:
    reached = []
    with pytest.raises(KeyboardInterrupt), deferring_interrupts_once_started() as deferral:
        reached.append("the trial ended")
        start_deferring_interrupts()
        signal.raise_signal(signal.SIGINT)  # as its log is read
        reached.append("the row")
    assert reached == ["the trial ended", "the row"] and deferral.started
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_caught_as_the_block_started_deferring_is_held_too() -> None:
    # Pressed as the trial ended: raised in the launcher's wait, and caught there.
    reached = []
    with pytest.raises(KeyboardInterrupt), deferring_interrupts_once_started() as deferral:
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            start_deferring_interrupts(pressed=True)
        reached.append("the row")
    assert reached == ["the row"] and deferral.presses == 1


def test_a_ctrl_c_pending_as_deferring_starts_is_held_once_caught(monkeypatch) -> None:
    # CPython runs a pending handler inside signal.signal(), before the new one is set: a
    # press just as a trial ended was raised there, and, the block already marked as
    # holding, the launcher's start_deferring_interrupts(pressed=True) let it stop the
    # search before the row was written ("a second Ctrl-C", and the run lost).
    install = signal.signal
    pending = [True]

    def pressed_as_it_installs(signum, handler):
        if pending and handler is not signal.default_int_handler:
            pending.clear()
            raise KeyboardInterrupt
        return install(signum, handler)

    monkeypatch.setattr(signal, "signal", pressed_as_it_installs)
    reached = []
    with pytest.raises(KeyboardInterrupt), deferring_interrupts_once_started() as deferral:
        try:
            start_deferring_interrupts()  # the trial ended
        except KeyboardInterrupt:
            start_deferring_interrupts(pressed=True)  # as the launcher does
        reached.append("the row")
    assert reached == ["the row"] and deferral.presses == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_a_block_starting_to_defer_holds_nothing() -> None:
    # A launcher run on its own: no caller records the run, so nothing waits for it.
    start_deferring_interrupts()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        start_deferring_interrupts(pressed=True)  # the caught Ctrl-C goes on at once


def test_a_caught_ctrl_c_off_the_main_thread_goes_on_there() -> None:
    raised: list[BaseException] = []

    def caught() -> None:
        try:
            start_deferring_interrupts(pressed=True)
        except KeyboardInterrupt as error:
            raised.append(error)

    thread = threading.Thread(target=caught)
    thread.start()
    thread.join()
    assert [type(error) for error in raised] == [KeyboardInterrupt]
