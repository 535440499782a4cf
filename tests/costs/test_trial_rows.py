"""What a finished trial leaves (costs/trial_rows.py): whether its figures can be of the
job's GPU."""

from __future__ import annotations

from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.costs.trial_rows import beyond_the_gpu
from layoutsearch.specs import Job


def job_on(model: str, gpu: str, seq_length: int) -> Job:
    return Job(model=load_model(model), cluster=load_cluster(gpu), num_gpus=8,
               seq_length=seq_length, global_batch_size=64)


def test_figures_beyond_the_gpu_are_named_and_a_long_context_run_is_not_one():
    # LLaMA 7B at 2k executes at least 41.25 GFLOP a token: 12·L·h²·(2 + s/2h + 1.5·f/h)
    # = 12·32·4096²·(2.25 + 4.03125) in the blocks, 6·h·V = 6·4096·32000 in the logits.
    job = job_on("llama_7b", "a100_40gb", 2048)
    possible = {"tokens_per_s": 8 * 7000, "mfu": 0.98, "peak_memory_gib": 39.5}
    assert beyond_the_gpu(possible, job) == ""
    # 8,000 tokens/s a GPU x 41.25 GFLOP = 330 TFLOP/s, above the A100's 312.
    assert beyond_the_gpu({**possible, "tokens_per_s": 8 * 8000, "mfu": 1.05}, job) == (
        "its 64,000 tokens/s on 8 GPUs execute at least 330 TFLOP/s per GPU (MFU 1.05 by the "
        "study's count), above the a100_40gb's dense bf16 peak of 312")
    assert beyond_the_gpu({**possible, "peak_memory_gib": 52.5}, job) == (
        "it allocated 52.5 GiB on a GPU, more than the a100_40gb's 39.59 GiB")
    # Llama 3 8B at 128k on H100s: 4,140 tokens/s a GPU is MFU 1.06 by the study's count,
    # whose 12·L·h·s counts the causal mask's half, but 148 GFLOP a token executed, 613
    # TFLOP/s: a run that can happen is not stopped.
    long_context = job_on("llama3_8b", "h100_sxm", 131072)
    tokens_per_s = 8 * 4140
    mfu = tokens_per_s / 8 * long_context.model.paper_flops_per_token(131072) / 989e12
    assert mfu > 1
    assert beyond_the_gpu({"tokens_per_s": tokens_per_s, "mfu": mfu, "peak_memory_gib": 60},
                           long_context) == ""
    # A failed run has no figures (NaN): nothing to judge.
    nan = float("nan")
    assert beyond_the_gpu({"tokens_per_s": nan, "mfu": nan, "peak_memory_gib": nan},
                           job) == ""
