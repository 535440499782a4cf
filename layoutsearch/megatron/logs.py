"""Read a Megatron-LM training log: step time, TFLOP/s per GPU, peak memory, or what failed.

Formats (Megatron-LM `training.py::training_log` and `utils.py::report_memory`, several
versions): the last rank prints one line per logged iteration,

     [2025-09-05 16:08:25] iteration        2/    2000 | consumed samples:          256 |
     elapsed time per iteration (ms): 11182.0 | throughput per GPU (TFLOP/s/GPU): 128.2 | ...

(older versions: no timestamp, no throughput; 2026 main: microseconds in the timestamp;
the second number is --train-iters, so the line of the last iteration says the run trained
to its end), and each data-parallel rank 0 prints once (2026 main: after iterations 1 and 2,
to two decimals; older: unrounded, "cached" for "reserved")

    [Rank 0] (after 1 iterations) memory (MB) | allocated: 26222.7 | max allocated: 63359.8 |
    reserved: 66802.0 | max reserved: 66802.0

    result = parse_log(text, warmup_iters=3)
    result.status, result.step_time_s, result.tflops_per_gpu, result.peak_memory_gib
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

ITERATION = re.compile(
    r"iteration\s+(?P<iteration>\d+)\s*/\s*(?P<total>\d+)\s*\|.*?"
    r"elapsed time per iteration \(ms\):\s*(?P<ms>[\d.]+)"
    r"(?:.*?throughput per GPU \(TFLOP/s/GPU\):\s*(?P<tflops>[\d.]+))?"
)
MEMORY = re.compile(r"memory \(MB\)\s*\|\s*allocated:\s*[\d.]+\s*\|\s*max allocated:\s*"
                    r"(?P<max_allocated>[\d.]+)")
# Out of memory, as PyTorch says it (torch.OutOfMemoryError from 2.5, torch.cuda.Out... before,
# "CUDA error: out of memory" from a kernel launch), as Transformer Engine's checks say it
# ("CUDA Error: out of memory"), as NCCL says it when its buffers do not fit ("Cuda failure
# 'out of memory'", "Failed to CUDA calloc") and as cuBLAS says it when its workspace does not.
OOM = re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError|CUDA out of memory|"
                 r"(?i:CUDA error: out of memory)|Cuda failure (?:\d+ )?'out of memory'|"
                 r"Failed to CUDA calloc|CUBLAS_STATUS_ALLOC_FAILED")
COLLECTIVE_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout")
"""NCCL's watchdog gave up on a collective: the ranks hung. PyTorch may go on to report a
bogus out-of-memory ("Tried to allocate more than 1EB") as a side effect; that is no OOM."""
KERNEL_REFUSED = re.compile(
    r"No dot product attention support for the provided inputs|"
    r"No dot product attention backend is available for the provided inputs|"
    r"FlashAttention (?:forward |backward )?only supports head dimension at most|"
    r"head_size should be a multiple of 8|Head size must be a multiple of 8|"
    r"FlashAttention only supports Ampere GPUs or newer"
)
"""An attention kernel refused the shape or the GPU (Transformer Engine's backend selection,
flash-attn's TORCH_CHECKs): the schema's `unavailable`, not an error of the run."""
STACK_FRAME = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?(?:frame #\d+:|Exception raised from )")
"""C++ stack-dump lines: they name functions, not what went wrong."""
FAILURE = re.compile(
    r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|DistBackendError|"
    r"Segmentation fault|can't open file|"
    r"No such file or directory|\w+(?:Error|Exception): \S"
)
"""Lines that say what went wrong (an exception with its message, NCCL, a signal)."""
KILLED_BY_SIGNAL = re.compile(r"Signal \d+ \(SIG\w+\) received by PID|"
                              r"failed \(exitcode: -\d+\)")
"""torchrun's word that a rank died of a signal (a negative exit code: SIGSEGV, SIGABRT,
SIGKILL from the host's OOM killer), when the rank itself printed nothing more specific."""
SETUP_FAILURE = re.compile(
    r"No module named '(?:torch|megatron)[\w.]*'|"
    r"Error while finding module specification for 'torch|"
    r"can't open file .*pretrain_gpt\.py|"
    r"No such file or directory: '(?:scontrol|srun|sbatch)'|"
    r"command not found|"
    r"\w+\.py: error: |"
    r"fused_weight_gradient_mlp_cuda module is not found"
)
"""A launch that failed before training in a way every layout would: no torch or Megatron-LM
for the configured Python, no training script, no Slurm tools where the job ran, a flag the
training script refuses (Megatron-LM's parse_args is argparse's: "pretrain_gpt.py: error:
unrecognized arguments: --foo", "... error: argument --bar: invalid int value: 'x'", exit
status 2), or fused weight-gradient accumulation (on by default) without Apex's CUDA
extension: the output layer of every GPT model is Megatron-LM's own ColumnParallelLinear,
which raises "ColumnParallelLinear was called with gradient_accumulation_fusion set to True
but the custom CUDA extension fused_weight_gradient_mlp_cuda module is not found"
(megatron/core/tensor_parallel/layers.py) whatever the layout; --no-gradient-accumulation-
fusion in extra_args is the remedy. Not a measurement of the layout (the measured cost
model stops instead of recording it)."""
GENERIC_FAILURE = re.compile(r"Traceback \(most recent call last\)|ChildFailedError")
"""Lines that only say that something went wrong (used when nothing more specific is)."""
EXCERPT_LINES = 30
EXCERPT_CHARS = 4000


@dataclass(frozen=True, kw_only=True, slots=True)
class LogResult:
    """What one trial's log says."""

    status: str
    """`ok`, `oom`, `unavailable`, `timeout` or `error` (the measurement schema's statuses)."""
    step_time_s: float = float("nan")
    """Mean seconds per iteration after the warm-up (NaN unless ok)."""
    tflops_per_gpu: float = float("nan")
    """Megatron-LM's own throughput per GPU after the warm-up (its FLOP convention)."""
    peak_memory_gib: float = float("nan")
    """Largest `max allocated` over the ranks that reported memory, GiB."""
    iterations: int = 0
    """Logged iterations found (warm-up included)."""
    message: str = ""
    """One line on why it failed; for an ok run, what went wrong after its last iteration
    ("" when nothing did)."""
    excerpt: str = ""
    """The lines around the failure, kept for the user."""
    setup_problem: bool = False
    """The run failed before its first iteration for a reason that holds for every layout
    (SETUP_FAILURE): nothing was learned about this layout."""


def _excerpt(lines: list[str], index: int | None) -> str:
    if index is None:
        chosen = lines[-EXCERPT_LINES:]
    else:
        chosen = lines[max(0, index - 5): index + EXCERPT_LINES - 5]
    return "\n".join(chosen)[-EXCERPT_CHARS:]


def _first(lines: list[str], pattern: re.Pattern[str]) -> int | None:
    return next((i for i, line in enumerate(lines) if pattern.search(line)), None)


def _last_failure_line(lines: list[str]) -> int | None:
    # A hung collective is the cause of all that follows it (the abort, the signal). Else
    # the last specific line usually names the exception (after the traceback frames);
    # torchrun's own summary comes after it and says less: a signal's name when the rank
    # printed nothing, else only ChildFailedError.
    for pattern in (COLLECTIVE_TIMEOUT, FAILURE, KILLED_BY_SIGNAL, GENERIC_FAILURE):
        hits = [i for i, line in enumerate(lines)
                if pattern.search(line) and not STACK_FRAME.search(line)]
        if hits:
            return hits[-1]
    return None


def parse_log(text: str, *, warmup_iters: int = 3, returncode: int | None = 0,
              timed_out: bool = False) -> LogResult:
    """The status and figures of one trial from its combined stdout and stderr."""
    lines = text.splitlines()
    logged = [m for m in map(ITERATION.search, lines) if m]
    iterations = [(int(m["iteration"]), float(m["ms"]),
                   float(m["tflops"]) if m["tflops"] else np.nan) for m in logged]
    # Every rank that reports prints at once: two reports may share one line.
    memory = [float(m["max_allocated"]) for line in lines for m in MEMORY.finditer(line)]
    peak = max(memory) / 1024.0 if memory else float("nan")
    found = len(iterations)
    finished = bool(logged) and int(logged[-1]["iteration"]) == int(logged[-1]["total"])
    failed = returncode not in (0, None) or not iterations
    # An out-of-memory line counts only in a run that did not finish: NCCL warns "Cuda
    # failure 'out of memory'" and carries on, and a run that exits 0 trained.
    oom_at = _first(lines, OOM) if failed or timed_out else None
    hung_at = _first(lines, COLLECTIVE_TIMEOUT)
    if oom_at is not None and (hung_at is None or oom_at < hung_at):
        line = lines[oom_at].strip()
        return LogResult(status="oom", peak_memory_gib=peak, iterations=found,
                         message=line[:300], excerpt=_excerpt(lines, oom_at))
    if finished and (failed or timed_out):
        # It trained to its last iteration, then hung or died on the way out (a teardown
        # that never returns after "[after training is done]", NVIDIA-NeMo/Megatron-Bridge
        # #3427; NCCL's abort at exit, "terminate called after throwing an instance of
        # 'c10::DistBackendError'"): every figure is in, and the exit is no fault of the
        # layout.
        return _after_the_last_iteration(
            _trained(iterations, warmup_iters, peak), lines, returncode, timed_out)
    refused_at = _first(lines, KERNEL_REFUSED)
    if failed and refused_at is not None:
        line = lines[refused_at].strip()
        return LogResult(status="unavailable", peak_memory_gib=peak, iterations=found,
                         message=line[:300], excerpt=_excerpt(lines, refused_at))
    if timed_out:
        return LogResult(status="timeout", peak_memory_gib=peak, iterations=found,
                         message=f"killed at the time limit after {found} logged iterations",
                         excerpt=_excerpt(lines, None))
    setup_at = _first(lines, SETUP_FAILURE) if failed and not iterations else None
    if setup_at is not None:
        return LogResult(status="error", message=lines[setup_at].strip()[:300],
                         excerpt=_excerpt(lines, setup_at), setup_problem=True)
    if failed:
        at = _last_failure_line(lines)
        why = lines[at].strip() if at is not None else (
            f"exit status {returncode}" if returncode else "no iteration was logged")
        return LogResult(status="error", peak_memory_gib=peak, iterations=found,
                         message=why[:300], excerpt=_excerpt(lines, at))
    return _trained(iterations, warmup_iters, peak)


def _after_the_last_iteration(result: LogResult, lines: list[str], returncode: int | None,
                              timed_out: bool) -> LogResult:
    """`result`, an ok run's, with what went wrong once it had logged its last iteration."""
    at = _last_failure_line(lines)
    said = f": {lines[at].strip()}" if at is not None else ""
    if timed_out:
        what = "then did not exit and was killed at the time limit"
    else:
        what = f"then exited with status {returncode}{said}"
    return replace(result, message=f"every iteration was logged, {what}"[:300],
                   excerpt=_excerpt(lines, at))


def _trained(iterations: list[tuple[int, float, float]], warmup_iters: int,
             peak: float) -> LogResult:
    """The figures of a run that logged `iterations` (number, ms, TFLOP/s per GPU)."""
    # Drop the warm-up iterations (the first logged lines average allocator, NCCL and
    # kernel-autotuning start-up in); keep at least the last one. Megatron-LM logs a fresh
    # process's iteration 1 without resetting its interval timer (training_log's
    # `should_reset = not is_first_iteration`), so the next line averages iteration 1 in.
    averages_first = iterations[1][0] if len(iterations) > 1 and iterations[0][0] == 1 else None
    steady = [row for row in iterations
              if row[0] > warmup_iters and row[0] != averages_first] or iterations[-1:]
    times = np.array([row[1] for row in steady]) / 1000.0
    tflops = np.array([row[2] for row in steady])
    return LogResult(
        status="ok",
        step_time_s=float(times.mean()),
        tflops_per_gpu=float(np.nanmean(tflops)) if np.isfinite(tflops).any() else float("nan"),
        peak_memory_gib=peak,
        iterations=len(iterations),
    )
