"""Command lines of layouts: flags, environment, caveats, and Megatron-LM's own rules."""

from __future__ import annotations

import pytest
from megatron_study import STUDY_BEST, study_job, study_layout

from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.layout import Layout
from layoutsearch.megatron import MegatronSettings, build_command, parse_argv, validate_argv
from layoutsearch.megatron.inverse import row_of_argv
from layoutsearch.specs import Job

GLOBAL_TOKENS = 2**22


@pytest.mark.parametrize(("model", "seq", "gpus", "tp", "pp"), STUDY_BEST)
def test_the_study_best_layouts_pass_megatron_validation(model, seq, gpus, tp, pp):
    command = build_command(study_layout(gpus, tp, pp), study_job(model, seq, gpus))
    problems = validate_argv(command.argv, env=command.env, world_size=gpus)
    assert problems == []
    assert command.exact
    args = parse_argv(command.argv)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (tp, pp)
    assert args.global_batch_size == GLOBAL_TOKENS // seq
    assert args.seq_length == seq and args.vocab_size == 128000
    assert args.attention_backend == "flash" and args.transformer_impl == "transformer_engine"
    assert args.recompute_granularity is None and args.bf16 and args.mock_data
    assert (command.env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1") == (tp > 1)


def test_llama_flags_and_short_run():
    command = build_command(study_layout(64, 1, 1), study_job("llama_13b", 2048, 64))
    argv = command.argv
    for flag in ("--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                 "--use-distributed-optimizer", "--overlap-grad-reduce",
                 "--overlap-param-gather", "--grad-reduce-in-bf16", "--log-throughput"):
        assert flag in argv
    args = parse_argv(argv)
    assert args.normalization == "RMSNorm" and args.position_embedding_type == "rope"
    assert args.num_layers == 40 and args.hidden_size == 5120 and args.ffn_hidden_size == 13824
    assert args.log_interval == 1 and args.eval_iters == 0
    assert args.tokenizer_type == "NullTokenizer"
    assert "--group-query-attention" not in argv  # llama 13b has no GQA


def test_gqa_and_recompute_mapping():
    job = Job(model=load_model("llama3_8b"), cluster=load_cluster("h100_sxm"), num_gpus=8,
              seq_length=8192, global_batch_size=64)
    full = parse_argv(build_command(Layout(tp=2, dp=4, recompute="full"), job).argv)
    assert full.group_query_attention and full.num_query_groups == 8
    assert (full.recompute_granularity, full.recompute_method, full.recompute_num_layers) == \
        ("full", "uniform", 1)
    mlp = parse_argv(build_command(Layout(tp=2, dp=4, recompute="mlp"), job).argv)
    assert (mlp.recompute_granularity, mlp.recompute_modules) == ("selective", ["mlp"])
    selective = parse_argv(build_command(Layout(tp=2, dp=4, recompute="selective"), job).argv)
    assert (selective.recompute_granularity, selective.recompute_modules) == \
        ("selective", ["core_attn"])


@pytest.mark.parametrize(("attention", "rmsnorm", "impl", "backend", "softmax_env"), [
    ("flash2", True, "transformer_engine", "flash", None),
    ("fused", True, "transformer_engine", "unfused", None),
    ("torch", True, "transformer_engine", "unfused", "0"),
    ("fused", False, "local", "auto", None),
    ("torch", False, "local", "auto", None),
])
def test_attention_and_rmsnorm_kernels(attention, rmsnorm, impl, backend, softmax_env):
    layout = study_layout(64, 1, 1, attention=attention, rmsnorm_kernel=rmsnorm)
    command = build_command(layout, study_job("llama_13b", 2048, 64))
    args = parse_argv(command.argv)
    assert (args.transformer_impl, args.attention_backend) == (impl, backend)
    assert args.masked_softmax_fusion == (attention != "torch")
    assert command.env.get("NVTE_MASKED_SOFTMAX_FUSION") == softmax_env
    assert command.exact
    row = row_of_argv(command.argv, env=command.env, world_size=64, gpu="a100_80gb")
    assert (row["attention"], row["rmsnorm_kernel"]) == (attention, rmsnorm)


def test_inexpressible_kernels_say_so():
    job = study_job("llama_13b", 2048, 64)
    flash1 = build_command(study_layout(64, 1, 1, attention="flash1"), job)
    assert not flash1.exact and "flash1" in flash1.notes[0]
    plain_norm = build_command(study_layout(64, 1, 1, rmsnorm_kernel=False), job)
    assert any("rmsnorm_kernel=false" in n for n in plain_norm.notes)


def test_round_trip_of_a_layout_through_its_argv():
    layout = study_layout(128, 4, 2, sequence_parallel=True, micro_batch_size=2, vp=2,
                          recompute="full")
    job = study_job("llama_30b", 8192, 128)
    command = build_command(layout, job)
    row = row_of_argv(command.argv, env=command.env, world_size=128, gpu="a100_80gb")
    assert Layout.from_row(row) == layout
    assert validate_argv(command.argv, env=command.env, world_size=128) == []
    # 60 layers cannot be split into pp4 × vp2 chunks: Megatron-LM (and we) refuse.
    bad = build_command(study_layout(128, 4, 4, vp=2), job)
    rules = {p.rule for p in validate_argv(bad.argv, env=bad.env, world_size=128)}
    assert "layers_per_vstage" in rules


def test_settings_control_overlap_and_extra_args():
    settings = MegatronSettings(overlap_param_gather=False, grad_reduce_in_bf16=False,
                                extra_args=("--manual-gc",), env={"NCCL_DEBUG": "WARN"})
    command = build_command(study_layout(64, 1, 1), study_job("llama_13b", 2048, 64), settings)
    assert "--overlap-param-gather" not in command.argv
    assert "--grad-reduce-in-bf16" not in command.argv
    assert command.argv[-1] == "--manual-gc" and command.env["NCCL_DEBUG"] == "WARN"


def _rules(argv: list[str], env: dict[str, str] | None = None, world: int = 64) -> set[str]:
    return {p.rule for p in validate_argv(argv, env=env or {}, world_size=world)}


@pytest.fixture
def argv() -> list[str]:
    command = build_command(study_layout(64, 2, 2), study_job("llama_13b", 2048, 64))
    return list(command.argv)


def _set(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_validation_catches_each_rule(argv):
    assert _rules(argv, ENV) == set()
    assert "cuda_device_max_connections" in _rules(argv)
    assert "world_size" in _rules(argv, ENV, world=62)
    assert "heads_per_tp" in _rules(_set(argv, "--tensor-model-parallel-size", "3"), ENV,
                                    world=96)
    assert "layers_per_stage" in _rules(_set(argv, "--pipeline-model-parallel-size", "16"),
                                        ENV, world=64)
    assert "global_batch" in _rules(_set(argv, "--global-batch-size", "100"), ENV)
    assert "max_position_embeddings" in _rules(_set(argv, "--seq-length", "4096"), ENV)
    vp_at_pp1 = [*_set(argv, "--pipeline-model-parallel-size", "1"),
                 "--num-layers-per-virtual-pipeline-stage", "10"]
    assert "interleaving_pp" in _rules(vp_at_pp1, ENV, world=64)
    no_dist_opt = [a for a in argv if a != "--use-distributed-optimizer"]
    assert "overlap_param_gather" in _rules(no_dist_opt, ENV)
    full_without_method = [*argv, "--recompute-granularity", "full"]
    assert {"recompute_method", "recompute_num_layers"} <= _rules(full_without_method, ENV)
    assert "recompute_modules" in _rules(
        [*argv, "--recompute-granularity", "selective", "--recompute-modules", "attn"], ENV)
    assert "context_parallel_seq" in _rules([*argv, "--context-parallel-size", "3"], ENV,
                                            world=192)


def test_deprecated_and_unknown_flags_are_rejected(argv):
    assert _rules([*argv, "--use-flash-attn"], ENV) == {"deprecated_flag"}
    assert _rules([*argv, "--checkpoint-activations"], ENV) == {"deprecated_flag"}
    assert _rules([*argv, "--tensor-parallel-size", "2"], ENV) == {"argparse"}


def test_sequence_parallel_at_tp1_is_a_warning_not_an_error():
    command = build_command(study_layout(64, 1, 1), study_job("llama_13b", 2048, 64))
    problems = validate_argv([*command.argv, "--sequence-parallel"], env={}, world_size=64)
    assert [(p.rule, p.severity) for p in problems] == [("sequence_parallel_needs_tp", "warning")]
    assert "--sequence-parallel" not in build_command(
        study_layout(64, 1, 1, sequence_parallel=True), study_job("llama_13b", 2048, 64)).argv
