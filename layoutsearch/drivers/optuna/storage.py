"""Where optuna studies live, and which of their trials lost their worker.

Any optuna storage URL (`sqlite:///...`, `postgresql://...`), a journal file (a path ending
`.log`/`.journal`, or `journal://PATH`), or memory. SQLite transactions take the write lock
first, so two workers never start one queued trial. A worker killed mid-trial leaves a
RUNNING trial: on restart it is failed, so its layout is open again.

    storage = open_storage("sqlite:///study.db")
"""

from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, InMemoryStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from layoutsearch.errors import LayoutSearchError

JOURNAL_SUFFIXES = (".log", ".journal")
JOURNAL_SCHEME = "journal://"
UNCLAIMED_S = 30.0
"""A running trial without a worker after this long was orphaned before it was claimed."""


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
            return JournalStorage(JournalFileBackend(journal))
        if "://" not in url:
            raise ValueError("not a storage URL")
        if not url.startswith("sqlite"):
            return RDBStorage(url)
        # Wait for other workers' writes instead of failing with "database is locked".
        storage = RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
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


def alive(worker: str) -> bool:
    """Whether the worker `host:pid` may still run; only this host's processes are checked."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def release(storage: BaseStorage) -> None:
    """Close the parent's database connections before forking workers that open their own."""
    if isinstance(storage, RDBStorage):
        storage.engine.dispose()


def fail_dead_workers(study: optuna.Study, storage: BaseStorage) -> None:
    """Fail running trials left by a killed worker of this host, so their layouts reopen.

    A trial is claimed (its `worker` attribute set) right after it is created; one still
    unclaimed after UNCLAIMED_S lost its worker in between, wherever it ran.
    """
    now = datetime.datetime.now()
    study_id = storage.get_study_id_from_name(study.study_name)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get("worker")
        started = trial.datetime_start or now
        if (not alive(worker) if worker
                else (now - started).total_seconds() > UNCLAIMED_S):
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            storage.set_trial_user_attr(trial_id, "reason", "worker died")
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
