"""What one finished trial of a measured search leaves: its name, the measurement row its
log gives, whether that row can be of the job's GPU at all, and the line that says it.

    job = job_of_row(row, clusters)
    measured = result_row(row, parse_log(text), job, "local", log_path)
    if beyond_the_gpu(measured, job): ...  # ran on other GPUs
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from layoutsearch.costs.measurement_file import measurement_key, plain_value
from layoutsearch.layout import LAYOUT_COLUMNS, Layout
from layoutsearch.measurements import JOB_KEY, OPTIONAL_DEFAULTS, REQUIRED_COLUMNS
from layoutsearch.megatron.logs import LogResult
from layoutsearch.specs import Job


def trial_name(row: Mapping[str, Any]) -> str:
    """A file name for the trial's log and script, one per measurement: the job fields a
    reader looks for, the layout, and a digest of every job field (model dimensions, GPU
    kind, batch), so that two jobs sharing a layout never share a log."""
    job = hashlib.sha1(repr(measurement_key(row)[:len(JOB_KEY)]).encode()).hexdigest()[:8]
    label = (f"{row['model']}_s{row['seq_length']}_g{row['num_gpus']}_"
             f"b{row['global_batch_size']}_{Layout.from_row(row).describe()}_{job}")
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label)


def result_row(row: Mapping[str, Any], result: LogResult, job: Job, launcher: str,
               log_path: Path) -> dict[str, Any]:
    """The measurement-schema row of a finished trial of the candidate `row` (of `job`): its
    job and layout, what its log says (`result`), its tokens/s and the study's MFU, and
    where it ran (`launcher`) and logged."""
    ok = result.status == "ok"
    tokens_per_s = job.tokens_per_step / result.step_time_s if ok else float("nan")
    # The study's MFU (Hagemann et al. 2023, after PaLM):
    # tokens/s × (6N + 12·L·h·s) / (GPUs × dense peak).
    peak = job.num_gpus * job.cluster.gpu.peak_tflops * 1e12
    mfu = tokens_per_s * job.model.paper_flops_per_token(job.seq_length) / peak if ok \
        else float("nan")
    out = {c: plain_value(row[c]) for c in (*REQUIRED_COLUMNS, *OPTIONAL_DEFAULTS) if c in row}
    out.update({c: plain_value(row[c]) for c in LAYOUT_COLUMNS})
    out.update(
        model=row["model"], gpus_per_node=job.cluster.gpus_per_node, status=result.status,
        step_time_s=result.step_time_s if ok else float("nan"), mfu=mfu,
        peak_memory_gib=result.peak_memory_gib, tflops_per_gpu=result.tflops_per_gpu,
        tokens_per_s=tokens_per_s, source=f"layoutsearch-measured:{launcher}",
        message=result.message.replace("\n", " ")[:300], log_path=str(log_path),
    )
    return out


def beyond_the_gpu(measured: Mapping[str, Any], job: Job) -> str:
    """Why a run's figures cannot have come from the job's GPU ("" when they can): more
    FLOPs a second than its dense peak, or more memory allocated than it has. Such a run
    ran on other GPUs than the job names (H100s searched as A100s read MFU ~1.8), and its
    row would be filed, and ranked, under the wrong GPU.

    The FLOPs are the fewest a run must execute: Megatron-LM's per-matmul count with the
    causal half of the attention scores left out, as a flash kernel skips it, and no
    embedding lookup. The study's count (its MFU) can pass the peak without that: its
    12·L·h·s counts the masked half, which at 128k tokens is most of a step's FLOPs."""
    gpu = job.cluster.gpu
    why = []
    executed_tflops = (float(measured["tokens_per_s"]) / job.num_gpus
                       * job.model.megatron_flops_per_token(job.seq_length) / 1e12)
    if executed_tflops > gpu.peak_tflops:
        why.append(f"its {float(measured['tokens_per_s']):,.0f} tokens/s on {job.num_gpus} "
                   f"GPUs execute at least {executed_tflops:.0f} TFLOP/s per GPU (MFU "
                   f"{float(measured['mfu']):.2f} by the study's count), above the "
                   f"{gpu.name}'s dense bf16 peak of {gpu.peak_tflops:g}")
    memory = float(measured["peak_memory_gib"])
    if memory > gpu.memory_gib:
        why.append(f"it allocated {memory:.1f} GiB on a GPU, more than the {gpu.name}'s "
                   f"{gpu.memory_gib:g} GiB")
    return "; ".join(why)


def outcome_line(trial: str, measured: Mapping[str, Any], by: str = "") -> str:
    """A trial's line once its row is in the file: its status, its step time when it ran,
    who measured it when another search did (`by`), and its log when the row names one."""
    status = measured["status"]
    figure = f", {float(measured['step_time_s']):.2f} s per step" if status == "ok" else ""
    log = measured.get("log_path")
    where = f" (log {log})" if isinstance(log, str) and log else ""
    return f"{trial}: {status}{figure}{f', {by}' if by else ''}{where}"
