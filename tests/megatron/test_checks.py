"""The checks every command passes before it is launched, shown or written into a script."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import optuna
import pytest

import layoutsearch
from layoutsearch.api import resolve_cluster, resolve_model
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import Layout
from layoutsearch.megatron import MegatronSettings, build_command, write_launch_scripts
from layoutsearch.megatron.checks import SET_FROM, rejection
from layoutsearch.megatron.validation import argument_parser
from layoutsearch.results import COMMAND_REJECTED, job_of
from layoutsearch.specs import Job
from tests.checkouts import KNOWS_NO_FLAG, MICRO_BATCH_1_ONLY, write_checkout

JOB = dict(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048)


@pytest.mark.parametrize(("extra", "named"), [
    # argparse keeps the last of a repeated flag: micro-batch 2 would run, not 1.
    (["--micro-batch-size", "2"], "--micro-batch-size (from the layout's micro_batch_size)"),
    (["--tensor-model-parallel-size=8"], "--tensor-model-parallel-size (from the layout's tp)"),
    # validate_args turns it into selective recompute, whatever the layout asks.
    (["--seed", "7", "--recompute-activations"], "--recompute-activations (from the layout's "
                                                 "recompute)"),
    (["--fp16"], "--fp16 (from bf16 training, the precision priced)"),
    (["--train-iters", "50"], "--train-iters (from megatron.train_iters)"),
    # Flags of the same knobs under other names: vp by stages, a batch ramp, FP8.
    (["--num-virtual-stages-per-pipeline-rank", "2"], "--num-virtual-stages-per-pipeline-rank "
                                                      "(from the layout's vp)"),
    (["--rampup-batch-size", "32", "32", "1000"], "--rampup-batch-size (from "
                                                  "global_batch_size)"),
    (["--fp8-format", "hybrid"], "--fp8-format (from bf16 training, the precision priced)"),
    # A flag every command carries, with another value: the parser would see every 10th step.
    (["--log-interval", "10"], "--log-interval (from the log parser (a line every "
                               "iteration))"),
    (["--log-interval", "5", "--log-interval", "1", "--tokenizer-type", "GPT2BPETokenizer"],
     "--tokenizer-type (from the synthetic data commands measure on)"),
    # A layout flag at Megatron-LM's default is no repeat: the layout's own value is lost.
    (["--tensor-model-parallel-size", "1"], "--tensor-model-parallel-size (from the "
                                            "layout's tp)"),
    (["--bf16", "--attention-dropout", "0.1"], "--attention-dropout (from the priced model "
                                               "(no dropout))"),
])
def test_extra_args_that_set_what_each_command_sets_are_refused(extra, named):
    with pytest.raises(LayoutSearchError) as caught:
        MegatronSettings(extra_args=extra)
    message = str(caught.value)
    assert message.startswith(f"megatron.extra_args={extra}: every command sets {named} itself")
    assert "keeps the last of a repeated flag" in message
    with pytest.raises(LayoutSearchError, match="every command sets"):
        MegatronSettings().replace(extra_args=extra)  # built in Python, as from a file


@pytest.mark.parametrize(("env", "named"), [
    ({"NVTE_FLASH_ATTN": "0"}, "NVTE_FLASH_ATTN (from the layout's attention)"),
    ({"NVTE_MASKED_SOFTMAX_FUSION": "0"}, "NVTE_MASKED_SOFTMAX_FUSION (from the layout's "
                                          "attention (0 for torch))"),
    ({"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, "CUDA_DEVICE_MAX_CONNECTIONS (from the layout's tp "
                                           "and cp (1 where either is above 1))"),
])
def test_environment_that_overrides_a_layout_switch_is_refused(env, named):
    # The settings' env is exported after the layout's: with NVTE_FLASH_ATTN=0, every flash
    # layout's command would be refused by Megatron-LM, and the ranking would not say so.
    with pytest.raises(LayoutSearchError) as caught:
        MegatronSettings(env={"NCCL_IB_TIMEOUT": "22", **env})
    (name, value), = env.items()
    assert str(caught.value).startswith(f"megatron.env: {name}={value}: commands set "
                                        f"{named} themselves")
    remedy = ("where Megatron-LM asks for it" if name == "CUDA_DEVICE_MAX_CONNECTIONS"
              else "attention=[fused,torch]")
    assert remedy in str(caught.value)


def test_flags_and_environment_commands_leave_alone_are_kept():
    extra = ("--no-gradient-accumulation-fusion", "--seed", "7", "--data-path", "x")
    env = {"NCCL_IB_QPS_PER_CONNECTION": "4", "PYTHONPATH": "/opt/te"}
    settings = MegatronSettings(extra_args=extra, env=env)
    assert settings.extra_args == extra and settings.env == env


def test_repeating_what_every_command_carries_is_harmless():
    # A user's own launch line often has them; with the same values the run is the same.
    repeats = ("--bf16", "--mock-data", "--tokenizer-type", "NullTokenizer",
               "--log-interval=1", "--log-throughput")
    ranked = layoutsearch.search(megatron={"extra_args": list(repeats)}, **JOB)
    plain = layoutsearch.search(**JOB)
    assert ranked["fits"].sum() == plain["fits"].sum() > 0
    assert ranked.attrs["rejected_commands_note"] == ""
    assert ranked.loc[0, "megatron_args"] == (plain.loc[0, "megatron_args"] + " "
                                              + " ".join(repeats))


def _commands() -> list[list[str]]:
    """The argv of commands that between them emit every flag build_command knows."""
    job = Job(model=resolve_model("llama2_70b", rope_scaling_factor=8.0),
              cluster=resolve_cluster("h100_sxm"), num_gpus=96, seq_length=4096,
              global_batch_size=512)
    layouts = [
        Layout(tp=8, pp=4, dp=3, vp=2, micro_batch_size=1, sequence_parallel=True,
               attention="flash2", rmsnorm_kernel=True, recompute="full",
               distributed_optimizer=True, overlap_grad_reduce=True),
        Layout(tp=2, pp=3, dp=8, cp=2, micro_batch_size=2, attention="torch",
               recompute="selective"),
        Layout(tp=1, pp=1, dp=96, micro_batch_size=1, attention="torch", rmsnorm_kernel=False,
               recompute="mlp", overlap_grad_reduce=True),
    ]
    settings = MegatronSettings(grad_reduce_in_bf16=True)
    commands = [build_command(layout, job, settings) for layout in layouts]
    # 78 layers split into pp 4 × vp 2 chunks only with the embedding and the loss counted.
    short = dataclasses.replace(job, model=job.model.replace(num_layers=78))
    commands.append(build_command(layouts[0], short, settings))
    return [list(command.argv) for command in commands]


def test_every_flag_a_command_sets_is_one_extra_args_may_not_set():
    # So the list cannot fall behind build_command: a flag it emits that SET_FROM lacks
    # could be set again by a user's extra_args, and the last one given would run.
    actions = argument_parser()._option_string_actions
    emitted = {actions[word].dest for argv in _commands() for word in argv
               if word.startswith("--")}
    assert emitted - set(SET_FROM) == set()
    assert {"tensor_model_parallel_size", "decoder_first_pipeline_num_layers",
            "context_parallel_size", "num_layers_per_virtual_pipeline_stage",
            "use_rope_scaling", "masked_softmax_fusion", "grad_reduce_in_bf16",
            "account_for_embedding_in_pipeline_split"} <= emitted


def test_a_search_with_extra_args_megatron_rejects_stops_before_searching():
    # --data-path with the --mock-data every command carries: every command is refused, so
    # no megatron_args cell of the ranking would start.
    with pytest.raises(LayoutSearchError,
                       match=r"^with the Megatron-LM settings' extra_args \['--data-path', 'x'\]"
                             r", Megatron-LM would reject every command \(error: data_source: "
                             r"--mock-data and --data-path exclude each other\).*nothing was "
                             r"searched$"):
        layoutsearch.search(megatron={"extra_args": ["--data-path", "x"]}, **JOB)


def test_a_flag_that_breaks_some_layouts_is_not_said_to_break_every_command(tmp_path: Path):
    # Without p2p overlap, interleaving needs pp > 2: the pp 2 commands fail, the pp 4 ones
    # start. The search runs and ranks the pp 2 layouts after those that fit, with why; a
    # script of a pp 2 layout is refused with its own reason.
    settings = {"extra_args": ["--no-overlap-p2p-communication"]}
    ranked = layoutsearch.search(search_space="default", pp=[2, 4], vp=[2], megatron=settings,
                                 **JOB)
    assert set(ranked.loc[ranked["fits"], "pp"]) == {4}
    rejected = ranked[ranked["reason"].str.startswith(COMMAND_REJECTED)]
    assert set(rejected["pp"]) == {2} and not rejected["fits"].any()
    assert (rejected["reason"] == COMMAND_REJECTED + "interleaving_pp: interleaved schedule "
                                                     "needs pp > 2, got 2").all()
    assert ranked.index[ranked["fits"]].max() < rejected.index.min()
    pp2 = rejected.head(1).assign(fits=True)
    with pytest.raises(LayoutSearchError,
                       match=r"^no launch scripts written: Megatron-LM would reject the "
                             r"command of rank 1 \(.*\): error: interleaving_pp"):
        write_launch_scripts(pp2, job_of(ranked, "test"), tmp_path / "out", settings=settings)
    pp4 = ranked[ranked["fits"]]
    assert len(write_launch_scripts(pp4, job_of(ranked, "test"), tmp_path / "out", top_k=2,
                                    settings=settings)) == 2


def test_every_command_the_ranking_shows_starts_with_the_extra_flags():
    settings = MegatronSettings(extra_args=("--no-overlap-p2p-communication",))
    ranked = layoutsearch.search(search_space="default", tp=[1, 2], pp=[2, 4], vp=[1, 2],
                                 megatron=settings, **JOB)
    job = job_of(ranked, "test")
    shown = ranked[ranked["megatron_args"] != ""]
    assert len(shown) == min(int(ranked["fits"].sum()), layoutsearch.api.MEGATRON_ARGS_ROWS)
    assert len(shown) > 100
    for _, row in shown.iterrows():
        command = build_command(Layout.from_row(row), job, settings)
        assert rejection(command, command.env) is None, Layout.from_row(row)
    # Interleaving at pp 2 is what the flag breaks; without interleaving pp 2 still runs.
    assert ranked.loc[ranked["fits"] & ranked["pp"].eq(2), "vp"].eq(1).all()
    assert ranked.loc[ranked["fits"], "pp"].eq(2).any()
    note = ranked.attrs["rejected_commands_note"]
    rejected = int(ranked["reason"].str.startswith(COMMAND_REJECTED).sum())
    assert note.startswith(f"{rejected} "
                           "layouts the cost model found to fit rank after every layout "
                           "that fits, as Megatron-LM would reject their command with "
                           "megatron.extra_args: interleaving_pp: interleaved schedule "
                           "needs pp > 2, got 2")
    assert " points below the best that fits" in note
    assert layoutsearch.search(search_space="default", tp=[1, 2], pp=[2, 4], vp=[1, 2],
                               **JOB).attrs["rejected_commands_note"] == ""


def test_a_sampler_learns_which_layouts_the_extra_flags_make_unlaunchable(tmp_path: Path):
    # The check is part of pricing a layout, so an optuna trial of a pp 2 interleaved layout
    # is stored as not fitting, with why, and the sampler steers away from it.
    storage = f"sqlite:///{tmp_path}/study.db"
    ranked = layoutsearch.search(
        search_space="default", tp=[1, 2], pp=[2, 4], vp=[2], megatron={
            "extra_args": ["--no-overlap-p2p-communication"]},
        driver={"name": "optuna", "n_trials": 12, "seed": 0, "storage": storage,
                "study_name": "flags", "progress": False}, **JOB)
    trials = optuna.load_study(study_name="flags", storage=storage).get_trials()
    pp2 = [t for t in trials if t.user_attrs.get("reason", "").startswith(COMMAND_REJECTED)]
    assert pp2 and all(t.constraints == {"fits": 1.0} for t in pp2)
    assert set(ranked.loc[ranked["reason"].str.startswith(COMMAND_REJECTED), "pp"]) == {2}
    assert set(ranked.loc[ranked["fits"], "pp"]) == {4}


def test_a_study_resumed_with_extra_flags_checks_the_prices_it_stored_without_them(
        tmp_path: Path):
    space = dict(search_space="default", tp=[1, 2], pp=[2, 4], vp=[2])
    driver = {"name": "optuna", "n_trials": 10, "seed": 0, "progress": False,
              "storage": f"sqlite:///{tmp_path}/study.db", "study_name": "resumed"}
    first = layoutsearch.search(**space, driver=driver, **JOB)
    assert set(first.loc[first["fits"], "pp"]) == {2, 4}
    again = layoutsearch.search(**space, driver=driver, megatron={
        "extra_args": ["--no-overlap-p2p-communication"]}, **JOB)
    assert len(again) == len(first)  # nothing priced anew: the budget was spent
    assert set(again.loc[again["fits"], "pp"]) == {4}
    rejected = again["reason"].str.startswith(COMMAND_REJECTED)
    assert set(again.loc[rejected, "pp"]) == {2}
    assert rejected.sum() == (first["fits"] & first["pp"].eq(2)).sum()


def test_when_the_extra_flags_reject_every_fitting_layout_the_message_says_so():
    settings = {"extra_args": ["--no-overlap-p2p-communication"]}
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        ranked = layoutsearch.search(search_space="default", pp=[2], vp=[2],
                                     megatron=settings, **JOB)
    assert not ranked["fits"].any()
    rejected = int(ranked["reason"].str.startswith(COMMAND_REJECTED).sum())
    assert rejected > 0
    assert ranked.attrs["message"] == (
        f"no layout can be launched: the {rejected} layouts the cost model found to fit all "
        "have commands Megatron-LM would reject with the settings' extra flags: "
        "interleaving_pp: interleaved schedule needs pp > 2, got 2 (rejects "
        f"{rejected} of {len(ranked)} layouts); change megatron.extra_args, or the search space")


def test_launch_scripts_are_written_only_when_their_commands_start(tmp_path: Path):
    ranked = layoutsearch.search(**JOB)
    job = job_of(ranked, "test")
    with pytest.raises(LayoutSearchError,
                       match=r"^no launch scripts written: with the Megatron-LM settings' "
                             r"extra_args \['--data-path', 'x'\], Megatron-LM would reject "
                             r"every command"):
        write_launch_scripts(ranked, job, tmp_path / "out", top_k=3,
                             settings={"extra_args": ["--data-path", "x"]})
    assert not (tmp_path / "out").exists()
    # A frame whose row breaks Megatron-LM's rules (40 heads over tp 16) is named by rank.
    broken = ranked.head(1).assign(tp=16, pp=1, dp=4)
    with pytest.raises(LayoutSearchError,
                       match=r"^no launch scripts written: Megatron-LM would reject the "
                             r"command of rank 1 \(tp16 .*\): error: heads_per_tp"):
        write_launch_scripts(broken, job, tmp_path / "out", top_k=3)
    assert not (tmp_path / "out").exists()
    paths = write_launch_scripts(ranked, job, tmp_path / "out", top_k=3)
    assert len(paths) == 3



def test_launch_scripts_are_checked_by_the_checkouts_own_validate_args(tmp_path, capsys):
    ranked = layoutsearch.search(**JOB)
    job = job_of(ranked, "test")
    folder = write_checkout(tmp_path / "Megatron-LM", MICRO_BATCH_1_ONLY)
    settings = {"megatron_path": str(folder), "python": sys.executable}
    mb1 = ranked[ranked["micro_batch_size"] == 1]
    assert len(write_launch_scripts(mb1, job, tmp_path / "out", top_k=3,
                                    settings=settings)) == 3
    assert capsys.readouterr().err == (
        f"Megatron-LM in {folder} ({folder}/megatron/training/arguments.py): its parse_args and "
        "validate_args pass the 3 commands\n")
    mb2 = ranked[ranked["micro_batch_size"] == 2].head(1)
    with pytest.raises(LayoutSearchError, match=(
            rf"^no launch scripts written: Megatron-LM in {folder} rejects the command of rank "
            r"1 \(tp\d pp\d dp\d+ mb2 .*\), which layoutsearch's copy of its rules passes: "
            r"validate_args: AssertionError: this checkout trains micro-batch 1 only, got 2 "
            r"\(.*/megatron/training/arguments.py:\d+\); leave such layouts out \(pin a "
            r"knob\), or set validate_args: false in the Megatron-LM settings to write the "
            r"scripts anyway$")):
        write_launch_scripts(mb2, job, tmp_path / "out2", top_k=3, settings=settings)
    assert not (tmp_path / "out2").exists()


def test_launch_scripts_for_a_checkout_that_does_not_take_the_flags_say_it_is_its_version(
        tmp_path):
    ranked = layoutsearch.search(**JOB)
    folder = write_checkout(tmp_path / "Megatron-LM", KNOWS_NO_FLAG)
    settings = {"megatron_path": str(folder), "python": sys.executable}
    with pytest.raises(LayoutSearchError, match=(
            rf"^no launch scripts written: Megatron-LM in {folder} rejects the command of rank "
            r"1 \(.*\), which layoutsearch's copy of its rules passes: parse_args: "
            r"pretrain_gpt.py: error: unrecognized arguments: --num-layers 40 .*; it does not "
            r"take the flags layoutsearch writes, those of Megatron-LM main \(2025-2026\): use "
            r"such a checkout, or set validate_args: false in the Megatron-LM settings to "
            r"write the scripts anyway$")):
        write_launch_scripts(ranked, job_of(ranked, "test"), tmp_path / "out", top_k=3,
                             settings=settings)
