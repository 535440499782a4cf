"""The study's five sweeps and their best layouts, for the Megatron-LM tests."""

from __future__ import annotations

from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.layout import Layout
from layoutsearch.specs import Job

GLOBAL_TOKENS = 2**22

# The study's best layout of each of its five sweeps (Hagemann et al. 2023; runs.csv):
# (model, seq_length, GPUs, tp, pp), all mb1, FlashAttention 2 + RMSNorm kernel, no recompute.
STUDY_BEST = [
    ("llama_13b", 2048, 64, 1, 1),
    ("llama_13b", 8192, 128, 2, 2),
    ("llama_30b", 2048, 256, 2, 4),
    ("llama_30b", 8192, 128, 4, 4),
    ("llama_65b", 2048, 128, 2, 4),
]


def study_job(model: str, seq: int, gpus: int) -> Job:
    return Job(model=load_model(model).replace(vocab_size=128000),
               cluster=load_cluster("a100_80gb"), num_gpus=gpus, seq_length=seq,
               global_batch_size=GLOBAL_TOKENS // seq)


def study_layout(gpus: int, tp: int, pp: int, **changes: object) -> Layout:
    fields: dict[str, object] = dict(tp=tp, pp=pp, dp=gpus // (tp * pp), micro_batch_size=1,
                                     attention="flash2", rmsnorm_kernel=True, recompute="none")
    fields.update(changes)
    return Layout(**fields)  # type: ignore[arg-type]
