from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from layoutsearch.interrupts import (
    deferring_interrupts,
    noticing_interrupts,
    raise_if_interrupted,
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
