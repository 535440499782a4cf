"""Helpers for testing layoutsearch and its plug-ins on a CPU.

A fake Megatron-LM (`fake_megatron/pretrain_gpt.py` and `fake_torchrun`) prints real-format
logs priced by the analytic model, with failures injected by environment variable; and a
conformance suite that any cost model or driver can run.

    model = fake_measured_model(tmp_path, top_k=8, inject="2=crash,3=hang")
    check_cost_model(MyCostModel())
    check_driver(MyDriver())
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.costs import build_cost_model
from layoutsearch.costs.measured import MeasuredCostModel
from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.megatron.launchers import LocalLauncher
from layoutsearch.megatron.settings import MegatronSettings
from layoutsearch.testing.conformance import (
    check_cost_model,
    check_driver,
    conformance_candidates,
    conformance_problem,
)

FAKE_MEGATRON_PATH = Path(__file__).resolve().parent / "fake_megatron"
"""A folder that looks like a Megatron-LM checkout: it holds the fake `pretrain_gpt.py`."""
LAUNCHES_FILE = "launches.txt"
"""The fake's launch list, one argv per line, in the settings' `workdir`: the launch numbers
`inject` counts."""


def fake_megatron_settings(workdir: str | Path, *, inject: str = "", sleep_s: float = 0.0,
                           timeout_s: float = 60.0, gpu: str = "a100_80gb",
                           train_iters: int = 6, warmup_iters: int = 3,
                           cost_model: str = "analytic") -> MegatronSettings:
    """Settings that run the fake Megatron-LM locally, with logs and a launch count in `workdir`.

    `inject` fails chosen launches: "2=crash,3=hang,4=nccl,5=oom" (launch numbers count
    from 1 in `workdir/launches.txt`; "*" means every launch). `sleep_s` pauses after each
    iteration, `cost_model` prices the fake run as a run on `gpu` (a catalog GPU name: the
    job's cluster's, so that the rows' figures are of the GPU they name).
    """
    _check_injections(inject)
    if gpu not in clusters_by_gpu():
        # The fake would fail every launch at its catalog lookup.
        raise LayoutSearchError("fake Megatron-LM: " + unknown_name_message(
            "GPU", gpu, clusters_by_gpu()))
    if not sleep_s >= 0:
        raise LayoutSearchError(f"fake Megatron-LM: sleep_s={sleep_s!r} must be >= 0 seconds")
    workdir = Path(workdir).resolve()  # the fake runs in its own folder
    return MegatronSettings(
        megatron_path=str(FAKE_MEGATRON_PATH),
        python=sys.executable,
        # By path, not -m: the fake needs only the standard library, and -m would import
        # the whole package first (about a second per launch).
        torchrun=(sys.executable, str(Path(__file__).resolve().parent / "fake_torchrun.py")),
        launcher="local",
        train_iters=train_iters,
        warmup_iters=warmup_iters,
        timeout_s=timeout_s,
        log_dir=str(workdir / "logs"),
        env={
            "LAYOUTSEARCH_FAKE_INJECT": inject,
            "LAYOUTSEARCH_FAKE_LAUNCHES": str(workdir / LAUNCHES_FILE),
            "LAYOUTSEARCH_FAKE_SLEEP_S": str(sleep_s),
            "LAYOUTSEARCH_FAKE_GPU": gpu,
            "LAYOUTSEARCH_FAKE_COST_MODEL": cost_model,
        },
    )


FAILURE_KINDS = ("crash", "hang", "nccl", "oom")
"""What the fake can be told to do at a launch (fake_megatron/pretrain_gpt.py)."""


def _check_injections(inject: str) -> None:
    """Refuse an `inject` entry the fake would ignore, naming it and the form it takes."""
    for item in filter(None, (part.strip() for part in inject.split(","))):
        number, _, kind = item.partition("=")
        if not (number == "*" or (number.isdigit() and int(number) >= 1)) \
                or kind not in FAILURE_KINDS:
            raise LayoutSearchError(
                f"fake Megatron-LM: inject entry {item!r} must be LAUNCH=KIND, LAUNCH a launch "
                f"number from 1 or '*' (every launch), KIND one of {', '.join(FAILURE_KINDS)}")


def fake_measured_model(workdir: str | Path, *, prescreen: str | None = "analytic",
                        top_k: int | None = None, measurements: str | Path | None = None,
                        **fake: Any) -> MeasuredCostModel:
    """A measured cost model on the fake Megatron-LM, measurements in `workdir` (in
    `workdir/measurements.csv` unless `measurements` names another file).

    Its launcher runs every layout as one fake torchrun, however many nodes it spans (a
    real `local` launcher runs one node), and holds no GPUs: the fake trials of searches
    sharing a file run at once, as Slurm jobs would. `fake` goes to
    `fake_megatron_settings`.
    """
    settings = fake_megatron_settings(workdir, **fake)
    return MeasuredCostModel(
        settings=settings, measurements=measurements or Path(workdir) / "measurements.csv",
        launcher=LocalLauncher(settings, max_nodes=None, holds_gpus=False),
        prescreen=build_cost_model(prescreen) if prescreen else None, top_k=top_k)


def launches(workdir: str | Path) -> list[str]:
    """The argv of every fake launch so far, one string each."""
    path = Path(workdir) / LAUNCHES_FILE
    return path.read_text().splitlines() if path.is_file() else []


def running_trials(workdir: str | Path) -> list[int]:
    """Pids of the fake's processes still running for `workdir`: torchrun, its rank and
    what they started, found by the environment they inherit (Linux /proc; empty
    elsewhere). A zombie shows no environment: it holds nothing."""
    launches_file = Path(workdir).resolve() / LAUNCHES_FILE
    marker = f"LAYOUTSEARCH_FAKE_LAUNCHES={launches_file}\0".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes():
                pids.append(int(environ.parent.name))
        except OSError:  # gone, or not ours
            continue
    return pids


__all__ = [
    "FAILURE_KINDS",
    "FAKE_MEGATRON_PATH",
    "LAUNCHES_FILE",
    "check_cost_model",
    "check_driver",
    "conformance_candidates",
    "conformance_problem",
    "fake_measured_model",
    "fake_megatron_settings",
    "launches",
    "running_trials",
]
