"""Command lines of layouts: flags, environment, caveats, and Megatron-LM's own rules."""

from __future__ import annotations

import dataclasses
import re

import pytest
from megatron_study import STUDY_BEST, study_job, study_layout

import layoutsearch
from layoutsearch.catalog import clusters_by_gpu, load_cluster, load_model
from layoutsearch.costs import build_cost_model
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import Layout
from layoutsearch.megatron import (
    MegatronSettings,
    best_command_lines,
    build_command,
    parse_argv,
    validate_argv,
)
from layoutsearch.megatron.args import NVTE_ATTENTION
from layoutsearch.megatron.inverse import row_of_argv
from layoutsearch.megatron.scripts import sbatch_script
from layoutsearch.paths import config_dir, config_folders
from layoutsearch.results import job_of
from layoutsearch.rules import violations
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
    # NullTokenizer adds its end-of-document token: Megatron builds 128000 rows, as priced.
    assert args.seq_length == seq and args.vocab_size == 127999
    assert args.tokenizer_type == "NullTokenizer"
    assert args.attention_backend == "flash" and args.transformer_impl == "transformer_engine"
    assert args.recompute_granularity is None and args.bf16 and args.mock_data
    assert (command.env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1") == (tp > 1)


def test_llama_flags_and_short_run():
    command = build_command(study_layout(64, 1, 1, overlap_grad_reduce=True),
                            study_job("llama_13b", 2048, 64))
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
    # Megatron-LM's defaults are 0.1; the priced (and LLaMA's) blocks have no dropout.
    assert args.attention_dropout == 0.0 and args.hidden_dropout == 0.0


def test_rope_base_is_the_models():
    # LLaMA-1/2 use RoPE's original base 10,000; Llama 3 trains with 500,000 (its table 3).
    llama = parse_argv(build_command(study_layout(64, 1, 1), study_job("llama_13b", 2048, 64)).argv)
    assert llama.rotary_base == 10000
    job = Job(model=load_model("llama3_8b"), cluster=load_cluster("h100_sxm"), num_gpus=8,
              seq_length=8192, global_batch_size=64)
    llama3 = parse_argv(build_command(Layout(tp=1, dp=8), job).argv)
    assert llama3.rotary_base == 500000 and not llama3.use_rope_scaling
    # Llama 3.1 405B scales RoPE's frequencies (its released config: factor 8).
    job_405b = dataclasses.replace(job, model=load_model("llama3_405b"), num_gpus=1024)
    llama31 = parse_argv(build_command(Layout(tp=8, pp=16, dp=8), job_405b).argv)
    assert llama31.use_rope_scaling and llama31.rope_scaling_factor == 8.0
    learned = dataclasses.replace(
        job, model=job.model.replace(position_embedding_type="learned_absolute",
                                     max_position_embeddings=8192, rotary_base=10000))
    assert "--rotary-base" not in build_command(Layout(tp=1, dp=8), learned).argv


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


@pytest.mark.parametrize(("backend", "attention"), [
    ("auto", "flash2"), ("fused", "flash2"), ("flash", "flash2"), ("unfused", "fused")])
def test_a_command_from_elsewhere_reads_back_transformer_engines_attention(backend, attention):
    # Megatron-LM's default `auto` and cuDNN's `fused` keep the scores on chip, as flash does.
    command = build_command(study_layout(64, 1, 1), study_job("llama_13b", 2048, 64))
    argv = _set(list(command.argv), "--attention-backend", backend)
    assert row_of_argv(argv, env={}, world_size=64, gpu="a100_80gb")["attention"] == attention


def test_recompute_modules_may_be_given_without_a_value_as_megatron_allows():
    command = build_command(study_layout(64, 1, 1), study_job("llama_13b", 2048, 64))
    argv = [*command.argv, "--recompute-granularity", "selective", "--recompute-modules"]
    assert not [p for p in validate_argv(argv, env=command.env, world_size=64)
                if p.severity == "error"]


def test_inexpressible_kernels_say_so():
    job = study_job("llama_13b", 2048, 64)
    flash1 = build_command(study_layout(64, 1, 1, attention="flash1"), job)
    assert not flash1.exact and "flash1" in flash1.notes[0]
    plain_norm = build_command(study_layout(64, 1, 1, rmsnorm_kernel=False), job)
    assert any("rmsnorm_kernel=false" in n for n in plain_norm.notes)


def test_flash2_on_hopper_is_the_flash3_command_and_says_so():
    job = Job(model=load_model("llama_13b"), cluster=load_cluster("h100_sxm"), num_gpus=8,
              seq_length=2048, global_batch_size=64)
    flash2, flash3 = (build_command(Layout(dp=8, attention=kernel, rmsnorm_kernel=True), job)
                      for kernel in ("flash2", "flash3"))
    assert flash2.argv == flash3.argv and flash3.exact
    assert not flash2.exact and "flash2 on Hopper is the flash3 command" in flash2.notes[0]
    # On Ampere, flash2 is the only FlashAttention the backend runs: exact.
    assert build_command(study_layout(64, 1, 1, attention="flash2"),
                         study_job("llama_13b", 2048, 64)).exact


def test_a_flash3_command_says_it_needs_flashattention_3_installed(tmp_path):
    # One command runs FlashAttention 2 or 3 by what is installed: a flash3 winner's command,
    # script and report name the package, or the run measures the flash2 layout.
    job = Job(model=load_model("llama3_8b"), cluster=load_cluster("h100_sxm"), num_gpus=8,
              seq_length=8192, global_batch_size=64)
    flash3 = build_command(Layout(dp=8, attention="flash3", rmsnorm_kernel=True), job)
    need = ("FlashAttention 3 installed beside Transformer Engine (flash-attention's hopper/ "
            "build, imported as flash_attn_interface): without it --attention-backend flash "
            "runs FlashAttention 2, the flash2 layout")
    assert flash3.requires == (need,) and flash3.exact
    assert f"# needs: {need}" in sbatch_script(flash3, MegatronSettings())
    assert build_command(Layout(dp=8, attention="flash2", rmsnorm_kernel=True),
                         study_job("llama_13b", 2048, 8)).requires == ()
    ranked = layoutsearch.search(model="llama3_8b", cluster="h100_sxm", num_gpus=8,
                                 seq_length=8192, global_batch_size=64, attention="flash3",
                                 rmsnorm_kernel=True)
    lines = best_command_lines(ranked, width=1_000)
    assert lines[-1] == f"needs: {need}"
    report = layoutsearch.report(ranked, tmp_path).read_text()
    assert f"The run needs {need}." in report


def test_local_layers_get_a_norm_megatron_can_build():
    job = study_job("llama_13b", 2048, 64)
    local = build_command(study_layout(64, 2, 1, attention="fused", rmsnorm_kernel=False), job)
    assert "--no-persist-layer-norm" in local.argv and local.exact
    assert validate_argv(local.argv, env=local.env, world_size=64) == []
    persisted = [a for a in local.argv if a != "--no-persist-layer-norm"]
    assert _rules(persisted, local.env) == {"torch_norm_persist"}
    # PyTorch's RMSNorm refuses sequence parallelism: the command runs TE's fused RMSNorm
    # and says that rmsnorm_kernel=false was not kept.
    sp = build_command(study_layout(64, 2, 1, attention="fused", rmsnorm_kernel=False,
                                    sequence_parallel=True), job)
    args = parse_argv(sp.argv)
    assert (args.transformer_impl, args.attention_backend) == ("transformer_engine", "unfused")
    assert not sp.exact and any("sequence parallelism" in n for n in sp.notes)
    assert validate_argv(sp.argv, env=sp.env, world_size=64) == []
    assert _rules([*local.argv, "--sequence-parallel"], local.env) == {
        "torch_norm_sequence_parallel"}


def test_layernorm_models_have_no_rmsnorm_kernel_to_lose():
    # GPT-3 uses LayerNorm, which is one kernel in every layer implementation: its commands
    # carry no rmsnorm caveat, and a measured search launches them.
    job = Job(model=load_model("gpt3_175b"), cluster=load_cluster("a100_80gb"),
              num_gpus=1024, seq_length=2048, global_batch_size=1536)
    for layout in (Layout(tp=8, pp=16, dp=8, sequence_parallel=True, rmsnorm_kernel=False),
                   Layout(tp=8, pp=16, dp=8, attention="fused", rmsnorm_kernel=False)):
        command = build_command(layout, job)
        assert command.exact, command.notes
        assert validate_argv(command.argv, env=command.env, world_size=1024) == []
        args = parse_argv(command.argv)
        assert args.normalization == "LayerNorm"
        row = row_of_argv(command.argv, env=command.env, world_size=1024, gpu="a100_80gb")
        assert not row["rmsnorm_kernel"]
    # Without Apex the local layers' LayerNorm is PyTorch's, which refuses the persistent
    # kernel and sequence parallelism: local commands turn persistence off, and sequence
    # parallelism moves to Transformer Engine's layers.
    local = build_command(Layout(tp=8, pp=16, dp=8, attention="fused", rmsnorm_kernel=False),
                          job)
    assert parse_argv(local.argv).transformer_impl == "local"
    assert "--no-persist-layer-norm" in local.argv
    assert _rules([a for a in local.argv if a != "--no-persist-layer-norm"], local.env,
                  world=1024) == {"torch_norm_persist"}
    sp = build_command(Layout(tp=8, pp=16, dp=8, attention="fused", rmsnorm_kernel=False,
                              sequence_parallel=True), job)
    assert parse_argv(sp.argv).transformer_impl == "transformer_engine" and sp.exact


def test_context_parallelism_needs_transformer_engine_attention():
    job = study_job("llama_13b", 8192, 64)
    flash = build_command(study_layout(64, 2, 1, cp=2, dp=16), job)
    assert validate_argv(flash.argv, env=flash.env, world_size=64) == []
    unfused = _set(flash.argv, "--attention-backend", "unfused")
    assert _rules(unfused, {**flash.env, **NVTE_ATTENTION["unfused"]}) == {
        "context_parallel_attention"}


@pytest.mark.parametrize(("model", "seq", "gpus"), [("llama3_8b", 8192, 64),
                                                    ("gpt3_175b", 2048, 256)])
def test_every_layout_the_search_passes_gets_a_command_megatron_accepts(model, seq, gpus):
    ranked = layoutsearch.search(model=model, num_gpus=gpus, seq_length=seq,
                                 global_batch_size=512, search_space="default")
    passing = ranked[violations(ranked, clusters_by_gpu()) == ""]
    # One row per kernel/parallelism combination, whatever its batch and recompute.
    keys = ["tp", "pp", "cp", "vp", "sequence_parallel", "attention", "rmsnorm_kernel",
            "distributed_optimizer"]
    sample = passing.drop_duplicates(keys)
    assert len(sample) > 50
    job = job_of(ranked, "test")
    for _, row in sample.iterrows():
        command = build_command(Layout.from_row(row), job)
        errors = [p for p in validate_argv(command.argv, env=command.env, world_size=gpus)
                  if p.severity == "error"]
        assert errors == [], (Layout.from_row(row), errors)


def test_round_trip_of_a_layout_through_its_argv():
    layout = study_layout(128, 4, 2, sequence_parallel=True, micro_batch_size=2, vp=2,
                          recompute="full")
    job = study_job("llama_30b", 8192, 128)
    command = build_command(layout, job)
    row = row_of_argv(command.argv, env=command.env, world_size=128, gpu="a100_80gb")
    assert Layout.from_row(row) == layout
    assert validate_argv(command.argv, env=command.env, world_size=128) == []
    # 60 layers cannot be split into pp4 × vp2 chunks: no layers-per-virtual-stage count
    # says it (7 would run 15 // 7 = 2 chunks of 7 and leave one over).
    with pytest.raises(LayoutSearchError, match=r"vp=2: num_layers=60 must divide by pp·vp = 8"):
        build_command(study_layout(128, 4, 4, vp=2), job)
    # And Megatron-LM's own rule, on a command line that asks for it.
    argv = list(command.argv)
    argv[argv.index("--num-layers-per-virtual-pipeline-stage") + 1] = "4"  # 30 per stage
    rules = {p.rule for p in validate_argv(argv, env=command.env, world_size=128)}
    assert "layers_per_vstage" in rules


def test_layout_sets_the_overlap_flags():
    job = study_job("llama_13b", 2048, 64)

    def flags(**changes: object) -> set[str]:
        argv = build_command(study_layout(64, 1, 1, **changes), job).argv
        return {a for a in argv if a.startswith("--overlap-")}

    assert flags() == set()  # Megatron-LM's default, as the study ran
    assert flags(overlap_grad_reduce=True) == {"--overlap-grad-reduce", "--overlap-param-gather"}
    # No weight all-gather without the distributed optimizer, and Megatron-LM refuses
    # --overlap-param-gather there.
    assert flags(overlap_grad_reduce=True, distributed_optimizer=False) == {
        "--overlap-grad-reduce"}


def test_settings_control_grad_precision_and_extra_args():
    settings = MegatronSettings(grad_reduce_in_bf16=False, extra_args=("--manual-gc",),
                                env={"NCCL_DEBUG": "WARN"})
    command = build_command(study_layout(64, 1, 1), study_job("llama_13b", 2048, 64), settings)
    assert "--grad-reduce-in-bf16" not in command.argv
    assert command.argv[-1] == "--manual-gc" and command.env["NCCL_DEBUG"] == "WARN"


def test_a_knob_in_the_megatron_settings_says_where_it_belongs():
    with pytest.raises(LayoutSearchError, match="overlap_grad_reduce is a layout knob"):
        MegatronSettings.from_dict({"overlap_grad_reduce": True})


def test_a_misspelt_megatron_setting_is_named_with_the_closest_one():
    with pytest.raises(LayoutSearchError, match=re.escape(
            "site.yaml: unknown Megatron-LM setting 'launcer'; did you mean 'launcher'? valid "
            "Megatron-LM setting names: env, ") + r".*; also unknown: 'megatron_paht'$"):
        MegatronSettings.from_dict({"launcer": "local", "megatron_paht": "/opt/m"}, "site.yaml")


def _rules(argv: list[str], env: dict[str, str] | None = None, world: int = 64) -> set[str]:
    return {p.rule for p in validate_argv(argv, env=env or {}, world_size=world)}


@pytest.fixture
def argv() -> list[str]:
    command = build_command(study_layout(64, 2, 2, overlap_grad_reduce=True),
                            study_job("llama_13b", 2048, 64))
    return list(command.argv)


def _problems(argv: list[str]) -> list[tuple[str, str]]:
    return [(p.rule, p.message) for p in validate_argv(argv, env=ENV, world_size=64)]


def _remove(argv: list[str], flag: str) -> list[str]:
    at = argv.index(flag)
    return argv[:at] + argv[at + 2:]


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
    # Megatron-LM asserts both batch sizes > 0: a micro-batch of 0 or -1 is named with its
    # value (0 divided by zero in the global-batch rule, -1 passed every rule).
    assert _problems(_set(argv, "--micro-batch-size", "0")) == [
        ("micro_batch_size", "--micro-batch-size 0 must be > 0")]
    assert _problems(_set(argv, "--micro-batch-size", "-1")) == [
        ("micro_batch_size", "--micro-batch-size -1 must be > 0")]
    assert _problems(_set(argv, "--global-batch-size", "-2048")) == [
        ("global_batch_size", "--global-batch-size -2048 must be > 0")]
    assert _rules(_remove(argv, "--micro-batch-size"), ENV) == {"required_args"}
    # A parallel size below 1 is named alone: every other rule divides by it.
    assert _problems(_set(argv, "--tensor-model-parallel-size", "0")) == [
        ("parallel_size", "--tensor-model-parallel-size 0 must be >= 1")]
    assert _problems([*_set(argv, "--pipeline-model-parallel-size", "-2"),
                      "--context-parallel-size", "0"]) == [
        ("parallel_size", "--pipeline-model-parallel-size -2 must be >= 1"),
        ("parallel_size", "--context-parallel-size 0 must be >= 1")]
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


def _severities(argv, env):
    return {(p.rule, p.severity) for p in validate_argv(argv, env=env, world_size=64)}


def test_deprecated_unknown_and_malformed_flags(argv):
    # Megatron-LM exits on the first, and still runs (mapping or ignoring it) with the second.
    assert _severities([*argv, "--checkpoint-activations"], ENV) == {("deprecated_flag", "error")}
    assert _severities([*argv, "--batch-size=8"], ENV) == {("deprecated_flag", "error")}
    assert _severities([*argv, "--use-flash-attn"], ENV) == {("deprecated_flag", "warning")}
    # Ignored by current Megatron-LM (mcore models are the default), not an unknown flag.
    ignored = validate_argv([*argv, "--use-mcore-models"], env=ENV, world_size=64)
    assert [str(p) for p in ignored] == ["warning: deprecated_flag: --use-mcore-models: "
                                         "ignored; Megatron-Core models are the default"]
    # A flag layoutsearch does not emit (a user's extra_args) is passed on, said unchecked.
    unchecked = validate_argv([*argv, "--rotary-percent", "0.5"], env=ENV, world_size=64)
    assert [(p.rule, p.severity) for p in unchecked] == [("unchecked_flag", "warning")]
    assert unchecked[0].message.startswith("--rotary-percent: passed on")
    assert _rules([*argv, "--tensor-model-parallel-size", "two"], ENV) == {"argparse"}


def test_query_groups_may_be_a_multiple_or_a_divisor_of_tp(argv):
    gqa = [*argv, "--group-query-attention", "--num-query-groups", "4"]
    assert "query_groups_per_tp" not in _rules(gqa, ENV)  # 4 groups, tp 2
    shared = _set(gqa, "--tensor-model-parallel-size", "8")
    assert "query_groups_per_tp" not in _rules(shared, ENV, world=256)  # tp 8 shares groups
    assert "query_groups_per_tp" in _rules(_set(gqa, "--num-query-groups", "3"), ENV)


def test_flags_megatron_rewrites_or_refuses(argv):
    # --recompute-activations turns a full-recompute command selective, and Megatron-LM then
    # refuses the full recompute's method and layer count.
    full = [*argv, "--recompute-granularity", "full", "--recompute-method", "uniform",
            "--recompute-num-layers", "1"]
    assert _rules(full, ENV) == set()
    assert "recompute_selective" in _rules([*full, "--recompute-activations"], ENV)
    assert parse_argv([*argv, "--recompute-activations"]).recompute_granularity == "selective"
    # --no-position-embedding stops Megatron-LM unless the positions are rotary.
    assert "no_position_embedding" in _rules(
        [*_set(argv, "--position-embedding-type", "learned_absolute"),
         "--no-position-embedding"], ENV)
    assert "no_position_embedding" not in _rules([*argv, "--no-position-embedding"], ENV)


def test_transformer_engine_attention_switches_must_match_the_backend(argv):
    assert "--attention-backend" in argv and _set(argv, "--attention-backend", "flash") == argv
    assert _rules(argv, {**ENV, "NVTE_FLASH_ATTN": "1"}) == set()
    problems = validate_argv(argv, env={**ENV, "NVTE_FUSED_ATTN": "1", "NVTE_FLASH_ATTN": "0"},
                             world_size=64)
    assert [p.rule for p in problems] == ["attention_backend_env"]
    assert problems[0].message.startswith("NVTE_FLASH_ATTN=0, NVTE_FUSED_ATTN=1 in the "
                                          "environment conflict(s) with --attention-backend "
                                          "flash, which needs NVTE_FLASH_ATTN=1, "
                                          "NVTE_FUSED_ATTN=0, NVTE_UNFUSED_ATTN=0")
    assert "attention_backend_env" in _rules(_set(argv, "--attention-backend", "auto"),
                                             {**ENV, "NVTE_FUSED_ATTN": "0"})


def test_environment_names_are_checked_before_they_reach_a_script():
    with pytest.raises(LayoutSearchError, match=r"megatron.env: 'NCCL_DEBUG; touch x' is not"):
        MegatronSettings.from_dict({"env": {"NCCL_DEBUG; touch x": "INFO"}})
    assert MegatronSettings.from_dict({"env": {"NCCL_DEBUG": "INFO"}}).env == {
        "NCCL_DEBUG": "INFO"}


@pytest.mark.parametrize(("values", "message"), [
    # Each of these changed the command without a word, or failed with a traceback.
    ({"env": {"NCCL_IB_DISABLE": True}}, r"env.NCCL_IB_DISABLE=True: must be a string or a "
                                          r"number \(quote flags as '1' or '0'"),
    ({"env": {"NCCL_DEBUG": None}}, r"env.NCCL_DEBUG=None: must be a string or a number"),
    ({"env": ["NCCL_DEBUG=INFO"]}, r"env=\['NCCL_DEBUG=INFO'\]: must be a mapping"),
    ({"slurm": "gpu"}, r"slurm='gpu': must be a mapping"),
    ({"extra_args": "--manual-gc --seed 7"}, r"extra_args='--manual-gc --seed 7': must be a "
                                             r"list of words, one argument each"),
    ({"extra_args": {"--seed": 1}}, r"extra_args=\{'--seed': 1\}: must be a list of words"),
    ({"extra_args": 5}, r"extra_args=5: must be a list of words"),
    # One argument '--seed 1234' is a flag Megatron-LM does not know: every launch would fail.
    ({"extra_args": ["--seed 1234"]}, r"extra_args=\['--seed 1234'\]: must be a list of "
                                      r"words.*'--seed 1234' is several words in one: give "
                                      r"them apart, '--seed', '1234'"),
    ({"torchrun": ["torchrun", "--nnodes 2"]}, r"'--nnodes 2' is several words in one"),
    ({"torchrun": "torchrun --standalone"}, r"torchrun='torchrun --standalone': must be a list"),
    ({"grad_reduce_in_bf16": "false"}, r"grad_reduce_in_bf16='false': must be true, false or "
                                       "null"),
    ({"lr": -1.0e-4}, r"lr=-0.0001: must be a positive number"),
    ({"lr": "fast"}, r"lr='fast': must be a positive number"),
    ({"warmup_iters": "3"}, r"warmup_iters='3': must be an integer >= 0"),
    ({"megatron_path": None}, r"megatron_path=None: must be a non-empty string"),
    ({"python": 3.11}, r"python=3.11: must be a non-empty string"),
    ({"script": None}, r"script=None: must be a non-empty string"),
    # No port: torchrun's rendezvous could never bind, on every launch.
    ({"master_port": 70000}, r"master_port=70000: must be a TCP port, 1 \.\. 65535$"),
    ({"master_port": 0}, r"master_port=0: must be a TCP port, 1 \.\. 65535$"),
])
def test_megatron_settings_of_the_wrong_type_name_the_setting(values, message):
    with pytest.raises(LayoutSearchError, match=message):
        MegatronSettings.from_dict(values)


@pytest.mark.parametrize("name_or_path", [None, 5, ["megatron"]])
def test_settings_loaded_from_no_name_or_path_are_refused(name_or_path):
    # pathlib's TypeError ("expected str, bytes or os.PathLike object") before.
    with pytest.raises(LayoutSearchError, match=re.escape(
            f"megatron={name_or_path!r}: must be a name of the cost_models/ folder (e.g. "
            "'megatron'), the path of a YAML file of Megatron-LM settings, or a mapping")):
        MegatronSettings.load(name_or_path)


def test_megatron_settings_built_in_python_get_the_same_checks(tmp_path):
    with pytest.raises(LayoutSearchError, match=r"megatron.env.NCCL_IB_DISABLE=True: must be "
                                                r"a string or a number"):
        MegatronSettings(env={"NCCL_IB_DISABLE": True})
    with pytest.raises(LayoutSearchError, match=r"megatron.extra_args='--manual-gc --seed 7':"
                                                r" must be a list of words"):
        MegatronSettings().replace(extra_args="--manual-gc --seed 7")
    built = MegatronSettings(extra_args=["--seed", 1234], env={"NCCL_IB_TIMEOUT": 22})
    assert built.extra_args == ("--seed", "1234") and built.env == {"NCCL_IB_TIMEOUT": "22"}
    # A file's mistake names the file.
    path = tmp_path / "mine.yaml"
    path.write_text("lr: -1.0\n")
    with pytest.raises(LayoutSearchError, match=rf"{re.escape(str(path))}: megatron.lr=-1.0: "
                                                r"must be a positive number"):
        MegatronSettings.load(path)


def test_megatron_settings_take_words_and_numbers_as_written_in_yaml():
    settings = MegatronSettings.from_dict({"extra_args": ["--seed", 1234], "torchrun": "torchrun",
                                           "env": {"NCCL_IB_TIMEOUT": 22}})
    assert settings.extra_args == ("--seed", "1234") and settings.torchrun == ("torchrun",)
    assert settings.env == {"NCCL_IB_TIMEOUT": "22"}


@pytest.mark.parametrize(("text", "message"), [
    ("megatron_path: [1\n", r"bad.yaml' is not valid YAML"),
    ("- 1\n- 2\n", r"bad.yaml' must hold a mapping of settings \(name: value\), not a list"),
    ("hello\n", r"bad.yaml' must hold a mapping of settings \(name: value\), not a str"),
])
def test_a_broken_megatron_settings_file_is_named(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(LayoutSearchError, match=message):
        MegatronSettings.load(path)


def test_sequence_parallel_at_tp1_is_a_warning_not_an_error():
    command = build_command(study_layout(64, 1, 1), study_job("llama_13b", 2048, 64))
    problems = validate_argv([*command.argv, "--sequence-parallel"], env={}, world_size=64)
    assert [(p.rule, p.severity) for p in problems] == [("sequence_parallel_needs_tp", "warning")]
    assert "--sequence-parallel" not in build_command(
        study_layout(64, 1, 1, sequence_parallel=True), study_job("llama_13b", 2048, 64)).argv


@pytest.mark.parametrize(("seq", "tp", "why", "fix"), [
    (8192, 1, "seq_length/cp (8192) <= 4096", {"attention": "flash2"}),
    (128, 2, "micro_batch_size·heads/tp (20) divisible by 8", {"micro_batch_size": 2}),
])
def test_a_fused_layout_the_kernel_does_not_take_is_not_exact(seq, tp, why, fix):
    # Megatron-LM's FusedScaleMaskSoftmax runs PyTorch's softmax for such a shape: the
    # command would measure torch attention, and says so.
    job = study_job("llama_13b", seq, 64)
    asked = dict(attention="fused", rmsnorm_kernel=False)
    command = build_command(study_layout(64, tp, 1, **asked), job)
    assert not command.exact
    assert any(why in note and "torch attention" in note for note in command.notes)
    fixed = build_command(study_layout(64, tp, 1, **{**asked, **fix}), job)
    assert not any("torch attention" in note for note in fixed.notes)


def test_a_users_unreadable_file_beside_the_settings_is_passed_over(tmp_path):
    (tmp_path / "cost_models").mkdir()
    (tmp_path / "cost_models" / "wip.yaml").write_text("a: [\n")
    (tmp_path / "cost_models" / "number.yaml").write_text("5\n")
    with config_folders([tmp_path]):
        assert MegatronSettings.load("megatron") == MegatronSettings.load(
            config_dir("cost_models") / "megatron.yaml")
        with pytest.raises(LayoutSearchError, match="unknown Megatron-LM settings 'megatrn'; "
                                                    "did you mean 'megatron'"):
            MegatronSettings.load("megatrn")
        with pytest.raises(LayoutSearchError, match="unknown cost model 'anlytic'"):
            build_cost_model("anlytic")
        with pytest.raises(LayoutSearchError, match=r"wip.yaml' is not valid YAML"):
            MegatronSettings.load("wip")  # the one named is read, to say why


def test_the_gradient_reduce_in_the_command_is_the_one_the_ranking_priced():
    job = dict(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048, tp=1,
               pp=2, micro_batch_size=1, attention="flash2", recompute="none",
               rmsnorm_kernel=True)
    flags = {}
    for cost_model in ("analytic", "analytic_prior"):  # gradient_bytes 2 and 4
        best = layoutsearch.search(cost_model=cost_model, **job).iloc[0]
        flags[cost_model] = "--grad-reduce-in-bf16" in best["megatron_args"]
    assert flags == {"analytic": True, "analytic_prior": False}
    # Settings that fix it win.
    pinned = layoutsearch.search(cost_model="analytic_prior", megatron={
        "grad_reduce_in_bf16": True}, **job).iloc[0]
    assert "--grad-reduce-in-bf16" in pinned["megatron_args"]
