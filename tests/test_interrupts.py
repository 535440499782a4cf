from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from layoutsearch.interrupts import noticing_interrupts, raise_if_interrupted
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
