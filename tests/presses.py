"""A Ctrl-C that CPython loses: pressed while the garbage collector runs a finalizer.

    finalized = PressesCtrlCWhileFinalized()
    del finalized  # SIGINT arrives inside __del__; its KeyboardInterrupt is dropped there
"""

from __future__ import annotations

import os
import signal
import time


class PressesCtrlCWhileFinalized:
    """Delivers SIGINT while the garbage collector runs its `__del__`: CPython prints the
    KeyboardInterrupt raised there as "Exception ignored" and drops it."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, inside the finalizer
