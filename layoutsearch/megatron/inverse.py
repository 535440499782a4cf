"""The job and layout columns a `pretrain_gpt.py` command line runs (argv -> table row).

The inverse of `args.build_command`, for tools that see only a command line: the fake
Megatron-LM of `layoutsearch.testing`, and checks that a command says what was asked.
FlashAttention 2 and 3 share `--attention-backend flash`; the installed library decides,
so `flash_kernel` names the one to report.

    row = row_of_argv(command.argv, env=command.env, world_size=64, gpu="a100_80gb")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from layoutsearch.megatron.args import NULL_TOKENIZER_EOD
from layoutsearch.megatron.validation import parse_known_argv, split_layer_count


def _attention(args: Any, env: Mapping[str, str], flash_kernel: str) -> str:
    backend = args.attention_backend
    if args.transformer_impl == "transformer_engine" and backend != "local":
        # `auto` (Megatron-LM's default) lets Transformer Engine pick FlashAttention or
        # cuDNN's fused attention, as does `fused` the latter: both keep the scores on chip,
        # which is what the flash kernels' cost describes. `unfused` materializes them.
        if backend in ("flash", "fused", "auto"):
            return flash_kernel
        softmax_fused = env.get("NVTE_MASKED_SOFTMAX_FUSION", "1") != "0"
        return "fused" if softmax_fused else "torch"
    return "fused" if args.masked_softmax_fusion else "torch"


def _recompute(args: Any) -> str:
    if args.recompute_granularity == "full":
        return "full"
    if args.recompute_granularity == "selective":
        return "mlp" if "mlp" in (args.recompute_modules or []) else "selective"
    return "none"


def row_of_argv(argv: Sequence[str], *, env: Mapping[str, str], world_size: int,
                gpu: str, gpus_per_node: int = 8, flash_kernel: str = "flash2",
                ) -> dict[str, Any]:
    """Measurement-schema columns (job and layout) of the run the argv starts. Flags
    layoutsearch does not define (a user's extra_args, e.g. --no-gradient-accumulation-fusion)
    are passed over, as validate_argv passes them on unchecked."""
    a, _ = parse_known_argv(argv)
    tp, pp, cp = (a.tensor_model_parallel_size, a.pipeline_model_parallel_size,
                  a.context_parallel_size)
    vstage = a.num_layers_per_virtual_pipeline_stage
    return {
        "model": "megatron",
        "num_layers": a.num_layers,
        "hidden_size": a.hidden_size,
        "ffn_hidden_size": a.ffn_hidden_size,
        "num_attention_heads": a.num_attention_heads,
        "num_query_groups": a.num_query_groups if a.group_query_attention
        else a.num_attention_heads,
        "vocab_size": a.vocab_size + (NULL_TOKENIZER_EOD if a.tokenizer_type == "NullTokenizer"
                                      else 0),
        "seq_length": a.seq_length,
        "swiglu": a.swiglu,
        "untie_embeddings": a.untie_embeddings_and_output_weights,
        "normalization": a.normalization,
        "gpu": gpu,
        "num_gpus": world_size,
        "gpus_per_node": gpus_per_node,
        "global_batch_size": a.global_batch_size,
        "tp": tp,
        "pp": pp,
        "dp": world_size // (tp * pp * cp),
        "cp": cp,
        "vp": split_layer_count(a) // (pp * vstage) if vstage else 1,
        "micro_batch_size": a.micro_batch_size,
        "sequence_parallel": a.sequence_parallel and tp > 1,
        "attention": _attention(a, env, flash_kernel),
        # TE's fused RMSNorm is the study's kernel; LayerNorm has no such choice.
        "rmsnorm_kernel": (a.transformer_impl == "transformer_engine"
                           and a.normalization == "RMSNorm"),
        "recompute": _recompute(a),
        "distributed_optimizer": a.use_distributed_optimizer,
        "overlap_grad_reduce": a.overlap_grad_reduce,
    }
