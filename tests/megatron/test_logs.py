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


def test_memory_reports_of_two_ranks_printed_onto_one_line_are_both_read():
    # Each reporting rank prints at once; a published Megatron-LM r0.10 log has this line.
    glued = (
        "[Rank 2] (after 1 iterations) memory (MB) | allocated: 9334.3779296875 | max allocated: 12680.6357421875 | reserved: 13236.0 | max reserved: 13236.0"
        "[Rank 6] (after 1 iterations) memory (MB) | allocated: 10850.67578125 | max allocated: 18850.70751953125 | reserved: 19000.0 | max reserved: 19000.0"
    )
    lines = CURRENT.splitlines()
    text = "\n".join([lines[1], glued, *lines[4:]])
    assert parse_log(text).peak_memory_gib == pytest.approx(18850.70751953125 / 1024)


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


# Real failure logs (trimmed) from Megatron-LM, NCCL and PyTorch issue reports.
TE_OOM = """\
[rank0]:   File "/opt/megatron-lm/megatron/core/extensions/transformer_engine.py", line 616, in forward
[rank0]:     out = super().forward(x, is_first_microbatch=_is_first_microbatch)
[rank0]: RuntimeError: /TransformerEngine/transformer_engine/common/gemm/cublaslt_gemm.cu:750 in function cublas_gemm: CUDA Error: out of memory
"""
NCCL_OOM = """\
ng30903:3063028:3066152 [3] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'
ng30903:3063028:3066152 [3] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes
[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
[rank3]: ncclUnhandledCudaError: Call to CUDA function failed.
"""
CUBLAS_OOM = """\
Traceback (most recent call last):
RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`
"""
WATCHDOG = """\
[rank7]:[E719 10:16:00.123456789 ProcessGroupNCCL.cpp:607] [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=199, OpType=_REDUCE_SCATTER_BASE, NumelIn=7098994688, NumelOut=443687168, Timeout(ms)=600000) ran for 882725 milliseconds before timing out.
terminate called after throwing an instance of 'c10::DistBackendError'
Exception raised from checkTimeout at /opt/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:567 (most recent call first):
frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x1e1 (0x7ff93bea04e1 in /usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so)
frame #3: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x10f (0x7ff93bea9a0f in /usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  exitcode  : -6 (pid: 3431)
  traceback : Signal 6 (SIGABRT) received by PID 3431
"""
TIMEOUT_THEN_BOGUS_OOM = """\
[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4084, OpType=BROADCAST, NumelIn=56623104, NumelOut=56623104, Timeout(ms)=1800000) ran for 1800059 milliseconds before timing out.
torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate more than 1EB memory.
"""
SEGFAULT_UNDER_TORCHRUN = """\
E1223 05:17:58.000000 3304100 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -11) local_rank: 0 (pid: 3304209) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
  exitcode  : -11 (pid: 3304209)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 3304209
"""


@pytest.mark.parametrize("text, line", [
    (TE_OOM, "CUDA Error: out of memory"),
    (NCCL_OOM, "NCCL WARN Cuda failure 'out of memory'"),
    (CUBLAS_OOM, "CUBLAS_STATUS_ALLOC_FAILED"),
])
def test_out_of_memory_from_transformer_engine_nccl_and_cublas(text, line):
    result = parse_log(text, returncode=1)
    assert result.status == "oom" and line in result.message


def test_an_out_of_memory_warning_in_a_run_that_trained_is_no_oom():
    # NCCL warns of a failed allocation and retries; the run went on and exited 0.
    text = CURRENT + "node1:1:2 [0] NCCL WARN Cuda failure 'out of memory'\n"
    assert parse_log(text, returncode=0, warmup_iters=3).status == "ok"
    # The same line in a run that hung until the time limit is its cause.
    assert parse_log(text, returncode=None, timed_out=True).status == "oom"


def test_a_collective_timeout_names_the_watchdog_line_not_a_stack_frame():
    result = parse_log(WATCHDOG, returncode=1)
    assert result.status == "error"
    assert result.message.endswith("ran for 882725 milliseconds before timing out.")
    assert "frame #" not in result.message


def test_an_out_of_memory_after_a_collective_timeout_is_the_timeout():
    result = parse_log(TIMEOUT_THEN_BOGUS_OOM, returncode=1)
    assert result.status == "error" and "Watchdog caught" in result.message


def test_a_rank_killed_by_a_signal_is_named_by_it():
    result = parse_log(SEGFAULT_UNDER_TORCHRUN, returncode=1)
    assert result.status == "error"
    assert result.message == "traceback : Signal 11 (SIGSEGV) received by PID 3304209"


@pytest.mark.parametrize("line", [
    "[rank0]: ValueError: No dot product attention support for the provided inputs!",
    "[rank0]: ValueError: No dot product attention backend is available for the provided "
    "inputs. Please run with NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 to find out the reasons for "
    "disabling all backends.",
    "[rank0]: RuntimeError: FlashAttention forward only supports head dimension at most 256",
    "RuntimeError: FlashAttention only supports Ampere GPUs or newer.",
])
def test_a_kernel_that_refuses_the_shape_is_unavailable(line):
    text = "[rank0]: Traceback (most recent call last):\n" + line + "\n"
    result = parse_log(text, returncode=1)
    assert result.status == "unavailable" and result.message == line
    # The same words in the log of a run that went on are no failure.
    assert parse_log(CURRENT + line, returncode=0, warmup_iters=3).status == "ok"


def test_the_line_after_iteration_1_averages_it_in_and_is_dropped():
    # Current Megatron-LM does not reset its timer after logging iteration 1, so iteration
    # 2 prints the mean of iterations 1 and 2 (30 s and 10 s): not a steady step.
    lines = [f" iteration {i:8d}/       6 | consumed samples: {128 * i:12d} | elapsed time "
             f"per iteration (ms): {ms:.1f} |" for i, ms in [(1, 30000), (2, 20000), (3, 10000),
                                                            (4, 10000)]]
    assert parse_log("\n".join(lines), warmup_iters=1).step_time_s == pytest.approx(10.0)
    # A log whose first line is not iteration 1 has no such line.
    assert parse_log(OLD, warmup_iters=3).step_time_s == pytest.approx((0.2968 + 0.2839) / 2)


@pytest.mark.parametrize("line", [
    "/usr/bin/python3: Error while finding module specification for 'torch.distributed.run' "
    "(ModuleNotFoundError: No module named 'torch')",
    "ModuleNotFoundError: No module named 'megatron'",
    "/usr/bin/python3: can't open file '/opt/Megatron-LM/pretrain_gpt.py': [Errno 2] No such "
    "file or directory",
    "FileNotFoundError: [Errno 2] No such file or directory: 'scontrol'",
    "bash: line 1: torchrun: command not found",
    # Megatron-LM's parse_args (argparse) refusing a flag, on every rank.
    "pretrain_gpt.py: error: unrecognized arguments: --no-gradient-acumulation-fusion",
    "[rank0]: pretrain_gpt.py: error: argument --seed: invalid int value: 'x'",
])
def test_a_launch_that_fails_before_training_for_every_layout_is_a_setup_problem(line):
    result = parse_log(f"{line}\n", returncode=1)
    assert result.status == "error" and result.setup_problem and result.message == line


# megatron/core/tensor_parallel/layers.py (ColumnParallelLinear.__init__), raised while the
# model is built: every GPT model's output layer is one, whatever the layout.
NO_APEX = (
    "[rank0]: RuntimeError: ColumnParallelLinear was called with gradient_accumulation_fusion "
    "set to True but the custom CUDA extension fused_weight_gradient_mlp_cuda module is not "
    "found. To use gradient_accumulation_fusion you must install APEX with --cpp_ext and "
    "--cuda_ext. For example: pip install --global-option=\"--cpp_ext\" --global-option="
    "\"--cuda_ext .\" Note that the extension requires CUDA>=11. Otherwise, you must turn "
    "off gradient accumulation fusion."
)


def test_gradient_accumulation_fusion_without_apex_is_a_setup_problem():
    text = f"building GPT model ...\n[rank0]: Traceback (most recent call last):\n{NO_APEX}\n"
    result = parse_log(text, returncode=1)
    assert result.status == "error" and result.setup_problem
    assert result.message == NO_APEX[:300]
    assert "fused_weight_gradient_mlp_cuda module is not found" in result.message


def test_a_missing_module_after_training_started_is_the_runs_own_error():
    text = CURRENT.splitlines()[1] + "\nModuleNotFoundError: No module named 'torch._dynamo.x'\n"
    result = parse_log(text, returncode=1)
    assert result.status == "error" and not result.setup_problem


# A run that trained to its end, then did not exit cleanly.
AFTER_TRAINING = "[after training is done] datetime: 2025-09-05 16:09:08 \n"
TEARDOWN_ABORT = """\
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with exception: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
Exception raised from checkForNCCLErrorsInternal at /opt/pytorch/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:275 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f1c2e96c446 in /usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so)
"""


def test_a_run_that_hangs_after_its_last_iteration_keeps_its_figures():
    # NVIDIA-NeMo/Megatron-Bridge#3427: "iteration 50/50", "[after training is done]", and
    # the processes never exit.
    result = parse_log(CURRENT + AFTER_TRAINING, warmup_iters=3, returncode=-9,
                       timed_out=True)
    assert result.status == "ok" and result.iterations == 6
    assert result.step_time_s == pytest.approx((10.0 + 10.2 + 10.4) / 3)
    assert result.peak_memory_gib == pytest.approx(65536.0 / 1024)
    assert "killed at the time limit" in result.message


def test_a_run_that_aborts_at_exit_after_its_last_iteration_keeps_its_figures():
    result = parse_log(CURRENT + AFTER_TRAINING + TEARDOWN_ABORT, warmup_iters=3,
                       returncode=134)
    assert result.status == "ok"
    assert result.tflops_per_gpu == pytest.approx((140.0 + 138.0 + 136.0) / 3)
    assert result.message.startswith("every iteration was logged, then exited with status 134")
    assert "NCCL error" in result.message and "c10::DistBackendError" in result.excerpt


def test_a_run_killed_before_its_last_iteration_is_still_a_timeout():
    unfinished = "\n".join(CURRENT.splitlines()[:7])  # iterations 1 to 4 of 6
    result = parse_log(unfinished, returncode=-9, timed_out=True)
    assert result.status == "timeout" and result.iterations == 4
    crashed = parse_log(unfinished + "\n" + TEARDOWN_ABORT, returncode=134)
    assert crashed.status == "error" and "NCCL error" in crashed.message
