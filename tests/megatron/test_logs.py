"""The log parser against Megatron-LM log lines of several versions and failure kinds."""
# ruff: noqa: E501  (real log lines are kept verbatim)

from __future__ import annotations

import math

import pytest

from layoutsearch.megatron import parse_log

# Megatron-LM core 0.8+ (2024-2026): timestamp, throughput with --log-throughput.
CURRENT = """\
using world size: 8, data-parallel size: 8, context-parallel size: 1, tensor-model-parallel size: 1, pipeline-model-parallel size: 1
 [2025-09-05 16:08:14] iteration        1/       6 | consumed samples:          128 | elapsed time per iteration (ms): 30124.6 | throughput per GPU (TFLOP/s/GPU): 18.0 | learning rate: 2.999998E-05 | global batch size:   128 | lm loss: 2.605958E+00 | loss scale: 1.0 | grad norm: 0.258 | number of skipped iterations:   0 | number of nan iterations:   0 |
[Rank 0] (after 1 iterations) memory (MB) | allocated: 26222.7236328125 | max allocated: 63359.77001953125 | reserved: 66802.0 | max reserved: 66802.0
[Rank 4] (after 1 iterations) memory (MB) | allocated: 20000.0 | max allocated: 65536.0 | reserved: 70000.0 | max reserved: 70000.0
 [2025-09-05 16:08:25] iteration        2/       6 | consumed samples:          256 | elapsed time per iteration (ms): 11182.0 | throughput per GPU (TFLOP/s/GPU): 128.2 | learning rate: 2.999993E-05 | global batch size:   128 | lm loss: 2.591E+00 |
 [2025-09-05 16:08:36] iteration        3/       6 | consumed samples:          384 | elapsed time per iteration (ms): 11000.0 | throughput per GPU (TFLOP/s/GPU): 130.0 | learning rate: 2.9E-05 | global batch size:   128 |
 [2025-09-05 16:08:47] iteration        4/       6 | consumed samples:          512 | elapsed time per iteration (ms): 10000.0 | throughput per GPU (TFLOP/s/GPU): 140.0 | learning rate: 2.9E-05 | global batch size:   128 |
 [2025-09-05 16:08:57] iteration        5/       6 | consumed samples:          640 | elapsed time per iteration (ms): 10200.0 | throughput per GPU (TFLOP/s/GPU): 138.0 | learning rate: 2.9E-05 | global batch size:   128 |
 [2025-09-05 16:09:07] iteration        6/       6 | consumed samples:          768 | elapsed time per iteration (ms): 10400.0 | throughput per GPU (TFLOP/s/GPU): 136.0 | learning rate: 2.9E-05 | global batch size:   128 |
"""

# Megatron-LM 2021-2022: no timestamp, no throughput field.
OLD = """\
 iteration      100/    5000 | consumed samples:          800 | elapsed time per iteration (ms): 296.8 | learning rate: 3.937E-06 | global batch size:     8 | lm loss: 9.729805E+00 | loss scale: 131072.0 | grad norm: 5.703 | number of skipped iterations:  16 | number of nan iterations:   0 |
[Rank 0] (after 100 iterations) memory (MB) | allocated: 6816.88818359375 | max allocated: 8696.8515625 | reserved: 8786.0 | max reserved: 8786.0
 iteration      200/    5000 | consumed samples:         1600 | elapsed time per iteration (ms): 283.9 | learning rate: 4.608E-05 | global batch size:     8 | lm loss: 5.544420E+00 | loss scale: 65536.0 | grad norm: 1.2 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""


def test_current_format_drops_warmup_and_takes_the_largest_rank_peak():
    result = parse_log(CURRENT, warmup_iters=3)
    assert result.status == "ok" and result.iterations == 6
    assert result.step_time_s == pytest.approx((10.0 + 10.2 + 10.4) / 3)
    assert result.tflops_per_gpu == pytest.approx((140.0 + 138.0 + 136.0) / 3)
    assert result.peak_memory_gib == pytest.approx(65536.0 / 1024)


def test_old_format_without_throughput():
    result = parse_log(OLD, warmup_iters=3)
    assert result.status == "ok"
    assert result.step_time_s == pytest.approx((0.2968 + 0.2839) / 2)
    assert math.isnan(result.tflops_per_gpu)
    assert result.peak_memory_gib == pytest.approx(8696.8515625 / 1024)


def test_all_iterations_in_warmup_keeps_the_last():
    first_two = "\n".join(CURRENT.splitlines()[:5])
    assert parse_log(first_two, warmup_iters=3).step_time_s == pytest.approx(11.182)


@pytest.mark.parametrize("line", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.81 GiB. GPU 0 has a "
    "total capacity of 79.15 GiB of which 3.21 GiB is free.",
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; "
    "79.35 GiB total capacity; 70.01 GiB already allocated)",
])
def test_both_oom_spellings(line):
    text = CURRENT.splitlines()[1] + "\nTraceback (most recent call last):\n  File x\n" + line
    result = parse_log(text, returncode=1)
    assert result.status == "oom"
    assert "OutOfMemoryError" in result.message and line in result.excerpt


def test_nccl_error_is_an_error_with_its_line():
    text = ("Traceback (most recent call last):\n"
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
            "unhandled system error, NCCL version 2.19.3\n"
            "ncclSystemError: System call (e.g. socket, malloc) or external library call "
            "failed or device error.\n")
    result = parse_log(text, returncode=1)
    assert result.status == "error" and "ncclSystemError" in result.message
    assert "NCCL error" in result.excerpt


def test_timeout_missing_script_and_silent_crash():
    assert parse_log(CURRENT[:400], returncode=-9, timed_out=True).status == "timeout"
    missing = parse_log("/usr/bin/python: can't open file '/x/pretrain_gpt.py': [Errno 2] "
                        "No such file or directory", returncode=2)
    assert missing.status == "error" and "can't open file" in missing.message
    crash = parse_log(CURRENT.splitlines()[1], returncode=139)
    assert crash.status == "error" and crash.message == "exit status 139"
    empty = parse_log("", returncode=0)
    assert empty.status == "error" and empty.message == "no iteration was logged"
