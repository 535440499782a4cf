"""Whether a command runs as built: checks shared by everything that hands one on.

A command goes to Megatron-LM from three places: the measured cost model launches it, the
`megatron_args` column shows it, and `emit=megatron` writes it into a script. Each must run
the layout it was built for, so the same checks stand before all three:

- a user's settings may not set a flag or variable that each command sets itself
  (`settings_conflicts`): Megatron-LM keeps the last of a repeated flag, and the settings'
  environment is exported after the layout's, so the run would be another layout;
- Megatron-LM's own argument checks must pass (`rejection`), and when the settings' extra
  flags break a rule no layout has a say in, the settings are at fault, not the layout
  (`every_command_rejected`).

    problem = settings_conflicts(settings.extra_args, settings.env)
    error = rejection(command, command.env)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from layoutsearch.megatron.args import EVERY_COMMAND_ARGS, NVTE_ATTENTION, MegatronCommand
from layoutsearch.megatron.settings import MegatronSettings
from layoutsearch.megatron.validation import (
    LAYOUT_FREE_RULES,
    Problem,
    argument_parser,
    validate_argv,
)

_MODEL = {dest: f"model.{field}" for dest, field in {
    "num_layers": "num_layers", "hidden_size": "hidden_size",
    "ffn_hidden_size": "ffn_hidden_size", "num_attention_heads": "num_attention_heads",
    "group_query_attention": "num_query_groups", "num_query_groups": "num_query_groups",
    "max_position_embeddings": "max_position_embeddings",
    "position_embedding_type": "position_embedding_type", "rotary_base": "rotary_base",
    "use_rope_scaling": "rope_scaling_factor", "rope_scaling_factor": "rope_scaling_factor",
    "normalization": "normalization", "swiglu": "swiglu",
    "untie_embeddings_and_output_weights": "untie_embeddings",
    "add_bias_linear": "add_bias_linear", "add_position_embedding": "position_embedding_type",
    "kv_channels": "hidden_size",  # hidden_size / num_attention_heads
    "vocab_size": "vocab_size",
}.items()}
SET_FROM: dict[str, str] = {
    **_MODEL,
    # Priced without dropout (costs/memory.py keeps no masks), as LLaMA trains.
    "attention_dropout": "the priced model (no dropout)",
    "hidden_dropout": "the priced model (no dropout)",
    "mock_data": "the synthetic data commands measure on",
    "tokenizer_type": "the synthetic data commands measure on",
    "seq_length": "seq_length",
    "global_batch_size": "global_batch_size",
    "rampup_batch_size": "global_batch_size",
    "tensor_model_parallel_size": "the layout's tp",
    "pipeline_model_parallel_size": "the layout's pp",
    "decoder_first_pipeline_num_layers": "the layout's pp (layers per stage)",
    "decoder_last_pipeline_num_layers": "the layout's pp (layers per stage)",
    "account_for_embedding_in_pipeline_split": "the layout's pp and vp (layers per chunk)",
    "account_for_loss_in_pipeline_split": "the layout's pp and vp (layers per chunk)",
    "num_layers_per_virtual_pipeline_stage": "the layout's vp",
    "num_virtual_stages_per_pipeline_rank": "the layout's vp",
    "context_parallel_size": "the layout's cp",
    "micro_batch_size": "the layout's micro_batch_size",
    "sequence_parallel": "the layout's sequence_parallel",
    "attention_backend": "the layout's attention",
    "masked_softmax_fusion": "the layout's attention",
    "transformer_impl": "the layout's attention and rmsnorm_kernel",
    "no_persist_layer_norm": "the layout's attention and rmsnorm_kernel",
    "recompute_activations": "the layout's recompute",
    "recompute_granularity": "the layout's recompute",
    "recompute_method": "the layout's recompute",
    "recompute_num_layers": "the layout's recompute",
    "recompute_modules": "the layout's recompute",
    "use_distributed_optimizer": "the layout's distributed_optimizer",
    "overlap_grad_reduce": "the layout's overlap_grad_reduce",
    "overlap_param_gather": "the layout's overlap_grad_reduce",
    "bf16": "bf16 training, the precision priced",
    "fp16": "bf16 training, the precision priced",
    "fp8": "bf16 training, the precision priced",
    "grad_reduce_in_bf16": "megatron.grad_reduce_in_bf16",
    "train_iters": "megatron.train_iters",
    "eval_iters": "megatron.train_iters (a run without evaluation)",
    "eval_interval": "megatron.train_iters (a run without evaluation)",
    "lr": "megatron.lr",
    "min_lr": "megatron.lr",
    "log_interval": "the log parser (a line every iteration)",
    "log_throughput": "the log parser (TFLOP/s per GPU)",
}
"""The parsed flags every command sets (argparse `dest` -> what it is set from). A user's
extra_args may not set them: argparse keeps the last of a repeated flag, so the run would
not be the one ranked, and the measurement would be recorded under the wrong layout."""

_KERNEL_REMEDY = "leave a kernel out of the search space instead (e.g. attention=[fused,torch])"
ENV_SET_FROM: dict[str, tuple[str, str]] = {
    **dict.fromkeys(NVTE_ATTENTION["auto"], ("the layout's attention", _KERNEL_REMEDY)),
    "NVTE_MASKED_SOFTMAX_FUSION": ("the layout's attention (0 for torch)", _KERNEL_REMEDY),
    # validate_args asserts it with tensor or context parallelism (before Blackwell); at
    # tp = cp = 1 one connection would serialize the data-parallel traffic with compute.
    "CUDA_DEVICE_MAX_CONNECTIONS": (
        "the layout's tp and cp (1 where either is above 1)",
        "commands set it where Megatron-LM asks for it and leave it unset elsewhere"),
}
"""The environment variables commands set per layout (name -> what sets it, what to do
instead). The settings' env is exported after the layout's, so it would override them."""


def _repeats(extra_args: Sequence[str]) -> set[str]:
    """The dests of extra_args that repeat, with the same value, words every command carries
    (`--bf16`, `--log-interval 1`): the run is the same with them."""
    parser = argument_parser()
    fixed, _ = parser.parse_known_args(list(EVERY_COMMAND_ARGS))
    try:
        given, _ = parser.parse_known_args(list(extra_args))
    except ValueError:  # malformed (`--log-interval x`): not a repeat; validation says why
        return set()
    # Only what those words set: any other flag given at its default (--tensor-model-
    # parallel-size 1) would still override the layout's value.
    carried = {dest: value for dest, value in vars(fixed).items()
               if value != parser.get_default(dest)}
    return {dest for dest, value in carried.items() if getattr(given, dest) == value}


def settings_conflicts(extra_args: Sequence[str], env: Mapping[str, str]) -> str:
    """Why the settings' extra flags or environment would change the layout each command
    runs ("" when they do not): they set what commands set from the layout and job. A flag
    that repeats what every command carries, with the same value, changes nothing."""
    # argparse offers no public map from an option string to its action.
    actions = argument_parser()._option_string_actions if extra_args else {}
    repeats = _repeats(extra_args) if extra_args else set()
    flags = {flag: SET_FROM[action.dest]
             for flag in (word.split("=", 1)[0] for word in extra_args)
             if (action := actions.get(flag)) is not None and action.dest in SET_FROM
             and action.dest not in repeats}
    if flags:
        named = "; ".join(f"{flag} (from {owner})" for flag, owner in flags.items())
        return (f"megatron.extra_args={list(extra_args)}: every command sets {named} itself, "
                "and Megatron-LM keeps the last of a repeated flag, so the run would not be "
                "the layout ranked; remove them, and choose a layout knob in the search "
                "space, a model field with model.<field>, a run setting with "
                "megatron.<field>")
    names = [name for name in env if name in ENV_SET_FROM]
    if names:
        given = ", ".join(f"{name}={env[name]}" for name in names)
        named = "; ".join(f"{name} (from {ENV_SET_FROM[name][0]})" for name in names)
        remedies = "; ".join(dict.fromkeys(ENV_SET_FROM[name][1] for name in names))
        return (f"megatron.env: {given}: commands set {named} themselves, and the "
                "settings' environment would override it, so the run would not be the "
                f"layout ranked (or Megatron-LM would refuse it); remove it: {remedies}")
    return ""


def rejection(command: MegatronCommand, env: Mapping[str, str]) -> Problem | None:
    """Megatron-LM's first objection to the command in `env` (None when it would start)."""
    errors = [p for p in validate_argv(command.argv, env=env, world_size=command.num_gpus)
              if p.severity == "error"]
    return errors[0] if errors else None


def every_command_rejected(problem: Problem,
                           build: Callable[[MegatronSettings], MegatronCommand],
                           settings: MegatronSettings,
                           environment: Callable[[MegatronCommand], Mapping[str, str]]) -> str:
    """Why the settings' extra flags make Megatron-LM reject every command, given its
    objection to one of them ("" when the layout's own command is at fault): the rule broken
    is one no layout has a say in, and the command would start without them. A flag that
    breaks some layouts only (--no-overlap-p2p-communication with interleaving at pp 2)
    leaves the others to run."""
    if not settings.extra_args or problem.rule not in LAYOUT_FREE_RULES:
        return ""
    bare = build(settings.replace(extra_args=()))
    if rejection(bare, environment(bare)) is not None:
        return ""
    return (f"with the Megatron-LM settings' extra_args {list(settings.extra_args)}, "
            f"Megatron-LM would reject every command ({problem}). Commands measure on "
            "synthetic data (--mock-data with a NullTokenizer, so that a trial needs no "
            "dataset)")
