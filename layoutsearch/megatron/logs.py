"""Read a Megatron-LM training log: step time, TFLOP/s per GPU, peak memory, or what failed.

Formats (Megatron-LM `training.py::training_log` and `utils.py::report_memory`, several
versions): the last rank prints one line per logged iteration,

     [2025-09-05 16:08:25] iteration        2/    2000 | consumed samples:          256 |
     elapsed time per iteration (ms): 11182.0 | throughput per GPU (TFLOP/s/GPU): 128.2 | ...

(older versions: no timestamp, no throughput), and each data-parallel rank 0 prints once

    [Rank 0] (after 1 iterations) memory (MB) | allocated: 26222.7 | max allocated: 63359.8 |
    reserved: 66802.0 | max reserved: 66802.0

    result = parse_log(text, warmup_iters=3)
    result.status, result.step_time_s, result.tflops_per_gpu, result.peak_memory_gib
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

ITERATION = re.compile(
    r"iteration\s+(?P<iteration>\d+)\s*/\s*\d+\s*\|.*?"
    r"elapsed time per iteration \(ms\):\s*(?P<ms>[\d.]+)"
    r"(?:.*?throughput per GPU \(TFLOP/s/GPU\):\s*(?P<tflops>[\d.]+))?"
)
MEMORY = re.compile(r"memory \(MB\)\s*\|\s*allocated:\s*[\d.]+\s*\|\s*max allocated:\s*"
                    r"(?P<max_allocated>[\d.]+)")
# Both spellings of PyTorch's OOM: torch.OutOfMemoryError (2.5+) and torch.cuda.Out...
OOM = re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError|CUDA out of memory|"
                 r"CUDA error: out of memory")
FAILURE = re.compile(
    r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|DistBackendError|"
    r"ProcessGroupNCCL.*(?:Watchdog|timed out|Timeout)|Segmentation fault|can't open file|"
    r"No such file or directory|\w+(?:Error|Exception): \S"
)
"""Lines that say what went wrong (an exception with its message, NCCL, a signal)."""
GENERIC_FAILURE = re.compile(r"Traceback \(most recent call last\)|ChildFailedError")
"""Lines that only say that something went wrong (used when nothing more specific is)."""
EXCERPT_LINES = 30
EXCERPT_CHARS = 4000


@dataclass(frozen=True, kw_only=True, slots=True)
class LogResult:
    """What one trial's log says."""

    status: str
    """`ok`, `oom`, `timeout` or `error` (the measurement schema's statuses)."""
    step_time_s: float = float("nan")
    """Mean seconds per iteration after the warm-up (NaN unless ok)."""
    tflops_per_gpu: float = float("nan")
    """Megatron-LM's own throughput per GPU after the warm-up (its FLOP convention)."""
    peak_memory_gib: float = float("nan")
    """Largest `max allocated` over the ranks that reported memory, GiB."""
    iterations: int = 0
    """Logged iterations found (warm-up included)."""
    message: str = ""
    """One line on why it failed ("" when ok)."""
    excerpt: str = ""
    """The lines around the failure, kept for the user."""


def _excerpt(lines: list[str], index: int | None) -> str:
    if index is None:
        chosen = lines[-EXCERPT_LINES:]
    else:
        chosen = lines[max(0, index - 5): index + EXCERPT_LINES - 5]
    return "\n".join(chosen)[-EXCERPT_CHARS:]


def _first(lines: list[str], pattern: re.Pattern[str]) -> int | None:
    return next((i for i, line in enumerate(lines) if pattern.search(line)), None)


def _last_failure_line(lines: list[str]) -> int | None:
    # The last specific line usually names the exception (after the traceback frames);
    # torchrun's own ChildFailedError summary comes after it and says less.
    for pattern in (FAILURE, GENERIC_FAILURE):
        hits = [i for i, line in enumerate(lines) if pattern.search(line)]
        if hits:
            return hits[-1]
    return None


def parse_log(text: str, *, warmup_iters: int = 3, returncode: int | None = 0,
              timed_out: bool = False) -> LogResult:
    """The status and figures of one trial from its combined stdout and stderr."""
    lines = text.splitlines()
    iterations = [(int(m["iteration"]), float(m["ms"]),
                   float(m["tflops"]) if m["tflops"] else np.nan)
                  for m in map(ITERATION.search, lines) if m]
    memory = [float(m["max_allocated"]) for m in map(MEMORY.search, lines) if m]
    peak = max(memory) / 1024.0 if memory else float("nan")
    found = len(iterations)
    oom_at = _first(lines, OOM)
    if oom_at is not None:
        line = lines[oom_at].strip()
        return LogResult(status="oom", peak_memory_gib=peak, iterations=found,
                         message=line[:300], excerpt=_excerpt(lines, oom_at))
    if timed_out:
        return LogResult(status="timeout", peak_memory_gib=peak, iterations=found,
                         message=f"killed at the time limit after {found} logged iterations",
                         excerpt=_excerpt(lines, None))
    failed = returncode not in (0, None) or not iterations
    if failed:
        at = _last_failure_line(lines)
        why = lines[at].strip() if at is not None else (
            f"exit status {returncode}" if returncode else "no iteration was logged")
        return LogResult(status="error", peak_memory_gib=peak, iterations=found,
                         message=why[:300], excerpt=_excerpt(lines, at))
    # Drop the warm-up iterations (the first logged lines average allocator, NCCL and
    # kernel-autotuning start-up in); keep at least the last one.
    steady = [row for row in iterations if row[0] > warmup_iters] or iterations[-1:]
    times = np.array([row[1] for row in steady]) / 1000.0
    tflops = np.array([row[2] for row in steady])
    return LogResult(
        status="ok",
        step_time_s=float(times.mean()),
        tflops_per_gpu=float(np.nanmean(tflops)) if np.isfinite(tflops).any() else float("nan"),
        peak_memory_gib=peak,
        iterations=found,
    )
