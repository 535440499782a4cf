"""Claims on the layouts being measured, beside a measurement file: none is launched twice.

Searches that share a measurement file (a Hydra multirun with a parallel launcher, two
notebooks, searches on several machines) would each launch a layout the file does not
record yet. Before a launch a search claims the layout: under the file's lock it reads the
file again, and uses the layout's row if one is there by now; else it makes the layout's
claim, a small file in `.NAME.claims/` beside the measurement file, with link(2), which
only one of two searches can win, on NFS too (open(2)'s advice for lock files there). A
layout that another live search claimed is left for last by a search with other layouts to
measure, so that searches sharing a file split the launches between them; then it is
waited for, and its row used once written: the file is read again as soon as the claim is
gone (looked for every CLAIM_CHECK_S), and every POLL_S while it stands. The claimant
stamps its claim (the file's time) every HEARTBEAT_S while the trial runs, and removes it
once the row is written or the launch ended without one (a failure, Ctrl-C). A claim
whose process is gone (on this host) or not stamped for STALE_S (on another host: a machine
that died) is taken over, and the layout launched. The measurement file keeps the schema's
rows alone.

    with claimed(file, row, "local: llama_13b_...", since=rows_read, retry=()) as recorded:
        if recorded is None:
            ...  # this search holds the claim: launch, append the row
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import uuid
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layoutsearch.costs.measurement_file import MeasurementFile, measurement_key
from layoutsearch.interrupts import deferring_interrupts
from layoutsearch.liveness import HOST, STALE_S, Heartbeat, pid_alive
from layoutsearch.progress import say

POLL_S = 5.0
"""How often a search waiting for another's run reads the measurement file while the run's
claim stands (seconds): a trial trains for minutes to hours, and each read parses the whole
file."""
CLAIM_CHECK_S = 0.25
"""How often a waiting search looks whether the claim is still there (seconds): one small
file's read, and the claimant removes its claim just after writing the row, so the row is
read within this of being written rather than up to POLL_S later."""
_HELD_HERE: set[str] = set()
"""The tokens of the claims this process holds: one of its pid that is not among them was
left behind (a second Ctrl-C as it was being removed), and a later search of the same
process (a notebook's) takes it over instead of waiting for itself."""


def claims_folder(measurements: Path) -> Path:
    """Where the claims on layouts of a measurement file live: `.NAME.claims/` beside it."""
    return measurements.with_name(f".{measurements.name}.claims")


@dataclass(frozen=True, slots=True)
class Claimant:
    """The search that holds a claim, as its file records it."""

    pid: int | None
    """None for a claim that cannot be read (written by something else): judged by its time."""
    host: str
    stamped: float
    """When it was claimed or last stamped (the claim file's time, s since the epoch)."""
    token: str
    """Tells one claim from another of the same process."""

    def __str__(self) -> str:
        return f"pid {self.pid} on host {self.host}" if self.pid is not None else \
            "a search whose claim cannot be read"

    def gone(self, now: float) -> str:
        """Why its search no longer runs ("" while it may): on this host by its pid, as an
        optuna study's trial in flight is judged (a search stopped for a while with Ctrl-Z
        keeps its claim); elsewhere by its stamp."""
        if self.host == HOST and self.pid == os.getpid():
            return "" if self.token in _HELD_HERE else \
                f"{self} (this process), which claimed it, left it behind"
        if self.host == HOST and self.pid is not None:
            return "" if pid_alive(self.pid) else f"{self}, which claimed it, is gone"
        if now - self.stamped > STALE_S:
            return (f"{self}, which claimed it, has not stamped its claim for "
                    f"{(now - self.stamped) / 60:.0f} min")
        return ""


class LayoutClaim:
    """One layout's claim beside a measurement file, as one search makes and holds it.

    `since` is how many rows the file had when the search read it: a row written after
    them was measured by another search meanwhile, and is used whatever its status; an
    older one is used unless its status is in `retry` (to be launched again)."""

    def __init__(self, file: MeasurementFile, row: Mapping[str, Any], trial: str, *,
                 since: int, retry: Collection[str]) -> None:
        self.file, self.trial, self.since, self.retry = file, trial, since, tuple(retry)
        self.key = measurement_key(row)
        digest = hashlib.sha1(repr(self.key).encode()).hexdigest()[:16]
        self.path = claims_folder(file.real_path) / f"{digest}.json"
        self.token = uuid.uuid4().hex
        self.held = False

    def acquire(self) -> dict[str, Any] | None:
        """The file's row to use, waited for while another live search measures the
        layout; None once this search holds the claim (or cannot make one), to launch it."""
        waited: Claimant | None = None
        while True:
            found = self.take()
            if not isinstance(found, Claimant):
                return found
            if waited is None or found.token != waited.token:
                stamped = time.strftime("%H:%M:%S", time.localtime(found.stamped))
                say(f"{self.trial}: waiting for it, being measured by {found} (stamped "
                    f"{stamped}); its row is read from {self.file.path} once written")
            waited = found
            self._sleep_while_held_by(found)

    def _sleep_while_held_by(self, holder: Claimant) -> None:
        """Sleep until the claim `holder` made is gone or replaced, POLL_S at most."""
        deadline = time.monotonic() + POLL_S
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(CLAIM_CHECK_S, left))
            now = self._holder()
            if now is None or now.token != holder.token:
                return

    def take(self) -> dict[str, Any] | Claimant | None:
        """At once, under the file's lock: the file's row to use, or the claim of the live
        search measuring the layout, or None: this search holds the claim now. Ctrl-C waits
        for the lock to be let go, so that no claim is left half made."""
        with deferring_interrupts(), self.file.locked():
            recorded = self._recorded()
            return recorded if recorded is not None else self._claim()

    def stamp(self) -> None:
        """Tell other searches this one still runs: the claim's time is now."""
        if self.held and self._claimant() == self.token:
            os.utime(self.path)

    def release(self) -> None:
        """Remove the claim, if this search holds it (another may have taken it over). A
        Ctrl-C waits for it to be gone: left behind by a live process (a notebook's), it
        would keep the searches of this host waiting for a run nobody makes."""
        if not self.held:
            return
        self.held = False
        _HELD_HERE.discard(self.token)
        with deferring_interrupts(), self.file.locked():
            if self._claimant() == self.token:
                self.path.unlink(missing_ok=True)

    def _recorded(self) -> dict[str, Any] | None:
        """The file's last row of the layout, if it is one to use (see the class)."""
        latest: tuple[int, dict[str, Any]] | None = None
        for position, run in enumerate(self.file.runs()):
            if measurement_key(run) == self.key:
                latest = position, run
        if latest is None:
            return None
        position, run = latest
        return run if position >= self.since or run["status"] not in self.retry else None

    def _claim(self) -> Claimant | None:
        """Make the claim, or take over one whose search is gone; the live claimant else."""
        temporary = self.path.with_name(f".{self.token}.tmp")
        try:
            self.path.parent.mkdir(exist_ok=True)
            temporary.write_text(json.dumps({"pid": os.getpid(), "host": HOST,
                                             "token": self.token, "trial": self.trial}))
            while True:
                try:
                    # Whole or absent to a reader: the content is written before the link.
                    os.link(temporary, self.path)
                    break
                except FileExistsError:
                    holder = self._holder()
                    if holder is None:
                        continue  # released since: claim it again
                    why = holder.gone(time.time())
                    if not why:
                        return holder
                    say(f"{self.trial}: {why}; launching it here")
                    os.replace(temporary, self.path)
                    break
        except OSError as error:
            say(f"{self.trial}: cannot claim it in {self.path.parent} ({error}); launching it "
                f"unclaimed, so a search sharing {self.file.path} may launch it too")
            return None
        finally:
            # Where the folder cannot be entered (or is a file) this fails as the write
            # did, with nothing to remove: the launch goes on unclaimed.
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
        self.held = True
        _HELD_HERE.add(self.token)
        return None

    def _holder(self) -> Claimant | None:
        """Who holds the claim (None: nobody now)."""
        try:
            stamped = self.path.stat().st_mtime
        except FileNotFoundError:
            return None
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except PermissionError:  # another user's, under a narrow umask: judged by its time
            return Claimant(pid=None, host="", stamped=stamped, token="")
        try:
            record = json.loads(text)
            return Claimant(pid=int(record["pid"]), host=str(record["host"]),
                            stamped=stamped, token=str(record["token"]))
        except (KeyError, TypeError, ValueError):  # not a claim of ours: judged by its time
            return Claimant(pid=None, host="", stamped=stamped, token="")

    def _claimant(self) -> str:
        """The token of the claim there now ("" when none)."""
        holder = self._holder()
        return "" if holder is None else holder.token


@contextlib.contextmanager
def claimed(file: MeasurementFile, row: Mapping[str, Any], trial: str, *, since: int,
            retry: Collection[str], wait: bool = True,
            ) -> Iterator[dict[str, Any] | Claimant | None]:
    """The row another search recorded of the layout (waited for while one measures it),
    or None: this search launches it, its claim stamped until the block ends, then removed.
    With `wait=False` a layout another live search measures is not waited for: its
    Claimant is given instead, so that a search with other layouts to measure launches
    those first and comes back for this one's row. `trial` names the launch in the lines
    said."""
    claim = LayoutClaim(file, row, trial, since=since, retry=retry)
    try:
        found = claim.acquire() if wait else claim.take()
        if found is not None:
            yield found
            return
        with Heartbeat(claim.stamp):
            yield None
    finally:
        claim.release()
