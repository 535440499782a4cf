"""Where optuna studies live, and which of their trials lost their worker.

Any optuna storage URL (`sqlite:///...`, `postgresql://...`), a journal file (a path ending
`.log`/`.journal`, or `journal://PATH`), or memory. SQLite transactions take the write lock
first, so two workers never start one queued trial, and a Ctrl-C waits for the storage call
it lands in to end, so that no write is left half made. A worker killed mid-trial leaves a
RUNNING trial: it is failed, so its layout is open again, by the next search on its host
(the worker's pid is gone) or by any search elsewhere once its heartbeat is stale.

    storage = open_storage("sqlite:///study.db")
"""

from __future__ import annotations

import datetime
import functools
import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, InMemoryStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, Trial, TrialState

from layoutsearch import liveness
from layoutsearch.errors import LayoutSearchError
from layoutsearch.interrupts import deferring_interrupts
from layoutsearch.liveness import HEARTBEAT_S, HOST, STALE_S, pid_alive

JOURNAL_SUFFIXES = (".log", ".journal")
JOURNAL_SCHEME = "journal://"
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
"""How a path that names an SQLite file ends: given bare, it is told its URL."""
UNCLAIMED_S = 30.0
"""A running trial without a worker after this long was orphaned before it was claimed."""

Storage = TypeVar("Storage", bound=BaseStorage)


def _holding_interrupts(storage: type[Storage]) -> type[Storage]:
    """`storage` with each method of its own holding a Ctrl-C until it returns.

    A Ctrl-C raised inside a write (between SQLite's BEGIN IMMEDIATE and its COMMIT, while
    a journal's lock file is held) left it half made: a connection that kept the write
    lock, so that failing the trial in flight then waited for it, and stopped the search
    with "database is locked" instead of the Ctrl-C. Held, it is raised once the call has
    returned (a second press still at once). _CachedStorage calls the RDB storage's private
    methods too: every plain function the class defines is wrapped."""

    def holding(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            with deferring_interrupts():
                return method(self, *args, **kwargs)
        return call

    methods = {name: holding(member) for name, member in vars(storage).items()
               if inspect.isfunction(member) and not name.startswith("__")}
    return type(f"Holding{storage.__name__}", (storage,), methods)


HoldingRDBStorage = _holding_interrupts(RDBStorage)
HoldingJournalStorage = _holding_interrupts(JournalStorage)


def open_storage(url: str | None) -> BaseStorage:
    """An optuna storage from a URL: none (in memory), an RDB URL, or a journal file.

    A journal file is a path ending in `.log`/`.journal`, or any path as `journal://PATH`.
    """
    if not url:
        return InMemoryStorage()
    journal = url[len(JOURNAL_SCHEME):] if url.startswith(JOURNAL_SCHEME) else None
    if journal is None and "://" not in url and url.endswith(JOURNAL_SUFFIXES):
        journal = url
    try:
        if journal is not None:
            if not Path(journal).parent.is_dir():
                raise FileNotFoundError(f"folder {str(Path(journal).parent)!r} does not exist")
            return HoldingJournalStorage(JournalFileBackend(journal))
        if "://" not in url:
            # A database file given as a path: the SQLite URL of that very file.
            sqlite = f"; for an SQLite file, sqlite:///{Path(url).expanduser().absolute()}" \
                if Path(url).suffix in SQLITE_SUFFIXES else ""
            raise ValueError(f"not a storage URL{sqlite}")
        if not url.startswith("sqlite"):
            return HoldingRDBStorage(url)
        # sqlite:///relative.db, sqlite:////absolute.db, maybe with ?options after it; a
        # path after two slashes alone (sqlite://study.db) is SQLAlchemy's to refuse, with
        # the forms it takes, not a folder named 'sqlite:' to look for.
        database = url.split(":///", 1)[1].split("?", 1)[0] if ":///" in url else ""
        if database and database != ":memory:" and not Path(database).parent.is_dir():
            # SQLite says only "unable to open database file".
            raise FileNotFoundError(f"folder {str(Path(database).parent)!r} does not exist")
        # Wait for other workers' writes instead of failing with "database is locked".
        storage = HoldingRDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
        serialize_sqlite(storage.engine)
        return storage
    except Exception as error:
        raise LayoutSearchError(
            f"driver.storage={url!r}: cannot open it ({type(error).__name__}: {error}); use "
            "sqlite:///study.db, postgresql://user:password@host/db, a journal file ending "
            f"in {' or '.join(JOURNAL_SUFFIXES)}, or {JOURNAL_SCHEME}PATH"
        ) from None


def serialize_sqlite(engine: Any) -> None:
    """Make every SQLite transaction take the write lock first (BEGIN IMMEDIATE).

    SQLite ignores SELECT ... FOR UPDATE, so two workers could both read a queued trial as
    WAITING and both start it; taking the lock at BEGIN makes that read-then-write atomic.
    Recipe from SQLAlchemy's pysqlite notes ("Serializable isolation / Savepoints").
    """
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(connection: Any, record: Any) -> None:
        connection.isolation_level = None  # let the "begin" hook below issue BEGIN

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the hooks existed are dropped


def alive(trial: FrozenTrial, now: float | None = None) -> bool:
    """Whether the worker of a running trial may still run.

    On this host its process is looked up; elsewhere its heartbeat must be newer than
    STALE_S. A trial stamped by no heartbeat (a layoutsearch without them) counts as alive.
    """
    host, _, pid = str(trial.user_attrs.get("worker", "")).rpartition(":")
    if host != HOST:
        beat = trial.user_attrs.get("heartbeat")
        if not isinstance(beat, int | float):
            return True
        return (time.time() if now is None else now) - beat < STALE_S
    return not pid.isdigit() or pid_alive(int(pid))


class Heartbeat(liveness.Heartbeat):
    """Stamps a trial with the time now and every HEARTBEAT_S while its evaluation runs.

        with Heartbeat(trial):
            ...  # price the trial's layout
    """

    def __init__(self, trial: Trial, interval_s: float = HEARTBEAT_S) -> None:
        super().__init__(lambda: trial.set_user_attr("heartbeat", time.time()), interval_s)


def release(storage: BaseStorage) -> None:
    """Close the parent's database connections before forking workers that open their own."""
    if isinstance(storage, RDBStorage):
        storage.engine.dispose()


def fail_dead_workers(study: optuna.Study, storage: BaseStorage) -> None:
    """Fail running trials whose worker died (see `alive`), so their layouts reopen.

    A trial is claimed (its `worker` attribute set) right after it is created; one still
    unclaimed after UNCLAIMED_S lost its worker in between, wherever it ran. Two searches
    may fail one trial at once: the second finds it finished and leaves it.
    """
    now = datetime.datetime.now()
    study_id = storage.get_study_id_from_name(study.study_name)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        started = trial.datetime_start or now
        if (not alive(trial) if "worker" in trial.user_attrs
                else (now - started).total_seconds() > UNCLAIMED_S):
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            try:
                storage.set_trial_user_attr(trial_id, "reason", "worker died")
                storage.set_trial_state_values(trial_id, TrialState.FAIL)
            except UpdateFinishedTrialError:
                continue
