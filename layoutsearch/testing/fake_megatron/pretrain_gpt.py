"""A fake Megatron-LM `pretrain_gpt.py`: real-format logs priced by the analytic model.

It parses the argv layoutsearch emits (Megatron-LM's own rules applied first; a flag it does
not know is refused as Megatron-LM's argparse refuses it, with exit status 2), prices the
layout with the analytic cost model and prints what Megatron-LM prints: iteration lines
with elapsed time and TFLOP/s per GPU, the memory report, or PyTorch's OOM traceback when
the layout does not fit. Failures are injected by environment variable (see
`layoutsearch.testing`): LAYOUTSEARCH_FAKE_INJECT picks by the launch number that the
fake torchrun passes in LAYOUTSEARCH_FAKE_LAUNCH_NUMBER.

    python pretrain_gpt.py --num-layers 2 ... (run by the fake torchrun)
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import signal
import sys
import time
from typing import Any

import pandas as pd

from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.costs.analytic import AnalyticCostModel
from layoutsearch.megatron.inverse import row_of_argv
from layoutsearch.megatron.validation import argument_parser, validate_argv
from layoutsearch.specs import ModelSpec

WARMUP_SLOWDOWN = (3.0, 1.4, 1.1)
"""The first iterations run slower (allocator, NCCL set-up, autotuning), as real runs do."""
OTHER_MEGATRON_FLAGS: dict[str, dict[str, Any]] = {
    # megatron/training/arguments.py: flags a user's extra_args may carry.
    "--seed": {"type": int},  # _add_initialization_args
    "--no-gradient-accumulation-fusion": {"action": "store_false",  # _add_training_args
                                          "dest": "gradient_accumulation_fusion"},
    "--manual-gc": {"action": "store_true"},  # _add_training_args
    # Defined there, then refused or ignored by validate_args (validation.DEPRECATED_FLAGS).
    "--checkpoint-activations": {"action": "store_true"},
    "--batch-size": {"type": int},
    "--model-parallel-size": {"type": int},
    "--warmup": {"type": int},
    "--use-flash-attn": {"action": "store_true"},
    "--use-rotary-position-embeddings": {"action": "store_true"},
    "--use-mcore-models": {"action": "store_true", "dest": "deprecated_use_mcore_models"},
}
"""Megatron-LM flags the fake accepts besides those layoutsearch emits: any other is refused."""


def _injected(number: int) -> str:
    """The failure injected at this launch: LAYOUTSEARCH_FAKE_INJECT='2=crash,3=hang'."""
    spec = os.environ.get("LAYOUTSEARCH_FAKE_INJECT", "")
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, _, kind = item.partition("=")
        if key in ("*", str(number)):
            return kind
    return ""


def _oom(needed_gib: float, capacity_gib: float) -> None:
    print("Traceback (most recent call last):", flush=True)
    print('  File "pretrain_gpt.py", line 320, in <module>', flush=True)
    print('  File "megatron/training/training.py", line 1140, in train_step', flush=True)
    print(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
          f"has a total capacity of {capacity_gib:.2f} GiB of which 1.12 GiB is free. "
          f"Process has {needed_gib:.2f} GiB memory in use.", flush=True)
    sys.exit(1)


def _fail(kind: str) -> None:
    if kind == "hang":
        print("[rank0]: waiting for a collective that never completes ...", flush=True)
        while True:
            time.sleep(3600)
    if kind == "nccl":
        print("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
              "c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with "
              "NCCL_DEBUG=INFO for details), NCCL version 2.19.3", flush=True)
        print("ncclSystemError: System call (e.g. socket, malloc) or external library call "
              "failed or device error.", flush=True)
        sys.exit(1)
    if kind == "crash":
        # Die of the signal itself, as a crashing rank does (no core file), after the line
        # Python's fault handler prints.
        print("Fatal Python error: Segmentation fault", flush=True)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGSEGV)


def _megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's argument parser as far as the fake knows it (parse_args in
    megatron/training/arguments.py: argparse, allow_abbrev=False): the flags layoutsearch
    emits and OTHER_MEGATRON_FLAGS."""
    parser = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False,
                                     parents=[argument_parser()])
    for flag, options in OTHER_MEGATRON_FLAGS.items():
        parser.add_argument(flag, **options)
    return parser


def main(argv: list[str]) -> None:
    # As Megatron-LM on every rank: "pretrain_gpt.py: error: unrecognized arguments: --foo"
    # (or "argument --bar: invalid int value: 'x'"), then exit status 2.
    _megatron_parser().parse_args(argv)
    env = dict(os.environ)
    world = int(env.get("WORLD_SIZE", "1"))
    number = int(env.get("LAYOUTSEARCH_FAKE_LAUNCH_NUMBER", "0"))
    problems = [p for p in validate_argv(argv, env=env, world_size=world)
                if p.severity == "error"]
    if problems:
        print("Traceback (most recent call last):", flush=True)
        print(f"AssertionError: {problems[0].message}", flush=True)
        sys.exit(1)
    kind = _injected(number)
    if kind and kind != "oom":
        _fail(kind)
    gpu = env.get("LAYOUTSEARCH_FAKE_GPU", "a100_80gb")
    clusters = clusters_by_gpu()
    # As Transformer Engine does with --attention-backend flash: FlashAttention 3 where it
    # is installed, which the fake takes to be every Hopper GPU.
    flash_kernel = "flash3" if clusters[gpu].gpu.supports_flash3 else "flash2"
    row = row_of_argv(argv, env=env, world_size=world, gpu=gpu,
                      gpus_per_node=clusters[gpu].gpus_per_node, flash_kernel=flash_kernel)
    model = AnalyticCostModel.load(env.get("LAYOUTSEARCH_FAKE_COST_MODEL", "analytic"))
    scored = model.score(pd.DataFrame([row]), clusters).iloc[0]
    capacity = clusters[gpu].gpu.memory_gib
    if kind == "oom" or not bool(scored["fits"]):
        _oom(float(scored["peak_memory_gib"]), capacity)
    step_s = float(scored["step_time_s"])
    spec = ModelSpec(
        name="fake", num_layers=row["num_layers"], hidden_size=row["hidden_size"],
        ffn_hidden_size=row["ffn_hidden_size"], num_attention_heads=row["num_attention_heads"],
        num_query_groups=row["num_query_groups"], vocab_size=row["vocab_size"],
        swiglu=row["swiglu"], untie_embeddings=row["untie_embeddings"])
    tokens = row["global_batch_size"] * row["seq_length"]
    megatron_flops = spec.megatron_flops_per_token(row["seq_length"]) * tokens
    iters = int(next(argv[i + 1] for i, a in enumerate(argv) if a == "--train-iters"))
    pause = float(env.get("LAYOUTSEARCH_FAKE_SLEEP_S", "0"))
    consumed = 0
    print(f"using world size: {world}, data-parallel size: {row['dp']}, "
          f"context-parallel size: {row['cp']}, tensor-model-parallel size: {row['tp']}, "
          f"pipeline-model-parallel size: {row['pp']}", flush=True)
    for iteration in range(1, iters + 1):
        elapsed = step_s * (WARMUP_SLOWDOWN[iteration - 1]
                            if iteration <= len(WARMUP_SLOWDOWN) else 1.0)
        consumed += row["global_batch_size"]
        # training.py::training_log (Megatron-LM main, 2026): the timestamp has microseconds.
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
        tflops = megatron_flops / elapsed / world / 1e12
        print(f" [{stamp}] iteration {iteration:8d}/{iters:8d} | consumed samples: "
              f"{consumed:12d} | elapsed time per iteration (ms): {elapsed * 1000:.1f} | "
              f"throughput per GPU (TFLOP/s/GPU): {tflops:.1f} | learning rate: 1.000000E-04 "
              f"| global batch size: {row['global_batch_size']:5d} | lm loss: 1.100000E+01 | "
              "loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 | "
              "number of nan iterations:   0 |", flush=True)
        if iteration <= 2:
            # utils.py::report_memory, after the first iteration and again after the second
            # (with the optimizer state), by training_log (Megatron-LM main, 2026).
            peak_mb = float(scored["peak_memory_gib"]) * 1024
            print(f"[Rank 0] (after {iteration} iterations) memory (MB) | allocated: "
                  f"{peak_mb * 0.6:.2f} | max allocated: {peak_mb:.2f} | reserved: "
                  f"{peak_mb * 1.05:.2f} | max reserved: {peak_mb * 1.05:.2f}", flush=True)
        if pause:
            time.sleep(pause)


if __name__ == "__main__":
    main(sys.argv[1:])
