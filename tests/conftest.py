"""Shared fixtures: one valid measurement-schema row, one-row candidate tables, the step
time an MFU stands for, and the `layoutsearch` command run in this process; files the tests
write are not flushed to the disk."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import event  # optuna's RDB storage: installed with optuna
from sqlalchemy.engine import Engine

from layoutsearch.catalog import clusters_by_gpu, load_cluster, load_model
from layoutsearch.costs.shapes import Shapes
from layoutsearch.layout import Layout
from layoutsearch.measurements import OPTIONAL_DEFAULTS
from layoutsearch.megatron import gpu_lock
from layoutsearch.specs import Job, ModelSpec
from tests.commands import Command, command_in_this_process


@pytest.fixture(autouse=True, scope="session")
def files_stay_in_the_page_cache() -> Iterator[None]:
    """No fsync in this process: studies (SQLite, journal files) and measurement files are
    written as usual, but not forced to the disk.

    What the tests check of them (a killed search resumes, workers share a study) needs the
    writes to reach the operating system, not the disk: a process killed with SIGKILL loses
    nothing the kernel holds ("if the application running SQLite crashes, the data will be
    safe", SQLite's PRAGMA synchronous = OFF). Forcing each commit to the disk costs ~10 ms
    on a virtual disk, and an optuna trial makes a dozen commits. Processes the tests start
    sync as a user's would.
    """
    fsync = os.fsync
    os.fsync = lambda fd: None  # journal files (optuna) and measurements.csv rows

    def unsynced(connection: Any, record: Any) -> None:  # optuna's SQLite storages
        if isinstance(connection, sqlite3.Connection):
            connection.execute("PRAGMA synchronous = OFF")

    event.listen(Engine, "connect", unsynced)
    yield
    event.remove(Engine, "connect", unsynced)
    os.fsync = fsync


@pytest.fixture(autouse=True, scope="session")
def gpus_of_the_tests_own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The local launcher's lock on this machine's GPUs (megatron/gpu_lock.py) in a folder
    of the tests' own: their fake trials do not wait for a real search's trial here, nor
    hold up one, for the tests run in this process."""
    machines = gpu_lock.LOCK_FOLDER
    gpu_lock.LOCK_FOLDER = tmp_path_factory.mktemp("gpu_lock")
    yield
    gpu_lock.LOCK_FOLDER = machines


@pytest.fixture
def measurement_row() -> dict[str, Any]:
    """A valid measurement-schema row: LLaMA 13B, 2k tokens, 64 A100s, tp2 pp1 dp32."""
    return {
        "model": "llama_13b", "num_layers": 40, "hidden_size": 5120, "ffn_hidden_size": 13824,
        "num_attention_heads": 40, "num_query_groups": 40, "vocab_size": 32000,
        "seq_length": 2048, "swiglu": True, "untie_embeddings": True, "gpu": "a100_80gb",
        "num_gpus": 64, "gpus_per_node": 8, "tp": 2, "pp": 1, "dp": 32,
        "micro_batch_size": 1, "global_batch_size": 2048, "sequence_parallel": False,
        "attention": "flash2", "rmsnorm_kernel": True, "recompute": "none", "status": "ok",
        "step_time_s": 30.0, "mfu": 0.6,
    }


CandidateFactory = Callable[..., pd.DataFrame]


@pytest.fixture
def candidate() -> CandidateFactory:
    """`candidate("llama_30b", tp=8, num_gpus=64)`: a one-row candidate table as
    SearchSpace.candidates builds it (job columns + layout columns, dp derived)."""

    def build(model: str | ModelSpec, *, cluster: str = "a100_80gb", num_gpus: int = 64,
              seq_length: int = 2048, global_batch_size: int = 2048,
              **knobs: Any) -> pd.DataFrame:
        spec = load_model(model) if isinstance(model, str) else model
        job = Job(model=spec, cluster=load_cluster(cluster), num_gpus=num_gpus,
                  seq_length=seq_length, global_batch_size=global_batch_size)
        model_parallel = knobs.get("tp", 1) * knobs.get("pp", 1) * knobs.get("cp", 1)
        # As SearchSpace.candidates does: dp is 0 where tp·pp·cp does not divide the GPUs.
        whole = num_gpus % model_parallel == 0
        knobs.setdefault("dp", num_gpus // model_parallel if whole else 0)
        return pd.DataFrame([{**job.columns(), **Layout(**knobs).to_dict()}])

    return build


@pytest.fixture
def step_time_for() -> Callable[[dict[str, Any], float], float]:
    """`step_time_for(row, 0.6)`: the seconds per step at which a measurement row's job runs
    at that MFU by the study's formula, so that the row's step time and MFU agree."""

    def step_time(row: dict[str, Any], mfu: float) -> float:
        table = pd.DataFrame([{**OPTIONAL_DEFAULTS, **row}])
        at_one_second = Shapes.of(table, clusters_by_gpu()).mfu(np.ones(1))
        return float(at_one_second[0]) / mfu

    return step_time


@pytest.fixture
def run_layoutsearch(monkeypatch: pytest.MonkeyPatch,
                     capfd: pytest.CaptureFixture[str]) -> Command:
    """`run_layoutsearch("num_gpus=64", cwd=tmp_path)`: the `layoutsearch` command run in this
    process (tests/commands.py)."""
    return command_in_this_process(monkeypatch, capfd)
