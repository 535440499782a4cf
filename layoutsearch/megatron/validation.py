"""Megatron-LM's own argument rules, applied to a command line before anything is launched.

The argv is parsed back with the definitions of the flags we emit, copied from
`megatron/training/arguments.py` (NVIDIA/Megatron-LM main, 2025-2026: same names, types,
defaults, choices and `dest`s), so a misspelt or removed flag fails here as it would there.
Then the rules of `validate_args` (arguments.py), `TransformerConfig.__post_init__`
(megatron/core/transformer/transformer_config.py), `get_num_layers_to_build`
(megatron/core/transformer/transformer_block.py), the micro-batch calculator and the
interleaved schedule are checked, each citing where Megatron enforces it.

    problems = validate_argv(command.argv, env=command.env, world_size=64)
    errors = [p for p in problems if p.severity == "error"]
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import NoReturn

from layoutsearch.megatron.args import NVTE_ATTENTION

DEPRECATED_FLAGS = {
    # validate_args, "Deprecated arguments": exit() for the first, asserted None for others.
    "--checkpoint-activations": ("error", "exits; use --recompute-granularity"),
    "--batch-size": ("error", "use --micro-batch-size"),
    "--model-parallel-size": ("error", "use --tensor-model-parallel-size"),
    "--warmup": ("error", "use --lr-warmup-fraction"),
    # Still accepted and mapped: validate_args sets recompute_granularity = 'selective'
    # (parse_argv does the same), whatever --recompute-granularity says.
    "--recompute-activations": ("warning", "sets --recompute-granularity selective, "
                                "overriding the layout's recompute"),
    # _add_training_args: kept for compatibility, no effect on MCore models.
    "--use-flash-attn": ("warning", "no effect; use --attention-backend flash"),
    # _add_network_size_args: "Deprecated: use --position-embedding-type".
    "--use-rotary-position-embeddings": ("warning", "use --position-embedding-type rope"),
    # _add_training_args (dest deprecated_use_mcore_models): "Now ignored and mcore models
    # are the default", as in older example scripts.
    "--use-mcore-models": ("warning", "ignored; Megatron-Core models are the default"),
}
LAYOUT_FREE_RULES = frozenset({"deprecated_flag", "argparse", "precision", "min_lr",
                               "data_source", "logging"})
"""Rules no layout has a say in (flags, precision, data, logging): settings whose command
breaks one for one layout break it for every layout."""
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


@cache
def argument_parser() -> argparse.ArgumentParser:
    """The flags layoutsearch emits, defined as in Megatron-LM's arguments.py.

    One parser serves every call (parsing does not change it): building it is three
    quarters of checking a command, and a search checks up to a thousand.
    """
    p = _Parser(prog="pretrain_gpt.py", allow_abbrev=False, add_help=False)
    # _add_network_size_args
    p.add_argument("--num-layers", type=int)
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--ffn-hidden-size", type=int)
    p.add_argument("--num-attention-heads", type=int)
    p.add_argument("--kv-channels", type=int)
    p.add_argument("--attention-backend", default="auto",
                   choices=["flash", "fused", "unfused", "local", "auto"])
    p.add_argument("--group-query-attention", action="store_true")
    p.add_argument("--num-query-groups", type=int, default=1)
    p.add_argument("--max-position-embeddings", type=int)
    p.add_argument("--no-position-embedding", action="store_false",
                   dest="add_position_embedding")
    p.add_argument("--position-embedding-type", default="learned_absolute",
                   choices=["learned_absolute", "rope", "mrope", "relative", "none"])
    p.add_argument("--rotary-base", type=int, default=10000)
    p.add_argument("--use-rope-scaling", action="store_true")
    p.add_argument("--rope-scaling-factor", type=float, default=8.0)
    p.add_argument("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    p.add_argument("--swiglu", action="store_true")
    p.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    p.add_argument("--no-persist-layer-norm", action="store_true")
    # _add_regularization_args
    p.add_argument("--attention-dropout", type=float, default=0.1)
    p.add_argument("--hidden-dropout", type=float, default=0.1)
    # _add_training_args
    p.add_argument("--micro-batch-size", type=int)
    p.add_argument("--global-batch-size", type=int)
    p.add_argument("--rampup-batch-size", nargs="*")
    p.add_argument("--recompute-activations", action="store_true")
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    p.add_argument("--recompute-num-layers", type=int)
    p.add_argument("--recompute-modules", nargs="*", type=str)
    p.add_argument("--train-iters", type=int)
    p.add_argument("--log-interval", type=int, default=100)
    p.add_argument("--no-masked-softmax-fusion", action="store_false",
                   dest="masked_softmax_fusion")
    p.add_argument("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    p.add_argument("--sequence-parallel", action="store_true")
    # _add_transformer_engine_args
    p.add_argument("--transformer-impl", default="transformer_engine",
                   choices=["local", "transformer_engine"])
    # _add_mixed_precision_args
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--bf16", action="store_true")
    # _add_transformer_engine_args
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"], dest="fp8")
    p.add_argument("--grad-reduce-in-bf16", action="store_true")
    # _add_distributed_args
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--num-layers-per-virtual-pipeline-stage", type=int)
    p.add_argument("--num-virtual-stages-per-pipeline-rank", type=int)
    p.add_argument("--decoder-first-pipeline-num-layers", type=int)
    p.add_argument("--decoder-last-pipeline-num-layers", type=int)
    p.add_argument("--account-for-embedding-in-pipeline-split", action="store_true")
    p.add_argument("--account-for-loss-in-pipeline-split", action="store_true")
    p.add_argument("--no-overlap-p2p-communication", action="store_false",
                   dest="overlap_p2p_comm")
    p.add_argument("--overlap-grad-reduce", action="store_true")
    p.add_argument("--overlap-param-gather", action="store_true")
    p.add_argument("--use-distributed-optimizer", action="store_true")
    p.add_argument("--context-parallel-size", type=int, default=1)
    p.add_argument("--distributed-timeout-minutes", type=int, default=10)
    # _add_learning_rate_args
    p.add_argument("--lr", type=float)
    p.add_argument("--min-lr", type=float, default=0.0)
    # _add_validation_args
    p.add_argument("--eval-iters", type=int, default=100)
    p.add_argument("--eval-interval", type=int, default=1000)
    # _add_data_args / _add_tokenizer_args
    p.add_argument("--mock-data", action="store_true")
    p.add_argument("--data-path", nargs="*")
    p.add_argument("--seq-length", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--tokenizer-type", choices=[
        "BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer",
        "SentencePieceTokenizer", "GPTSentencePieceTokenizer", "HuggingFaceTokenizer",
        "Llama2Tokenizer", "TikTokenizer", "MultimodalTokenizer", "NullTokenizer",
        "NullMultimodalTokenizer", "SFTTokenizer"])
    # _add_logging_args
    p.add_argument("--log-throughput", action="store_true")
    return p


@dataclass(frozen=True, slots=True)
class Problem:
    """One rule a command line breaks."""

    rule: str
    message: str
    severity: str = "error"
    """`error`: Megatron-LM stops; `warning`: it changes the setting and goes on."""

    def __str__(self) -> str:
        return f"{self.severity}: {self.rule}: {self.message}"


def _as_megatron_rewrites(a: argparse.Namespace) -> argparse.Namespace:
    # validate_args: `if args.recompute_activations: args.recompute_granularity = 'selective'`.
    if a.recompute_activations:
        a.recompute_granularity = "selective"
    return a


def parse_argv(argv: Sequence[str]) -> argparse.Namespace:
    """The argv parsed as Megatron-LM would; ValueError on an unknown or malformed flag."""
    return _as_megatron_rewrites(argument_parser().parse_args(list(argv)))


def parse_known_argv(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The flags layoutsearch knows parsed as Megatron-LM would, and the others as given
    (a user's extra flags, e.g. --rope-scaling-factor 8); ValueError on a malformed known flag."""
    known, others = argument_parser().parse_known_args(list(argv))
    return _as_megatron_rewrites(known), others


def _nvte_expected(backend: str) -> str:
    return ", ".join(f"{name}={value}" for name, value in NVTE_ATTENTION[backend].items())


def _split(a: argparse.Namespace) -> tuple[int, int]:
    """Layers and stages left to the middle stages once the uneven ends are taken."""
    layers, stages = a.num_layers or 0, a.pipeline_model_parallel_size
    for end in (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers):
        if end is not None:
            layers, stages = layers - end, stages - 1
    return layers, stages


def split_layer_count(a: argparse.Namespace) -> int:
    """The layers validate_args splits over the stages: --num-layers, and one more each for
    the embedding and the loss where --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split count them as layers."""
    return ((a.num_layers or 0) + int(a.account_for_embedding_in_pipeline_split)
            + int(a.account_for_loss_in_pipeline_split))


def pipeline_stage_layers(a: argparse.Namespace) -> list[int]:
    """The transformer layers each pipeline rank builds, first to last.

    As `get_num_layers_to_build` (megatron/core/transformer/transformer_block.py) counts
    them: without --decoder-first/last-pipeline-num-layers an equal share of the layers on
    every rank, the embedding and the loss counted in it where the flags say so and left
    out of the first and the last rank's (one layer fewer there); with them, the first
    (last) rank builds the given count and each middle rank an equal share of the rest
    (none when no middle rank is left).
    """
    pp = a.pipeline_model_parallel_size
    first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
    if first is None and last is None:
        if pp <= 0:
            return []
        stages = [split_layer_count(a) // pp] * pp
        stages[0] -= int(a.account_for_embedding_in_pipeline_split)
        stages[-1] -= int(a.account_for_loss_in_pipeline_split)
        return stages
    middle_layers, middle_stages = _split(a)
    stages = [middle_layers // middle_stages if middle_stages > 0 else 0] * pp
    if first is not None and stages:
        stages[0] = first
    if last is not None and stages:
        stages[-1] = last
    return stages


Check = tuple[bool, str, str, str]
"""(broken, rule, message, severity) of one rule."""


def _model_parallel(a: argparse.Namespace) -> int:
    """Ranks of one model replica: tp·pp·cp."""
    return a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size


def _data_parallel(a: argparse.Namespace, world: int) -> int:
    """Data-parallel ranks: the world over tp·pp·cp (0 where that does not divide it)."""
    model_parallel = _model_parallel(a)
    return world // model_parallel if model_parallel and world % model_parallel == 0 else 0


def _size_checks(a: argparse.Namespace, world: int) -> list[Check]:
    """The parallel sizes against the world, the required sizes, the global batch."""
    model_parallel = _model_parallel(a)
    dp = _data_parallel(a, world)
    mb, gbs = a.micro_batch_size or 0, a.global_batch_size or 0
    return [
        # validate_args: "world size is not divisible by total_model_size".
        (world % model_parallel != 0, "world_size",
         f"world size {world} must divide by tp·pp·cp = {model_parallel}", "error"),
        # validate_args: required_args, and "assert args.micro_batch_size is not None".
        (not all([a.num_layers, a.hidden_size, a.num_attention_heads,
                  a.max_position_embeddings]) or a.micro_batch_size is None,
         "required_args", "--num-layers, --hidden-size, --num-attention-heads, "
         "--max-position-embeddings and --micro-batch-size are required", "error"),
        # validate_args: "assert args.micro_batch_size > 0" and "assert
        # args.global_batch_size > 0".
        (a.micro_batch_size is not None and mb <= 0, "micro_batch_size",
         f"--micro-batch-size {mb} must be > 0", "error"),
        (a.global_batch_size is not None and gbs <= 0, "global_batch_size",
         f"--global-batch-size {gbs} must be > 0", "error"),
        # megatron/core/num_microbatches_calculator.py: global batch size is not divisible
        # by micro batch size times data parallel size. A batch size that is not positive
        # is the rules' above to name (and a micro-batch of 0 would divide by zero here).
        (bool(dp) and mb > 0 and (a.global_batch_size is None
                                  or (gbs > 0 and gbs % (mb * dp) != 0)), "global_batch",
         f"global batch {gbs} must divide by micro-batch {mb} × dp {dp}", "error"),
    ]


def _pipeline_checks(a: argparse.Namespace, world: int) -> list[Check]:
    """How the layers split over pipeline stages, evenly, unevenly or interleaved."""
    pp = a.pipeline_model_parallel_size
    first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
    uneven = first is not None or last is not None
    middle_layers, middle_stages = _split(a)
    middle_broken = uneven and middle_stages > 0 and middle_layers % middle_stages != 0
    stages = pipeline_stage_layers(a)
    dp = _data_parallel(a, world)
    mb, gbs, layers = a.micro_batch_size or 0, a.global_batch_size or 0, a.num_layers or 0
    micro_batches = gbs // (mb * dp) if mb > 0 and dp else 0
    split = split_layer_count(a)
    counted = (f"--num-layers {layers}" if split == layers else
               f"--num-layers {layers} + {split - layers} (the embedding and/or the loss "
               f"counted as layers) = {split}")
    per_stage = split // pp if pp else 0
    vstage = a.num_layers_per_virtual_pipeline_stage
    accounted = a.account_for_embedding_in_pipeline_split or a.account_for_loss_in_pipeline_split
    return [
        # validate_args: "Number of layers should be divisible by the pipeline-model-parallel
        # size" unless --decoder-first/last-pipeline-num-layers split the stages unevenly
        # (asserted on both the interleaved and the plain branch, after adding a layer for
        # each of --account-for-embedding/loss-in-pipeline-split); with interleaving, layers
        # per stage must divide by layers per virtual stage.
        (not uneven and split % pp != 0, "layers_per_stage",
         f"{counted} must divide by pp {pp} (or split the stages with "
         "--decoder-first/last-pipeline-num-layers)", "error"),
        # TransformerConfig.__post_init__: "num_layers_in_first_pipeline_stage and
        # num_layers_in_last_pipeline_stage cannot be set at the same time with
        # account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split".
        (uneven and accounted, "uneven_with_account_split",
         "--decoder-first/last-pipeline-num-layers cannot be combined with "
         "--account-for-embedding-in-pipeline-split or --account-for-loss-in-pipeline-split",
         "error"),
        # validate_args (interleaved branch): "please use --num-virtual-stages-per-pipeline-
        # rank to specify virtual pipeline parallel degree when enable uneven pipeline
        # parallelism".
        (uneven and vstage is not None, "uneven_with_vstage",
         "--num-layers-per-virtual-pipeline-stage cannot be combined with "
         "--decoder-first/last-pipeline-num-layers", "error"),
        # TransformerConfig.__post_init__ (uneven PP): "num_layers_in_first_pipeline_stage
        # must be larger than 0", and the same for the last stage.
        (any(end is not None and end <= 0 for end in (first, last)), "uneven_stage_layers",
         f"--decoder-first-pipeline-num-layers ({first}) and --decoder-last-pipeline-"
         f"num-layers ({last}) must be larger than 0", "error"),
        # TransformerConfig.__post_init__ (uneven PP): "number of layers at middle stage: ...
        # must be divisible by the middle pipeline model parallel size"; get_num_layers_to_
        # build asserts "the left over layers must be divisible by left over stages".
        (middle_broken, "uneven_middle_layers",
         f"number of layers at middle stage: {middle_layers} must be divisible by the middle "
         f"pipeline model parallel size {middle_stages}", "error"),
        # get_num_layers_to_build builds the given counts on the first and last rank and an
        # equal share of the rest on each middle rank (none when no middle rank is left):
        # the checks above do not ask that they add up, so the model would silently have
        # another number of layers, or a stage none.
        (uneven and not middle_broken and (sum(stages) != layers or min(stages) < 1),
         "uneven_layer_count",
         f"pipeline stages would build {stages} layers: they must add up to --num-layers "
         f"{layers} with at least one per stage", "error"),
        (vstage is not None and (vstage <= 0 or per_stage % vstage != 0), "layers_per_vstage",
         f"layers per stage {per_stage} ({counted} over pp {pp}) must divide by "
         f"--num-layers-per-virtual-pipeline-stage {vstage}", "error"),
        # validate_args: interleaving needs pp > 1 (pp > 2 without p2p overlap).
        (vstage is not None and pp <= (1 if a.overlap_p2p_comm else 2), "interleaving_pp",
         f"interleaved schedule needs pp > {1 if a.overlap_p2p_comm else 2}, got {pp}", "error"),
        # megatron/core/pipeline_parallel/schedules.py (interleaved 1F1B): the number of
        # micro-batches must divide by pp.
        (vstage is not None and pp > 1 and micro_batches % pp != 0, "interleaving_micro_batches",
         f"{micro_batches} micro-batches must divide by pp {pp} with interleaving", "error"),
    ]


def _attention_head_checks(a: argparse.Namespace) -> list[Check]:
    """Attention heads and query groups against tensor parallelism and the hidden size."""
    tp = a.tensor_model_parallel_size
    heads = a.num_attention_heads or 0
    groups = a.num_query_groups if a.group_query_attention else heads
    return [
        # TransformerConfig.__post_init__: heads and query groups split over TP ranks.
        (heads % tp != 0, "heads_per_tp",
         f"num_attention_heads ({heads}) must be a multiple of tensor_model_parallel_size ({tp})",
         "error"),
        # (Megatron-LM's main branch lets TP ranks share a group; its releases still ask
        # for a multiple, which layoutsearch's own rule (query_groups_per_tp) keeps.)
        (groups % tp != 0 and tp % groups != 0, "query_groups_per_tp",
         f"num_query_groups ({groups}) must be a multiple or divisor of "
         f"tensor_model_parallel_size ({tp})", "error"),
        # validate_args: kv_channels = hidden_size // heads needs hidden % heads == 0.
        (bool(heads) and (a.hidden_size or 0) % heads != 0, "kv_channels",
         f"--hidden-size {a.hidden_size} must divide by heads {heads}", "error"),
    ]


def _sequence_checks(a: argparse.Namespace) -> list[Check]:
    """The sequence against context parallelism and the position embeddings, and sequence
    parallelism against tensor parallelism."""
    cp = a.context_parallel_size
    return [
        # validate_args: "seq-length should be a multiple of 2 * context-parallel-size".
        (cp > 1 and (a.seq_length or 0) % (2 * cp) != 0, "context_parallel_seq",
         f"--seq-length {a.seq_length} must divide by 2·cp = {2 * cp}", "error"),
        # validate_args: max_position_embeddings >= seq_length.
        ((a.max_position_embeddings or 0) < (a.seq_length or 0), "max_position_embeddings",
         f"--max-position-embeddings {a.max_position_embeddings} < --seq-length "
         f"{a.seq_length}", "error"),
        # validate_args: "--no-position-embedding is deprecated, use
        # --position-embedding-type" (a RuntimeError unless the type is rope).
        (not a.add_position_embedding and a.position_embedding_type != "rope",
         "no_position_embedding", "--no-position-embedding is deprecated (Megatron-LM stops); "
         "use --position-embedding-type", "error"),
        # validate_args: "Disabling sequence parallelism because tensor model parallelism is
        # disabled" (a warning; SP is switched off).
        (a.sequence_parallel and a.tensor_model_parallel_size == 1, "sequence_parallel_needs_tp",
         "--sequence-parallel at tp 1 is switched off by Megatron-LM", "warning"),
    ]


def _recompute_checks(a: argparse.Namespace) -> list[Check]:
    """Activation recomputation: granularity, method, layer count and modules."""
    granularity = a.recompute_granularity
    largest_stage = max(pipeline_stage_layers(a), default=0)
    return [
        # TransformerConfig.__post_init__ (recompute): full needs a method and a layer count
        # between 1 and the layers per pipeline rank; selective takes neither.
        (granularity == "full" and a.recompute_method is None, "recompute_method",
         "--recompute-granularity full needs --recompute-method uniform|block", "error"),
        # Megatron raises when the count is missing ("must be between 1 and
        # num_layers_per_pipeline_rank" is that error's text); a larger count recomputes
        # the whole stage as one chunk.
        (granularity == "full" and (a.recompute_num_layers or 0) < 1,
         "recompute_num_layers",
         f"--recompute-num-layers must be at least 1 (stages have up to {largest_stage})",
         "error"),
        (granularity == "selective" and (a.recompute_method is not None
                                         or a.recompute_num_layers is not None),
         "recompute_selective", "selective recompute takes no --recompute-method or "
         "--recompute-num-layers", "error"),
        (any(m not in RECOMPUTE_MODULES for m in a.recompute_modules or []), "recompute_modules",
         f"--recompute-modules must be among {', '.join(RECOMPUTE_MODULES)}", "error"),
    ]


def _training_checks(a: argparse.Namespace) -> list[Check]:
    """Optimizer overlap, precision, learning rate, data source and tokenizer."""
    return [
        # validate_args: --overlap-param-gather needs the distributed optimizer and
        # --overlap-grad-reduce.
        (a.overlap_param_gather and not (a.use_distributed_optimizer and a.overlap_grad_reduce),
         "overlap_param_gather", "--overlap-param-gather needs --use-distributed-optimizer and "
         "--overlap-grad-reduce", "error"),
        # validate_args: `assert not args.bf16` under fp16 and vice versa.
        (a.fp16 and a.bf16, "precision", "--fp16 and --bf16 exclude each other", "error"),
        # validate_args: lr >= min_lr.
        (a.lr is not None and a.min_lr > a.lr, "min_lr", "--min-lr exceeds --lr", "error"),
        # validate_args: "A single data source must be provided".
        (a.mock_data and bool(a.data_path), "data_source",
         "--mock-data and --data-path exclude each other", "error"),
        # megatron/training/tokenizer: NullTokenizer is built from --vocab-size.
        (a.tokenizer_type == "NullTokenizer" and not a.vocab_size, "null_tokenizer_vocab",
         "NullTokenizer needs --vocab-size", "error"),
    ]


def _implementation_checks(a: argparse.Namespace, env: Mapping[str, str]) -> list[Check]:
    """The layer implementation and attention backend, and the environment they need."""
    tp, cp = a.tensor_model_parallel_size, a.context_parallel_size
    local = a.transformer_impl == "local"
    nvte_conflicts = [f"{name}={env[name]}"
                      for name, value in NVTE_ATTENTION[a.attention_backend].items()
                      if name in env and env[name] != value]
    return [
        # megatron/core/transformer/dot_product_attention.py: "Context parallelism is only
        # supported by TEDotProductAttention!"; Transformer Engine turns its unfused
        # attention off under context parallelism (attention/dot_product_attention/utils.py).
        (cp > 1 and (a.transformer_impl == "local"
                     or a.attention_backend in ("unfused", "local")),
         "context_parallel_attention",
         f"context parallelism (cp {cp}) needs Transformer Engine's flash or fused attention, "
         f"not --transformer-impl {a.transformer_impl} --attention-backend "
         f"{a.attention_backend}", "error"),
        # megatron/core/transformer/torch_norm.py (WrappedTorchNorm) asserts not
        # persist_layer_norm and not sequence_parallel; persist_layer_norm = not
        # --no-persist-layer-norm (core_transformer_config_from_args). The local layers use
        # it for RMSNorm, for LayerNorm too without Apex (backends.py, LocalSpecProvider),
        # and for both in versions whose local backend never picks Apex.
        (local and not a.no_persist_layer_norm, "torch_norm_persist",
         "--transformer-impl local needs --no-persist-layer-norm (PyTorch's norms)", "error"),
        (local and a.sequence_parallel and tp > 1, "torch_norm_sequence_parallel",
         "--transformer-impl local (PyTorch's norms) does not support --sequence-parallel",
         "error"),
        # validate_args: --attention-backend local is only supported with --spec local.
        (a.attention_backend == "local", "attention_backend_local",
         "--attention-backend local needs --spec local", "error"),
        # LanguageModule._set_attention_backend (megatron/core/models/common/language_module/
        # language_module.py) asserts that NVTE_FLASH_ATTN, NVTE_FUSED_ATTN and
        # NVTE_UNFUSED_ATTN are unset or match --attention-backend.
        (bool(nvte_conflicts), "attention_backend_env",
         f"{', '.join(nvte_conflicts)} in the environment conflict(s) with --attention-backend "
         f"{a.attention_backend}, which needs {_nvte_expected(a.attention_backend)}: unset "
         "them", "error"),
        # validate_args: TP or CP > 1 asserts CUDA_DEVICE_MAX_CONNECTIONS=1 (pre-Blackwell).
        ((tp > 1 or cp > 1) and env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1",
         "cuda_device_max_connections",
         "tensor or context parallelism needs CUDA_DEVICE_MAX_CONNECTIONS=1", "error"),
    ]


def _logging_checks(a: argparse.Namespace) -> list[Check]:
    """What layoutsearch's log parser needs of the run."""
    return [
        # The run must log what the parser reads: every iteration with its throughput.
        (a.log_interval != 1 or not a.log_throughput or not a.train_iters, "logging",
         "layoutsearch needs --train-iters, --log-interval 1 and --log-throughput", "error"),
    ]


def _parallel_size_checks(a: argparse.Namespace) -> list[Check]:
    """tp, pp and cp are each at least 1: every other rule divides by them (Megatron-LM's
    own validate_args fails there with a ZeroDivisionError, not a message)."""
    sizes = {"--tensor-model-parallel-size": a.tensor_model_parallel_size,
             "--pipeline-model-parallel-size": a.pipeline_model_parallel_size,
             "--context-parallel-size": a.context_parallel_size}
    return [(size < 1, "parallel_size", f"{flag} {size} must be >= 1", "error")
            for flag, size in sizes.items()]


def _checks(a: argparse.Namespace, env: Mapping[str, str], world: int) -> list[Check]:
    """Every rule, group by group, in the order their problems are reported; `a` is the
    parsed argv. A parallel size below 1 is the only problem reported: the other rules
    would divide by it."""
    sizes = _parallel_size_checks(a)
    if any(broken for broken, *_ in sizes):
        return sizes
    return [*_size_checks(a, world), *_pipeline_checks(a, world), *_attention_head_checks(a),
            *_sequence_checks(a), *_recompute_checks(a), *_training_checks(a),
            *_implementation_checks(a, env), *_logging_checks(a)]


def validate_argv(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  world_size: int) -> list[Problem]:
    """Every Megatron-LM rule the command breaks (no errors when it would start).

    Flags layoutsearch does not emit (a user's `extra_args`) are reported as warnings:
    they are passed on unchecked.
    """
    given = {word.split("=", 1)[0] for word in argv}  # --batch-size=8 is --batch-size 8
    deprecated = [Problem("deprecated_flag", f"{flag}: {why}", severity)
                  for flag, (severity, why) in DEPRECATED_FLAGS.items() if flag in given]
    if any(p.severity == "error" for p in deprecated):
        return deprecated
    try:
        parsed, unknown = parse_known_argv(argv)
    except ValueError as error:
        return [*deprecated, Problem("argparse", str(error))]
    flags = [f for f in unknown if f.startswith("--") and f not in DEPRECATED_FLAGS]
    unchecked = [Problem("unchecked_flag", f"{' '.join(flags)}: passed on to Megatron-LM "
                         "as given, not checked by layoutsearch", "warning")] if flags else []
    return [*deprecated, *unchecked,
            *(Problem(rule, message, severity)
              for broken, rule, message, severity in _checks(parsed, env or {}, world_size)
              if broken)]
