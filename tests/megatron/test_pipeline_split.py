"""Uneven pipeline stages: the split, its flags, Megatron-LM's rules for them, round trips."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from megatron_study import study_job, study_layout

from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.layout import Layout
from layoutsearch.megatron import (
    LocalLauncher,
    Trial,
    build_command,
    parse_argv,
    parse_log,
    validate_argv,
)
from layoutsearch.megatron.inverse import row_of_argv
from layoutsearch.megatron.validation import pipeline_stage_layers
from layoutsearch.pipeline import stage_layers, stage_split
from layoutsearch.specs import Job
from layoutsearch.testing import fake_megatron_settings

FIRST, LAST = "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"
EMBEDDING, LOSS = ("--account-for-embedding-in-pipeline-split",
                   "--account-for-loss-in-pipeline-split")
VSTAGE = "--num-layers-per-virtual-pipeline-stage"


def test_the_command_and_the_cost_model_split_layers_alike():
    # 7 layers on 5 stages: ceil(7/5)=2 in the middle leaves 1 layer for both ends, so the
    # middle gets 1 and the ends share 4 (2 and 2); the cost model prices that same split.
    base = study_job("llama_13b", 2048, 40)
    job = dataclasses.replace(base, model=base.model.replace(num_layers=7),
                              global_batch_size=64)
    command = build_command(study_layout(40, 1, 5), job)
    assert command.exact
    args = parse_argv(list(command.argv))
    assert pipeline_stage_layers(args) == [2, 1, 1, 1, 2]
    assert validate_argv(command.argv, env=command.env, world_size=40) == []
    first, middle, last = stage_split(np.array([7]), np.array([5]))
    assert (first[0], middle[0], last[0]) == (2, 1, 2)


@pytest.mark.parametrize("pp", [8, 16])
def test_llama_30b_on_8_and_16_stages_passes_megatron_validation(pp):
    job = study_job("llama_30b", 2048, 256)
    assert job.global_batch_size == 2048 and job.model.vocab_size == 128000
    layout = study_layout(256, 2, pp)
    command = build_command(layout, job)
    assert validate_argv(command.argv, env=command.env, world_size=256) == []
    assert command.exact
    args = parse_argv(command.argv)
    stages = stage_layers(60, pp)
    assert (args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers) == \
        (stages[0], stages[-1])
    assert pipeline_stage_layers(args) == stages
    assert max(stages) == -(-60 // pp)
    # argv -> layout -> argv
    row = row_of_argv(command.argv, env=command.env, world_size=256, gpu="a100_80gb")
    assert Layout.from_row(row) == layout
    assert build_command(Layout.from_row(row), job).argv == command.argv


def test_even_splits_and_interleaving_emit_no_split_flags():
    even = build_command(study_layout(256, 2, 4), study_job("llama_30b", 2048, 256))
    assert FIRST not in even.argv and LAST not in even.argv
    interleaved = build_command(study_layout(128, 4, 2, vp=2), study_job("llama_30b", 8192, 128))
    assert FIRST not in interleaved.argv


def _set(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


@pytest.fixture
def pp8() -> tuple[list[str], dict[str, str]]:
    command = build_command(study_layout(256, 2, 8), study_job("llama_30b", 2048, 256))
    return list(command.argv), dict(command.env)


def _problems(argv: list[str], env: dict[str, str]) -> dict[str, str]:
    return {p.rule: p.message for p in validate_argv(argv, env=env, world_size=256)}


def test_a_wrong_split_is_rejected_with_megatrons_message(pp8):
    argv, env = pp8
    # 60 - 5 - 6 = 49 layers cannot be split over the 6 middle stages.
    problems = _problems(_set(argv, FIRST, "5"), env)
    assert set(problems) == {"uneven_middle_layers"}
    assert problems["uneven_middle_layers"] == (
        "number of layers at middle stage: 49 must be divisible by the middle pipeline model "
        "parallel size 6")
    assert "uneven_stage_layers" in _problems(_set(argv, LAST, "0"), env)
    # 60 - 10 - 2 = 48 divides by 6, but gives 8 per middle stage: 10 + 6·8 + 2 = 60 holds.
    assert _problems(_set(_set(argv, FIRST, "10"), LAST, "2"), env) == {}
    # Without the flags, Megatron-LM asks for an even split.
    plain = [a for i, a in enumerate(argv)
             if a not in (FIRST, LAST) and argv[i - 1] not in (FIRST, LAST)]
    assert set(_problems(plain, env)) == {"layers_per_stage"}
    # Interleaving needs --num-virtual-stages-per-pipeline-rank with uneven stages.
    assert "uneven_with_vstage" in _problems(
        [*argv, "--num-layers-per-virtual-pipeline-stage", "2"], env)


def test_first_and_last_must_hold_all_layers_without_middle_stages(pp8):
    argv, env = pp8
    pp2 = _set(_set(_set(argv, "--pipeline-model-parallel-size", "2"), FIRST, "30"), LAST, "29")
    problems = _problems(pp2, env)
    assert set(problems) == {"uneven_layer_count"}
    assert "[30, 29]" in problems["uneven_layer_count"]
    assert _problems(_set(pp2, LAST, "30"), env) == {}


def test_full_recompute_needs_a_layer_count_of_at_least_one(pp8):
    argv, env = pp8
    full = [*argv, "--recompute-granularity", "full", "--recompute-method", "uniform",
            "--recompute-num-layers", "8"]
    assert _problems(full, env) == {}
    # More than a stage holds recomputes the whole stage as one chunk: Megatron runs it.
    assert _problems(_set(full, "--recompute-num-layers", "9"), env) == {}
    none = _problems(_set(full, "--recompute-num-layers", "0"), env)
    assert none == {"recompute_num_layers":
                    "--recompute-num-layers must be at least 1 (stages have up to 8)"}


def test_the_fake_megatron_runs_an_uneven_split(tmp_path):
    base = study_job("llama_13b", 2048, 8)
    job = dataclasses.replace(base, model=base.model.replace(num_layers=30),
                              global_batch_size=64)
    settings = fake_megatron_settings(tmp_path)
    command = build_command(study_layout(8, 1, 8), job, settings)
    assert parse_argv(command.argv).decoder_first_pipeline_num_layers == 3
    log = LocalLauncher(settings).run(Trial(name="pp8", command=command,
                                            log_path=tmp_path / "pp8.log"))
    result = parse_log(log.text, returncode=log.returncode)
    assert result.status == "ok", log.text[-2000:]


LLAMA3_405B = Job(model=load_model("llama3_405b"), cluster=load_cluster("h100_sxm"),
                  num_gpus=1024, seq_length=8192, global_batch_size=512)


def _llama3_405b(vp: int) -> Layout:
    return Layout(tp=8, pp=16, dp=8, vp=vp, micro_batch_size=1, sequence_parallel=True,
                  attention="flash3", rmsnorm_kernel=True, recompute="full")


@pytest.mark.parametrize(("vp", "per_chunk"), [(2, 4), (4, 2)])
def test_llama3_405b_interleaves_with_the_embedding_and_loss_counted(vp, per_chunk):
    # 126 + 2 = 128 slots on 16 stages: 8 per stage, in vp chunks of 128 / (16·vp); the first
    # and last stage build 7 transformer layers, as the cost model prices them.
    command = build_command(_llama3_405b(vp), LLAMA3_405B)
    assert command.exact
    assert validate_argv(command.argv, env=command.env, world_size=1024) == []
    argv = list(command.argv)
    assert EMBEDDING in argv and LOSS in argv and FIRST not in argv and LAST not in argv
    assert argv[argv.index(VSTAGE) + 1] == str(per_chunk)
    stages = pipeline_stage_layers(parse_argv(argv))
    assert stages == [7, *[8] * 14, 7] == stage_layers(126, 16, vp)
    # argv -> layout -> argv: vp is read back from the 128 slots, not the 126 layers.
    row = row_of_argv(argv, env=command.env, world_size=1024, gpu="h100_sxm",
                      flash_kernel="flash3")
    assert Layout.from_row(row) == _llama3_405b(vp)
    assert build_command(Layout.from_row(row), LLAMA3_405B).argv == command.argv


def test_an_evenly_divisible_interleaved_model_counts_nothing():
    # 40 layers in pp 4 × vp 2 chunks of 5: the command is the plain interleaved one.
    command = build_command(study_layout(64, 2, 4, vp=2), study_job("llama_13b", 2048, 64))
    argv = list(command.argv)
    parallel = argv[argv.index("--tensor-model-parallel-size"):argv.index("--micro-batch-size")]
    assert parallel == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                        "4", VSTAGE, "5"]


def _without(argv: list[str], flag: str) -> list[str]:
    return [word for word in argv if word != flag]


def test_megatrons_rules_for_the_embedding_and_loss_counted_as_layers():
    command = build_command(_llama3_405b(2), LLAMA3_405B)
    argv, env = list(command.argv), dict(command.env)

    def problems(words: list[str]) -> dict[str, str]:
        return {p.rule: p.message for p in validate_argv(words, env=env, world_size=1024)}

    # Only the loss counted: 127 slots do not split over 16 stages (validate_args), nor
    # 127 // 16 = 7 per stage into chunks of 4.
    loss_only = problems(_without(argv, EMBEDDING))
    assert set(loss_only) == {"layers_per_stage", "layers_per_vstage"}
    assert loss_only["layers_per_stage"] == (
        "--num-layers 126 + 1 (the embedding and/or the loss counted as layers) = 127 must "
        "divide by pp 16 (or split the stages with --decoder-first/last-pipeline-num-layers)")
    # 8 slots per stage do not make chunks of 3.
    assert problems(_set(argv, VSTAGE, "3")) == {"layers_per_vstage": (
        "layers per stage 8 (--num-layers 126 + 2 (the embedding and/or the loss counted as "
        "layers) = 128 over pp 16) must divide by --num-layers-per-virtual-pipeline-stage 3")}
    # Without interleaving, TransformerConfig refuses them beside an explicit first/last split.
    plain = _without(_without(argv, EMBEDDING), LOSS)
    plain = plain[:plain.index(VSTAGE)] + plain[plain.index(VSTAGE) + 2:]
    split = [*plain, FIRST, "7", LAST, "7"]
    assert problems(split) == {}
    assert set(problems([*split, EMBEDDING, LOSS])) == {"uneven_with_account_split"}
    assert set(problems(plain)) == {"layers_per_stage"}  # 126 over 16 needs one or the other
    assert problems([*plain, EMBEDDING, LOSS]) == {}  # [7, 8, ..., 8, 7] as well


def test_the_fake_megatron_runs_an_interleaved_split_with_the_embedding_and_loss_counted(
        tmp_path):
    # 30 layers on pp 4 × vp 2: 32 slots, chunks of 4, stages [7, 8, 8, 7].
    base = study_job("llama_13b", 2048, 8)
    job = dataclasses.replace(base, model=base.model.replace(num_layers=30),
                              global_batch_size=64)
    settings = fake_megatron_settings(tmp_path)
    command = build_command(study_layout(8, 1, 4, vp=2), job, settings)
    args = parse_argv(command.argv)
    assert args.account_for_embedding_in_pipeline_split and args.account_for_loss_in_pipeline_split
    assert pipeline_stage_layers(args) == [7, 8, 8, 7]
    log = LocalLauncher(settings).run(Trial(name="vp2", command=command,
                                            log_path=tmp_path / "vp2.log"))
    result = parse_log(log.text, returncode=log.returncode)
    assert result.status == "ok", log.text[-2000:]
