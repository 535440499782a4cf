"""This machine's GPUs, held by one local trial at a time.

The `local` launcher runs torchrun on this machine with a rank on each of its GPUs. Two such
trials at once (two searches sharing a measurement file, the jobs of a `--multirun` with a
parallel launcher, a notebook beside a command) would put two ranks on every GPU: each
would run at about half speed, or run out of memory, and the run that the measurement file
keeps for good would be wrong; the second torchrun would also find the first's rendezvous
port taken. So a local trial holds this machine's GPUs, with flock(2) on a lock file in
/tmp, and a trial of another search waits for them. The lock ends with its
process, however that ends. It is one lock for the machine, whatever CUDA_VISIBLE_DEVICES
says: searches given GPUs of their own would still share the port.

    with holding_the_gpus("local: launch 2 of 8: llama_13b_..."):
        ...  # torchrun, its ranks, until they are stopped
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from layoutsearch.progress import say

if sys.platform != "win32":  # where there is no flock, `import layoutsearch` still works
    import fcntl

LOCK_FOLDER = Path("/tmp")
"""Where the lock file is: this machine's own temporary folder, the same for every user and
search. Not $TMPDIR (tempfile.gettempdir()): a user's or a Slurm job's own folder would give
each search a lock of its own, and one on a shared file system would make the GPUs of every
machine one, or take no flock at all."""


def lock_path() -> Path:
    """The lock file of this machine's GPUs."""
    return LOCK_FOLDER / "layoutsearch-gpus.lock"


@contextlib.contextmanager
def holding_the_gpus(trial: str) -> Iterator[None]:
    """Hold this machine's GPUs until the block ends, waiting (and saying so, as `trial`)
    while another search's trial holds them. Ctrl-C stops the wait."""
    if sys.platform == "win32":  # no flock there, and no torchrun trials of ours either
        yield
        return
    path = lock_path()
    try:
        descriptor = _locked(path, trial)
    except OSError as error:  # no lock file to be had, or a file system that takes no flock
        say(f"{trial}: cannot lock this machine's GPUs with {path} ({error}); launching "
            "without, so a trial of another search here may run on them at the same time")
        yield
        return
    try:
        yield
    finally:
        os.close(descriptor)  # lets go of the lock


def _locked(path: Path, trial: str) -> int:
    """The lock file, opened and locked: waited for while another search's trial holds it."""
    descriptor = _open_lock_file(path)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"{trial}: waiting for this machine's GPUs, which a trial of another search "
                f"runs on ({path})")
            fcntl.flock(descriptor, fcntl.LOCK_EX)
    except BaseException:  # Ctrl-C while waiting, or no flock there: nothing held
        os.close(descriptor)
        raise
    return descriptor


def _open_lock_file(path: Path) -> int:
    """The lock file, opened read-only (enough for flock, so another user's lock file serves
    as well), and made if it is not there."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except PermissionError:
        # Another user's lock file in a sticky folder (/tmp), where fs.protected_regular
        # (systemd's default) refuses O_CREAT even of a file that is there: opened as it is.
        return os.open(path, os.O_RDONLY)
    # Readable by the users who share the machine, whatever this one's umask (077 would
    # shut them out of its lock); only its owner may change that, so another's try fails.
    with contextlib.suppress(OSError):
        os.fchmod(descriptor, 0o644)
    return descriptor
