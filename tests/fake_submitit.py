"""A stand-in for submitit (no Slurm here): an executor whose jobs have already run.

    launcher = SlurmLauncher(settings, executor_factory=FakeExecutor)
    parameters, function, args = FakeExecutor.submitted[-1]
    executor = executor_of(JobStillRunning)   # a FakeJob of its own; its jobs: executor.jobs
"""

from __future__ import annotations

from typing import Any, ClassVar

STEP_LOG = (" iteration        4/       6 | consumed samples: 4 | elapsed time per iteration "
            "(ms): 3000.0 | throughput per GPU (TFLOP/s/GPU): 150.0 |")
"""A job's output: one timed step after 3 warm-up iterations, 3 s: LLaMA 7B's 64 x 2048
tokens on 8 A100s, at least 225 TFLOP/s a GPU (a faster step is beyond an A100's peak, and
stops a measured search as run on other GPUs)."""


class FakeJob:
    """A job that has ended: one exit code per node, STEP_LOG on stdout."""

    cancelled = False

    def __init__(self, codes: list[int]) -> None:
        self.codes = codes

    def wait(self) -> None:
        pass  # ended already

    def done(self) -> bool:
        return True

    def results(self) -> list[int]:
        return self.codes

    def stdout(self) -> str:
        return STEP_LOG

    def stderr(self) -> str:
        return ""

    def cancel(self, check: bool = True) -> None:
        self.cancelled = True


class JobStillRunning(FakeJob):
    """A job still running as Ctrl-C is pressed while the search waits for it."""

    def wait(self) -> None:
        raise KeyboardInterrupt

    def results(self) -> list[int]:
        raise KeyboardInterrupt  # submitit's results() waits first

    def done(self) -> bool:
        return False


class FakeExecutor:
    """Submits a `job_type` of as many tasks as nodes, and keeps every submission."""

    submitted: ClassVar[list[tuple[dict[str, Any], Any, tuple[Any, ...]]]] = []
    job_type: ClassVar[type[FakeJob]] = FakeJob
    jobs: ClassVar[list[FakeJob]] = []

    def __init__(self, folder: Any) -> None:
        self.folder = folder

    def update_parameters(self, **parameters: Any) -> None:
        self.parameters = parameters

    def submit(self, function: Any, *args: Any) -> FakeJob:
        FakeExecutor.submitted.append((self.parameters, function, args))
        job = self.job_type([0] * self.parameters["nodes"])
        self.jobs.append(job)
        return job


def executor_of(job_type: type[FakeJob]) -> type[FakeExecutor]:
    """A FakeExecutor that submits `job_type` and keeps the jobs in a list of its own."""
    return type(f"ExecutorOf{job_type.__name__}", (FakeExecutor,),
                {"job_type": job_type, "jobs": []})
