"""One candidate parallelization layout, and the names of its knobs.

A knob has one name everywhere: the `Layout` field, the YAML key of
a search space, the DataFrame column and the measurement-schema column.

    layout = Layout(tp=2, pp=4, dp=16, micro_batch_size=1, attention="flash2")
    layout.num_micro_batches(global_batch_size=2048)  # 128
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a table row; layout.py itself needs no pandas
    import pandas as pd

ATTENTION_KERNELS = ("torch", "fused", "flash1", "flash2", "flash3")
"""`torch`: unfused PyTorch softmax attention; `fused`: Megatron's fused scale-mask-softmax
CUDA kernel (both materialize the s×s scores); `flash1`/`flash2`/`flash3`: FlashAttention 1,
2 and 3 (3 needs Hopper)."""

FLASH_ATTENTION = ("flash1", "flash2", "flash3")
"""The FlashAttention kernels: no s×s scores kept, and only in Transformer Engine's layers."""

RECOMPUTE_KINDS = ("none", "selective", "mlp", "full")
"""Activation checkpointing: `selective` = core attention only (Megatron's selective),
`mlp` = the MLP block only, `full` = every layer."""


def plain_cell(value: Any) -> Any:
    """A table cell as the plain Python value: a numpy scalar (np.int64(2), np.bool_(True),
    np.float64(0.5), np.str_("flash2")) as its Python one, anything else as it is."""
    return value.item() if hasattr(value, "item") else value


def uses_transformer_engine(flash_attention: Any, rmsnorm_kernel: Any,
                            sequence_parallel: Any, tp: Any) -> Any:
    """Whether the layout's Megatron-LM command runs Transformer Engine's layers, for one
    layout (bools) or a table (arrays): FlashAttention and the fused norm exist only there,
    and the local layers' PyTorch norms refuse sequence parallelism at tp > 1
    (megatron/core/transformer/torch_norm.py). TE's layers fuse each norm into the linear
    after it (TELayerNormColumnParallelLinear), which changes what a checkpoint keeps."""
    return flash_attention | rmsnorm_kernel | (sequence_parallel & (tp > 1))


DATA_PARALLEL_NO_OPS = {"distributed_optimizer": True, "overlap_grad_reduce": False}
"""Knobs that change nothing where a layout has one data-parallel rank (dp·cp = 1), and the
value such a layout keeps when the space offers both: the distributed optimizer shards its
state over the dp·cp ranks (Megatron-LM's DistributedOptimizer, over the data-parallel group
with context parallelism), so over one rank it keeps the whole state as the plain optimizer
does; --overlap-grad-reduce hides a gradient reduce that has no other rank to reach. The
twins would be priced alike and fill a ranking's top rows in pairs. The kept values are the
study's (and the paper driver's): a sharded optimizer, no overlap (Megatron-LM's default)."""


LAYOUT_COLUMNS = (
    "tp", "pp", "dp", "cp", "vp", "micro_batch_size", "sequence_parallel", "attention",
    "rmsnorm_kernel", "recompute", "distributed_optimizer", "overlap_grad_reduce",
)
"""The knobs of a layout, in the order tables show them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """How one job is split over its GPUs."""

    tp: int = 1
    """Tensor-parallel size."""
    pp: int = 1
    """Pipeline-parallel size (stages)."""
    dp: int = 1
    """Data-parallel size: num_gpus / (tp·pp·cp)."""
    cp: int = 1
    """Context-parallel size (the sequence split across GPUs in attention)."""
    vp: int = 1
    """Virtual pipeline stages per rank (interleaved 1F1B); 1 = not interleaved."""
    micro_batch_size: int = 1
    """Sequences per micro-batch."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (splits norms and dropout over the TP ranks)."""
    attention: str = "flash2"
    """Attention kernel, one of ATTENTION_KERNELS."""
    rmsnorm_kernel: bool = False
    """The fused RMSNorm kernel instead of PyTorch's RMSNorm."""
    recompute: str = "none"
    """Activation checkpointing granularity, one of RECOMPUTE_KINDS."""
    distributed_optimizer: bool = True
    """Shard the fp32 optimizer state over the data-parallel ranks (ZeRO-1)."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel communication with compute: Megatron-LM's
    `--overlap-grad-reduce`, and with the distributed optimizer `--overlap-param-gather`.
    False is Megatron-LM's default (and how the study ran): the traffic is exposed."""

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    def num_micro_batches(self, global_batch_size: int) -> int:
        """Micro-batches each pipeline runs per optimizer step (gradient accumulation)."""
        return global_batch_size // (self.micro_batch_size * self.dp)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in LAYOUT_COLUMNS}

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | pd.Series) -> Layout:
        """The layout of a table row (a frame's row or a mapping); columns the row lacks keep
        their defaults."""
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for name in fields:
            if name in row and row[name] is not None:
                values[name] = plain_cell(row[name])
        return cls(**values)

    def describe(self) -> str:
        """A short human label: 'tp2 pp4 dp16 mb1 flash2+rmsnorm recompute=none'."""
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.vp > 1:
            parts.append(f"vp{self.vp}")
        parts.append(f"mb{self.micro_batch_size}")
        if self.sequence_parallel:
            parts.append("sp")
        parts.append(self.attention + ("+rmsnorm" if self.rmsnorm_kernel else ""))
        parts.append(f"recompute={self.recompute}")
        if not self.distributed_optimizer:
            parts.append("no-dist-opt")
        if self.overlap_grad_reduce:
            parts.append("overlap-dp")
        return " ".join(parts)
