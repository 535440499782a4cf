"""A layout of a job as the exact `pretrain_gpt.py` command line of Megatron-LM, and its env.

This is the only module that knows Megatron-LM's flag names. Each flag was
checked against `megatron/training/arguments.py` of NVIDIA/Megatron-LM (2025-2026 main);
`validation.py` parses the argv back with those definitions and applies Megatron's rules.
The result is an argv list, never a shell string; scripts quote it with `shlex`.

    command = build_command(Layout(tp=2, pp=4, dp=16, rmsnorm_kernel=True), job)
    command.argv, command.env, command.notes
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pandas as pd

from layoutsearch.costs.constants import load_constants
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import (
    ATTENTION_KERNELS,
    FLASH_ATTENTION,
    Layout,
    plain_cell,
    uses_transformer_engine,
)
from layoutsearch.megatron.settings import MegatronSettings
from layoutsearch.pipeline import split_layers, stage_layers
from layoutsearch.rules import FUSED_SOFTMAX_SHAPE, fused_softmax_takes
from layoutsearch.specs import COMMAND_FIELDS, ClusterSpec, Job, ModelSpec

NULL_TOKENIZER_EOD = 1
"""The end-of-document token Megatron-LM's NullTokenizer adds to its --vocab-size."""
PRECISION_ARGS = ("--bf16",)
"""The precision every command trains in, the one priced."""
SYNTHETIC_DATA_ARGS = ("--mock-data", "--tokenizer-type", "NullTokenizer")
"""The data every command trains on (arguments.py::_add_data_args, _add_tokenizer_args):
synthetic tokens, as step time and memory do not depend on them."""
LOGGING_ARGS = ("--log-interval", "1", "--log-throughput")
"""A log line every iteration with its TFLOP/s per GPU: what the log parser reads."""
EVERY_COMMAND_ARGS = (*PRECISION_ARGS, *SYNTHETIC_DATA_ARGS, *LOGGING_ARGS)
"""The words every command carries whatever the layout, job and settings: a user's
extra_args may repeat them (checks.settings_conflicts)."""
FLASH_KERNELS = ("flash2", "flash3")
"""Kernels Megatron-LM selects with `--attention-backend flash`: Transformer Engine's
FlashAttention path, which runs FlashAttention 2, or 3 where `flash_attn_interface` is
installed on Hopper. Which of the two runs is decided by what is installed, not by a flag."""
FLASH2_ON_HOPPER = ("flash2 on Hopper is the flash3 command: Transformer Engine runs "
                    "FlashAttention 3 wherever flash_attn_interface is installed, and no flag "
                    "picks version 2")
"""The note of a flash2 layout's command on a GPU that runs FlashAttention 3: a measured
search passes it over and measures the flash3 layout of the same command instead."""


def flash3_attention_option(kernels: Collection[str]) -> str:
    """The search-space option that adds flash3 to a space's attention kernels (`kernels`)
    that hold flash2 and no flash3, for a GPU that runs FlashAttention 3: there a measured
    search passes the flash2 layouts over (FLASH2_ON_HOPPER), so without flash3 it measures
    no FlashAttention layout. "" where the space needs nothing added."""
    if "flash2" not in kernels or "flash3" in kernels:
        return ""
    listed = [kernel for kernel in ATTENTION_KERNELS if kernel in kernels or kernel == "flash3"]
    return f"search_spaces.attention=[{','.join(listed)}]"
FLASH3_PACKAGE = (
    "FlashAttention 3 installed beside Transformer Engine (flash-attention's hopper/ build, "
    "imported as flash_attn_interface): without it --attention-backend flash runs "
    "FlashAttention 2, the flash2 layout")
"""What a flash3 layout's run needs besides Megatron-LM and Transformer Engine (FLASH_KERNELS)."""


NVTE_ATTENTION = {
    backend: dict(zip(("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"), values,
                      strict=True))
    for backend, values in {"local": "000", "flash": "100", "fused": "010",
                            "unfused": "001", "auto": "111"}.items()
}
"""The Transformer Engine attention switches each --attention-backend sets, and asserts are
unset or equal beforehand (LanguageModule._set_attention_backend). A command carries the
ones of its backend, so that a switch the user's shell exports (a Slurm job inherits it)
cannot stop every trial at that assertion."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MegatronCommand:
    """One trial of Megatron-LM: the training script's argv, its environment, and caveats."""

    argv: tuple[str, ...]
    """Arguments of `pretrain_gpt.py` (the script itself not included)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables the run needs."""
    notes: tuple[str, ...] = ()
    """Where the command cannot express the layout exactly (the run would measure another)."""
    requires: tuple[str, ...] = ()
    """Software the run needs besides Megatron-LM and Transformer Engine to run the layout
    as asked (FLASH3_PACKAGE for flash3), which no flag or environment variable can ask for."""
    num_gpus: int = 1
    gpus_per_node: int = 8
    compute_capability: tuple[int, int] | None = None
    """The job's GPU's CUDA compute capability (GPUSpec), which validate_args asks torch for:
    the checkout's own check answers with it on a machine without that GPU."""

    @property
    def nodes(self) -> int:
        return max(1, -(-self.num_gpus // self.gpus_per_node))

    @property
    def nproc_per_node(self) -> int:
        return min(self.num_gpus, self.gpus_per_node)

    @property
    def exact(self) -> bool:
        """True when the command runs the layout as asked (no caveats)."""
        return not self.notes

    def shell(self) -> str:
        """The argv quoted for a shell (for display and scripts)."""
        return shlex.join(self.argv)


@lru_cache(maxsize=8)
def _analytic_gradient_bytes() -> dict[str, float]:
    return {gpu: c.gradient_bytes for gpu, c in load_constants("analytic").items()}


def reduces_in_bf16(gradient_bytes: float) -> bool:
    """Whether constants pricing gradients at `gradient_bytes` per value price Megatron-LM's
    `--grad-reduce-in-bf16` (2 bytes), not its fp32 reduce (4)."""
    return gradient_bytes == 2.0


def _grad_reduce_in_bf16(settings: MegatronSettings, gpu: str) -> bool:
    # The analytic model prices the data-parallel reduce at `gradient_bytes` per value; a
    # measured run must do the same, so by default the flag follows the constant.
    if settings.grad_reduce_in_bf16 is not None:
        return settings.grad_reduce_in_bf16
    return reduces_in_bf16(_analytic_gradient_bytes().get(gpu, 2.0))


def _model_args(model: ModelSpec, seq_length: int) -> list[str]:
    # arguments.py::_add_network_size_args / _add_training_args.
    argv = [
        "--num-layers", str(model.num_layers),
        "--hidden-size", str(model.hidden_size),
        "--ffn-hidden-size", str(model.ffn_hidden_size),
        "--num-attention-heads", str(model.num_attention_heads),
        "--seq-length", str(seq_length),
        # validate_args: max_position_embeddings >= seq_length (unused by rope).
        "--max-position-embeddings", str(max(seq_length, model.max_position_embeddings)),
        "--position-embedding-type", model.position_embedding_type,
        "--normalization", model.normalization,
        # arguments.py::_add_regularization_args defaults both to 0.1; the cost model prices
        # blocks without dropout (costs/memory.py: no dropout masks are kept), as LLaMA
        # trains, so a launch measures the model that was priced.
        "--attention-dropout", "0.0",
        "--hidden-dropout", "0.0",
    ]
    if model.position_embedding_type == "rope":
        argv += ["--rotary-base", str(model.rotary_base)]
        if model.rope_scaling_factor is not None:
            argv += ["--use-rope-scaling", "--rope-scaling-factor", str(model.rope_scaling_factor)]
    if model.query_groups != model.num_attention_heads:
        argv += ["--group-query-attention", "--num-query-groups", str(model.query_groups)]
    if model.swiglu:
        argv.append("--swiglu")
    if model.untie_embeddings:
        argv.append("--untie-embeddings-and-output-weights")
    if not model.add_bias_linear:
        argv.append("--disable-bias-linear")
    return argv


def _pipeline_split_args(layout: Layout, model: ModelSpec) -> list[str]:
    """How the layers split over uneven stages, as the cost model splits them
    (layoutsearch.pipeline), in flags of arguments.py::_add_distributed_args: interleaved,
    the embedding and the loss counted as a layer each; otherwise the first and last
    stage's layers."""
    if split_layers(model.num_layers, layout.pp, layout.vp) != model.num_layers:
        return ["--account-for-embedding-in-pipeline-split",
                "--account-for-loss-in-pipeline-split"]
    if layout.vp > 1 or model.num_layers % layout.pp == 0:
        return []  # even stages and chunks
    stages = stage_layers(model.num_layers, layout.pp)
    return ["--decoder-first-pipeline-num-layers", str(stages[0]),
            "--decoder-last-pipeline-num-layers", str(stages[-1])]


def _parallel_args(layout: Layout, model: ModelSpec) -> list[str]:
    # arguments.py::_add_distributed_args; SP at tp=1 is switched off by validate_args with a
    # warning, so it is not emitted there.
    argv = [
        "--tensor-model-parallel-size", str(layout.tp),
        "--pipeline-model-parallel-size", str(layout.pp),
        *_pipeline_split_args(layout, model),
    ]
    if layout.cp > 1:
        argv += ["--context-parallel-size", str(layout.cp)]
    if layout.vp > 1:
        # validate_args derives vp from it, counting the embedding and the loss where the
        # flags above say so.
        argv += ["--num-layers-per-virtual-pipeline-stage",
                 str(split_layers(model.num_layers, layout.pp, layout.vp)
                     // (layout.pp * layout.vp))]
    if layout.sequence_parallel and layout.tp > 1:
        argv.append("--sequence-parallel")
    return argv


def _recompute_args(layout: Layout) -> list[str]:
    # arguments.py::_add_training_args: --recompute-granularity {full,selective},
    # --recompute-method {uniform,block}, --recompute-num-layers, --recompute-modules
    # (nargs='*', default core_attn). TransformerConfig.__post_init__ requires a method and
    # a layer count with `full`, and neither with `selective`.
    if layout.recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1"]
    if layout.recompute == "selective":
        return ["--recompute-granularity", "selective", "--recompute-modules", "core_attn"]
    if layout.recompute == "mlp":
        return ["--recompute-granularity", "selective", "--recompute-modules", "mlp"]
    return []


def _kernel_args(layout: Layout, model: ModelSpec,
                 ) -> tuple[list[str], dict[str, str], list[str]]:
    """Attention backend and RMSNorm implementation: argv, env and caveats.

    Megatron-LM offers two layer implementations (`--transformer-impl`). `transformer_engine`
    fuses RMSNorm into the following linear layer (TE's fused kernel, the analogue of the
    study's RMSNorm kernel) and picks the attention kernel by `--attention-backend`
    (AttnBackend: flash, fused = cuDNN, unfused, local, auto). `local` uses PyTorch's norms
    and Megatron's own DotProductAttention with its fused scale-mask-softmax kernel
    (`--no-masked-softmax-fusion` turns it off), but no FlashAttention. The study's RMSNorm
    kernel is a choice for RMSNorm models only: LayerNorm is one kernel in either layer
    implementation (TE's, Apex's or PyTorch's native layer_norm).
    """
    argv: list[str] = []
    env: dict[str, str] = {}
    notes: list[str] = []
    flash = layout.attention in FLASH_ATTENTION
    if uses_transformer_engine(flash, layout.rmsnorm_kernel, layout.sequence_parallel,
                               layout.tp):
        # TE's unfused attention materializes the scores and uses TE's port of Megatron's
        # fused scale-mask-softmax, switched by NVTE_MASKED_SOFTMAX_FUSION.
        backend = "flash" if flash else "unfused"
        argv += ["--transformer-impl", "transformer_engine", "--attention-backend", backend]
        env.update(NVTE_ATTENTION[backend])
        if layout.attention == "torch":
            env["NVTE_MASKED_SOFTMAX_FUSION"] = "0"
            argv.append("--no-masked-softmax-fusion")
        if layout.attention == "flash1":
            notes.append(
                "flash1 cannot be selected in current Megatron-LM: Transformer Engine needs "
                "flash-attn >= 2, so --attention-backend flash runs FlashAttention 2"
            )
        if not layout.rmsnorm_kernel and model.normalization == "RMSNorm":
            why = ("FlashAttention" if flash else "sequence parallelism (PyTorch's RMSNorm of "
                   "the local layers does not support it)")
            notes.append(
                f"rmsnorm_kernel=false cannot be expressed with {why} in Megatron-LM: its "
                "Transformer Engine layers always use TE's fused RMSNorm"
            )
    else:
        # WrappedTorchNorm asserts "persist_layer_norm not supported by torch LayerNorm",
        # and persist_layer_norm = not --no-persist-layer-norm (arguments.py). Apex's fused
        # LayerNorm, where it is used instead, runs without the persistent variant too.
        argv += ["--transformer-impl", "local", "--no-persist-layer-norm"]
        env.update(NVTE_ATTENTION["auto"])  # no --attention-backend: Megatron's default
        if layout.attention == "torch":
            argv.append("--no-masked-softmax-fusion")
    return argv, env, notes


def _fused_softmax_fallback(layout: Layout, job: Job) -> list[str]:
    """The caveat of a `fused` layout whose shape the kernel does not take (search drops
    those rows; a caller building a command for one directly is told what would run)."""
    row = {**job.columns(), **layout.to_dict()}
    if layout.attention != "fused" or fused_softmax_takes(row):
        return []
    reason = FUSED_SOFTMAX_SHAPE.explain(pd.DataFrame([row])).iloc[0]
    return [f"{reason}: FusedScaleMaskSoftmax runs PyTorch's softmax instead, "
            "so the run would measure torch attention"]


def build_command(layout: Layout, job: Job,
                  settings: MegatronSettings | None = None) -> MegatronCommand:
    """The `pretrain_gpt.py` argv and environment that train `job` with `layout`."""
    settings = settings or MegatronSettings()
    model = job.model
    if layout.dp * layout.model_parallel_size != job.num_gpus:
        raise LayoutSearchError(
            f"layout tp·pp·cp·dp = {layout.tp}·{layout.pp}·{layout.cp}·{layout.dp} does not "
            f"equal num_gpus={job.num_gpus}; no Megatron-LM command can run it"
        )
    chunks = layout.pp * layout.vp
    if layout.vp > 1 and split_layers(model.num_layers, layout.pp, layout.vp) % chunks != 0:
        # Megatron-LM takes layers per virtual stage and derives vp from it (validate_args):
        # a rounded count would run another number of virtual stages than asked.
        raise LayoutSearchError(
            f"layout vp={layout.vp}: num_layers={model.num_layers} must divide by pp·vp = "
            f"{chunks}, or num_layers + 2 must (the embedding and the loss counted as "
            "layers); --num-layers-per-virtual-pipeline-stage cannot say it otherwise"
        )
    kernels, env, notes = _kernel_args(layout, model)
    notes += _fused_softmax_fallback(layout, job)
    if layout.attention == "flash2" and job.cluster.gpu.supports_flash3:
        # One command for both kernels (FLASH_KERNELS): measure it once, as flash3.
        notes.append(FLASH2_ON_HOPPER)
    parallel = _parallel_args(layout, model)
    argv = [
        *_model_args(model, job.seq_length),
        *parallel,
        "--micro-batch-size", str(layout.micro_batch_size),
        "--global-batch-size", str(job.global_batch_size),
        *_recompute_args(layout),
        *kernels,
        *PRECISION_ARGS,
    ]
    if _grad_reduce_in_bf16(settings, job.cluster.gpu.name):
        argv.append("--grad-reduce-in-bf16")
    if layout.distributed_optimizer:
        argv.append("--use-distributed-optimizer")
    if layout.overlap_grad_reduce:
        # The weight all-gather exists only with the distributed optimizer, which
        # --overlap-param-gather needs (validate_args); the cost model overlaps both.
        argv.append("--overlap-grad-reduce")
        if layout.distributed_optimizer:
            argv.append("--overlap-param-gather")
    argv += [
        *SYNTHETIC_DATA_ARGS,
        # NullTokenizer adds an end-of-document token to --vocab-size (its vocab_size is
        # the argument + 1, megatron/training/tokenizer): one less gives the priced vocabulary.
        "--vocab-size", str(model.vocab_size - NULL_TOKENIZER_EOD),
        # A short, log-every-step run without evaluation or checkpoints.
        "--train-iters", str(settings.train_iters),
        *LOGGING_ARGS,
        "--eval-iters", "0", "--eval-interval", str(settings.train_iters + 1),
        "--lr", repr(float(settings.lr)), "--min-lr", "0.0",
        *settings.extra_args,
    ]
    # validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP before Blackwell, so
    # that TP communication kernels are scheduled ahead of the compute they overlap with.
    if layout.tp > 1 or layout.cp > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return MegatronCommand(
        argv=tuple(argv), env={**env, **settings.env}, notes=tuple(notes),
        requires=(FLASH3_PACKAGE,) if layout.attention == "flash3" else (),
        num_gpus=job.num_gpus, gpus_per_node=job.cluster.gpus_per_node,
        compute_capability=job.cluster.gpu.compute_capability,
    )


def job_of_row(row: Mapping[str, Any], clusters: Mapping[str, ClusterSpec]) -> Job:
    """The job of a candidate or measurement-schema row (its model, GPUs and batch)."""
    gpu = str(row["gpu"])
    if gpu not in clusters:
        raise LayoutSearchError(f"gpu {gpu!r} is not in the cluster catalog")

    def _int(name: str) -> int:
        return int(row[name])

    model = ModelSpec(
        name=str(row["model"]),
        num_layers=_int("num_layers"),
        hidden_size=_int("hidden_size"),
        ffn_hidden_size=_int("ffn_hidden_size"),
        num_attention_heads=_int("num_attention_heads"),
        num_query_groups=_int("num_query_groups"),
        vocab_size=_int("vocab_size"),
        swiglu=bool(row["swiglu"]),
        untie_embeddings=bool(row["untie_embeddings"]),
        normalization=str(row.get("normalization", "RMSNorm")),
        # A measurement file's rows lack these: the ModelSpec defaults (a LLaMA block).
        **{name: plain_cell(row[name]) for name in COMMAND_FIELDS
           if name in row and not pd.isna(row[name])},
    )
    cluster = clusters[gpu]
    if "gpus_per_node" in row and int(row["gpus_per_node"]) != cluster.gpus_per_node:
        cluster = cluster.replace(gpus_per_node=_int("gpus_per_node"))
    return Job(model=model, cluster=cluster, num_gpus=_int("num_gpus"),
               seq_length=_int("seq_length"), global_batch_size=_int("global_batch_size"))


def command_of_row(row: Mapping[str, Any], clusters: Mapping[str, ClusterSpec],
                   settings: MegatronSettings | None = None) -> MegatronCommand:
    """`build_command` for one row of a candidate or measurement table."""
    return build_command(Layout.from_row(row), job_of_row(row, clusters), settings)
