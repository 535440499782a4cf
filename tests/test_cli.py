"""The `layoutsearch` command: outputs, overrides, multirun, user mistakes (exit 2) and jobs
that nothing fits (exit 3).

Most tests run the command's entry point in this process (the `run_layoutsearch` fixture,
tests/commands.py); the first, and those that press Ctrl-C, run it as a process of its own,
as a user does. The space is pinned to tp in {1, 2} to keep each run well under a second.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from layoutsearch import search
from layoutsearch.cli import (
    GROUP_DIRS,
    MultirunSummary,
    check_group_choices,
    check_output_dirs,
    group_options,
    report,
    run,
    settable_spec_fields,
)
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import LAYOUT_COLUMNS
from layoutsearch.paths import config_dir
from layoutsearch.reporting.sweep import SWEEPS_UNDER_WAY, mark_sweep_end
from layoutsearch.results import RESULT_COLUMNS, TOP_K
from layoutsearch.space import SearchSpace
from tests.commands import Command

FAST = "search_spaces.tp=[1,2]"


def in_a_process(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`layoutsearch *args` run from `cwd` as a process of its own, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "layoutsearch.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )


def shell_words(out: str, header: str) -> list[str]:
    """The words of the command the output prints below `header`: its indented lines, which
    bash must read as one command line (`bash -n`), their backslash-newlines joined as bash
    joins them, split as a shell splits words (`&&` stays a word)."""
    block = out.split(header, 1)[1].split("\n\n", 1)[0]
    lines = "\n".join(line for line in block.splitlines() if line.startswith("  "))
    subprocess.run(["bash", "-n", "-c", lines], check=True)
    return shlex.split(lines.replace("\\\n", ""))


def test_run_writes_the_same_ranking_as_the_python_api(tmp_path: Path) -> None:
    done = in_a_process(
        "model=llama_13b", "model.vocab_size=128000", "num_gpus=64", FAST, "top_k=3",
        f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    ranked = pd.read_csv(tmp_path / "run" / "ranked.csv")
    expected = search(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048,
                      vocab_size=128000, tp=[1, 2])
    assert set(RESULT_COLUMNS) <= set(ranked.columns)
    assert any(c.startswith("time_") for c in ranked.columns)
    assert any(c.startswith("memory_") for c in ranked.columns)
    assert len(ranked) == len(expected)
    assert set(ranked["tp"]) == {1, 2}
    assert (ranked["vocab_size"] == 128000).all()
    for column in ("mfu", "step_time_s", "peak_memory_gib"):
        assert np.allclose(ranked[column], expected[column], equal_nan=True)
    # The report: the job, exactly top_k ranking rows, both breakdowns of the best layout.
    out = done.stdout
    assert "job: llama_13b (14.0B parameters, vocab 128,000) on 64 x a100_80gb" in out
    ranking = out.split("top 3:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(ranking) == 1 + 3  # header and three rows
    assert all(column in ranking[0] for column in LAYOUT_COLUMNS)
    assert "best layout, time (step_time_s" in out and "best layout, memory" in out
    assert "gemm" in out and "weights" in out
    assert expected.attrs["close_call_note"]  # runners-up within 5 % of the best
    assert f"note: {expected.attrs['close_call_note']}" in out
    # Eight nodes: the best layout's pretrain_gpt.py arguments, as ranked.csv has them.
    assert ("best layout's command (pretrain_gpt.py arguments; emit=megatron writes the sbatch "
            "script that runs them on 8 nodes, with NVTE_FLASH_ATTN=1") in " ".join(out.split())
    best_args = pd.read_csv(tmp_path / "run" / "ranked.csv",
                            keep_default_na=False).loc[0, "megatron_args"]
    assert shell_words(out, "best layout's command") == shlex.split(best_args)
    assert out.index("best layout, memory") < out.index("best layout's command")
    # report.md's table holds the same top_k rows.
    report_md = (tmp_path / "run" / "report.md").read_text()
    assert "## Top 3 layouts" in report_md and "\n| 4 |" not in report_md


def test_a_one_node_jobs_best_command_is_its_torchrun_line(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    run_dir = tmp_path / "run"
    done = run_layoutsearch("num_gpus=8", "global_batch_size=64", "search_spaces.tp=[2]",
                            "search_spaces.pp=[1,2]", "emit=megatron", "top_k=1",
                            f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    header = "best layout's launch command (one node; emit=megatron writes it as a script):"
    assert header in done.stdout
    # As pasted into bash: into the checkout as the script goes, the environment (tp 2 needs
    # CUDA_DEVICE_MAX_CONNECTIONS=1), then the torchrun line of the script emit=megatron
    # wrote, whose arguments are ranked.csv's.
    words = shell_words(done.stdout, header)
    checkout = str(tmp_path / "Megatron-LM")
    assert words[:3] == ["cd", checkout, "&&"]
    argv = words[3:]
    (script,) = (run_dir / "megatron").glob("*.sh")
    lines = script.read_text().strip().splitlines()
    assert f"cd {checkout} || exit 1" in lines
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in lines
    exports = [shlex.split(line)[1] for line in lines if line.startswith("export ")]
    assert argv[:len(exports)] == exports
    assert argv[len(exports):] == shlex.split(lines[-1])
    pretrain = argv.index(str(tmp_path / "Megatron-LM" / "pretrain_gpt.py"))
    best_args = pd.read_csv(run_dir / "ranked.csv", keep_default_na=False).loc[0, "megatron_args"]
    assert argv[pretrain + 1:] == shlex.split(best_args)


def test_multirun_runs_every_job_and_model_overrides_change_the_result(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch(
        "--multirun", "model.vocab_size=32000,128000", FAST,
        f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    small, large = (pd.read_csv(tmp_path / "sweep" / job / "ranked.csv") for job in ("0", "1"))
    assert sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/ranked.csv")) == ["0", "1"]
    assert set(small["vocab_size"]) == {32000} and set(large["vocab_size"]) == {128000}
    # The same layouts with a 4x vocabulary need more memory (embedding, logits).
    keys = ["tp", "pp", "micro_batch_size", "sequence_parallel", "attention",
            "rmsnorm_kernel", "recompute"]
    both = small.merge(large, on=keys, suffixes=("_small", "_large")).dropna(
        subset=["peak_memory_gib_small", "peak_memory_gib_large"]
    )
    assert len(both) > 0
    assert (both["peak_memory_gib_large"] > both["peak_memory_gib_small"]).all()


def test_a_wrong_job_of_a_sweep_does_not_stop_the_others(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    sweep = tmp_path / "sweep"
    done = run_layoutsearch("--multirun", "model=llama_7b,llama_13b", "num_gpus=12,64", FAST,
                            f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    # Every job ran; the exit status still says that some input was wrong.
    assert done.returncode == 2
    assert "2 of 4 jobs failed" in done.stderr and "Traceback" not in done.stderr
    table = pd.read_csv(sweep / "multirun.csv")
    assert list(table["overrides"]) == [
        f"model={m} num_gpus={n} {FAST}" for m in ("llama_7b", "llama_13b") for n in (12, 64)]
    failed = table["error"].notna()
    assert list(failed) == [True, False, True, False]
    assert table.loc[failed, "error"].str.contains("num_gpus=12: must be a whole number").all()
    assert list(table.loc[~failed, "model"]) == ["llama_7b", "llama_13b"]
    assert table.loc[~failed, "mfu"].gt(0).all()


def test_a_sweep_rerun_into_its_folder_summarizes_only_its_own_jobs(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    sweep = tmp_path / "sweep"
    first = run_layoutsearch("--multirun", "num_gpus=64,128", FAST, f"hydra.sweep.dir={sweep}",
                             cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    # The rerun has one job, and a setting that cannot be resolved: it is that job's error,
    # not the end of the sweep, and job 1 of the first sweep is no part of this one.
    again = run_layoutsearch("--multirun", "num_gpus=${nope}", FAST, f"hydra.sweep.dir={sweep}",
                             cwd=tmp_path)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert "1 of 1 job failed" in again.stderr
    table = pd.read_csv(sweep / "multirun.csv")
    assert list(table["job"]) == [0]
    assert table.loc[0, "error"].startswith(
        "num_gpus: cannot resolve its value (Interpolation key 'nope' not found)")
    summary = (sweep / "multirun.md").read_text()
    assert "# Sweep summary: 1 job\n" in summary
    assert "Left out: the outputs of 1 job of an earlier sweep" in summary
    assert (sweep / "1" / "ranked.csv").is_file()  # the earlier job's outputs are kept


def test_a_setting_that_cannot_be_resolved_exits_2_naming_it(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch("global_batch_size=${seq_lenght}", FAST, f"hydra.run.dir={tmp_path}",
                            cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "global_batch_size: cannot resolve its value" in done.stderr
    assert "'seq_lenght' not found" in done.stderr


def test_unknown_model_exits_2_naming_the_closest_match(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch("model=llama13b", cwd=tmp_path)
    assert done.returncode == 2
    assert "did you mean 'llama_13b'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "outputs").exists()


def test_bad_job_size_exits_2_with_the_rule(tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch("num_gpus=63", FAST, f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 2
    # Named by the key typed: job.num_gpus=63 is no key of the command.
    assert "layoutsearch: error: num_gpus=63: must be a whole number of nodes" in done.stderr
    assert "Traceback" not in done.stderr


def test_wrong_megatron_settings_fail_before_the_search(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch("megatron=megatrom", FAST, f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "unknown Megatron-LM settings 'megatrom'; did you mean 'megatron'?" in done.stderr
    assert not (tmp_path / "ranked.csv").exists()


def test_help_lists_exactly_the_config_groups(tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch("--help", cwd=tmp_path)
    groups = done.stdout.split("== Configuration groups ==", 1)[1].split("==", 1)[0]
    listed = {line.split(":")[0] for line in groups.splitlines()[2:] if ":" in line}
    assert listed == set(GROUP_DIRS)
    assert "llama_13b" in groups and "a100_80gb" in groups and "paper" in groups
    # cost_models/ also holds the Megatron-LM settings, which the list cannot tell apart.
    assert done.stdout.startswith("layoutsearch: rank the parallelization layouts")
    assert "cost_models/megatron is the Megatron-LM settings" in done.stdout


@pytest.mark.parametrize(("override", "message"), [
    ("num_gpu=64", "unknown setting 'num_gpu'; did you mean 'num_gpus'?"),
    ("model.vocab=1", "unknown model field 'vocab'; did you mean 'vocab_size'?"),
    ("cluster.gpu.memory=1", "unknown cluster.gpu field 'memory'; did you mean 'memory_gib'?"),
    ("search_spaces.dp=[1]", "dp follows from num_gpus / (tp·pp·cp)"),
    # Added at the top, a misspelt setting would be read by nothing: 64 GPUs, not 32.
    ("+num_gpu=32", "unknown setting 'num_gpu'; did you mean 'num_gpus'?"),
    ("++seq_len=4096", "unknown setting 'seq_len'; did you mean 'seq_length'?"),
    # Below no setting: Hydra's hint, +job.num_gpus=8, would be read by nothing.
    ("job.num_gpus=8", "job.num_gpus: unknown setting 'job';"),
    ("+job.num_gpus=8", "valid setting names: cluster, cost_models, driver, emit, "),
    ("job.num_gpus=8", "; num_gpus is a setting of its own: num_gpus=..."),
    # Below a setting of one value, or a field no spec has: Hydra would stop with status 1
    # ('Key ... is not in struct') or, below search_spaces.tp, a traceback from omegaconf.
    ("megatron.log_dir=.", "megatron.log_dir: megatron holds one value, not settings of its "
                           "own (the name or YAML path of Megatron-LM settings, or a mapping "
                           "of them: 'megatron={log_dir:...}' sets log_dir and leaves the "
                           "other fields at their defaults; to keep a file's, set it in a "
                           "copy of that file); set megatron=..."),
    ("num_gpus.x=1", "num_gpus.x: num_gpus holds one value, not settings of its own; "
                     "set num_gpus=..."),
    ("search_spaces.tp.x=1", "search_spaces.tp.x: search_spaces.tp holds one value, not "
                             "settings of its own; set search_spaces.tp=..."),
    ("model.foo.bar=1", "model.foo.bar: unknown model field 'foo'"),
    ("+cluster.gpu.peak.x=1", "cluster.gpu.peak.x: unknown cluster.gpu field 'peak'; did you "
                              "mean 'peak_tflops'?"),
])
def test_unknown_settings_name_the_closest_valid_one(override: str, message: str) -> None:
    with pytest.raises(LayoutSearchError, match=re.escape(message)):
        check_group_choices([override])


def test_a_field_below_the_name_of_megatron_settings_says_how_to_set_it() -> None:
    # Hydra would stop with "Key 'validate_args' is not in struct".
    with pytest.raises(LayoutSearchError, match=re.escape(
            "cost_models.megatron.validate_args: cost_models.megatron holds one value "
            "(cost_models=measured sets 'megatron'), not settings of its own (the name or YAML "
            "path of Megatron-LM settings, or a mapping of them: "
            "'cost_models.megatron={validate_args:...}' sets validate_args")):
        check_group_choices(["cost_models=measured", "cost_models.megatron.validate_args=false"])


def test_known_and_added_settings_pass_the_check() -> None:
    check_group_choices(["num_gpus=128", "model.vocab_size=32000", "cluster.gpu.memory_gib=94",
                         "search_spaces.tp=[1,2]", "hydra.job.chdir=false", "top_k=3",
                         "cost_models=measured", "cost_models.top_k=8",
                         "cost_models.megatron={log_dir:.}"])


def test_hydra_config_groups_are_left_to_hydra(tmp_path: Path, run_layoutsearch: Command) -> None:
    # Hydra's own groups (logging, launcher, sweeper) are chosen as `hydra/<group>=...`.
    check_group_choices(["hydra/job_logging=disabled", "hydra/hydra_logging=disabled",
                         "hydra/launcher=basic"])
    optuna_log = logging.getLogger("optuna")  # the optuna driver's warnings
    done = run_layoutsearch("hydra/job_logging=disabled", FAST, f"hydra.run.dir={tmp_path}",
                            cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ranked.csv").is_file()
    assert not (tmp_path / "layoutsearch.log").exists()  # Hydra's job log, now off
    # Turning the job log off disables the loggers there were: a process of its own ends
    # with them, the test process must not run later commands without optuna's.
    assert not optuna_log.disabled


@pytest.mark.parametrize(("removed", "message"), [
    ("~model", "model: removed (~model) or never chosen, but every search needs one; choose "
               "one instead, e.g. model=<name>; options: gpt3_175b, "),
    ("~num_gpus", "num_gpus: removed (~num_gpus) or never set, but every search needs it; "
                  "set it instead, e.g. num_gpus=<number>"),
])
def test_a_removed_setting_every_search_needs_is_named(
        tmp_path: Path, run_layoutsearch: Command, removed: str, message: str) -> None:
    done = run_layoutsearch(removed, FAST, f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert message in done.stderr


def test_a_removed_cost_model_offers_cost_models_only(tmp_path: Path) -> None:
    with pytest.raises(LayoutSearchError) as caught:
        run({"model": {}, "cluster": {}, "search_spaces": {}, "driver": {}}, tmp_path)
    assert str(caught.value).endswith("options: analytic, analytic_prior, measured, replay")


def test_an_added_model_field_lists_the_valid_ones(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch("+model.vocab=1", FAST, f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "unknown model field 'vocab'; did you mean 'vocab_size'?" in done.stderr


def test_group_choices_are_checked_in_sweeps_too() -> None:
    with pytest.raises(LayoutSearchError, match="did you mean 'llama_65b'"):
        check_group_choices(["--multirun", "model=llama_13b,lama_65b"])
    with pytest.raises(LayoutSearchError, match="unknown cluster 'a100'"):
        check_group_choices(["cluster=a100"])
    check_group_choices(["-m", "model=llama_13b,llama_65b", "model.vocab_size=1000", "~driver"])


def test_an_unknown_cost_model_lists_cost_models_not_the_megatron_settings() -> None:
    with pytest.raises(LayoutSearchError, match=re.escape(
            "unknown cost_models 'analytc'; did you mean 'analytic'? valid cost_models names: "
            "analytic, analytic_prior, measured, replay")):
        check_group_choices(["cost_models=analytc"])
    # The settings file is still an option, so that choosing it says what it is for.
    check_group_choices(["cost_models=megatron"])


def test_override_syntax_and_a_sweep_without_multirun_are_user_errors() -> None:
    with pytest.raises(LayoutSearchError, match=r"search_spaces.tp=\[1,2: no viable "
                       r"alternative at input"):
        check_group_choices(["num_gpus=64", "search_spaces.tp=[1,2"])
    with pytest.raises(LayoutSearchError, match=r"model=llama2_7b,llama3_8b: a sweep over "
                       r"values needs --multirun \(-m\)"):
        check_group_choices(["model=llama2_7b,llama3_8b"])
    check_group_choices(["-m", "model=llama2_7b,llama3_8b"])
    check_group_choices(["hydra.mode=MULTIRUN", "model=llama2_7b,llama3_8b"])


def test_the_command_exits_2_on_override_syntax(tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch("search_spaces.tp=[1,2", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "search_spaces.tp=[1,2: no viable alternative" in done.stderr


def test_a_users_config_folder_adds_options_and_keeps_every_check(tmp_path: Path) -> None:
    folder = tmp_path / "my_configs"
    (folder / "cost_models").mkdir(parents=True)
    (folder / "cost_models" / "mine.yaml").write_text(
        "_target_: layoutsearch.costs.replay.ReplayCostModel\npath: runs.csv\n")
    for added in (["--config-dir", str(folder)], [f"hydra.searchpath=[file://{folder}]"]):
        check_group_choices([*added, "cost_models=mine", "cost_models.path=other.csv"])
        with pytest.raises(LayoutSearchError, match="did you mean 'num_gpus'"):
            check_group_choices([*added, "+num_gpu=128"])  # Hydra's hint, read by nothing
        with pytest.raises(LayoutSearchError, match="did you mean 'llama_13b'"):
            check_group_choices([*added, "model=llama13b"])
        with pytest.raises(LayoutSearchError, match="did you mean 'mine'"):
            check_group_choices([*added, "cost_models=mien"])
        with pytest.raises(LayoutSearchError, match="cost_models=mine has no setting 'top_k'"):
            check_group_choices([*added, "cost_models=mine", "cost_models.top_k=3"])
    # A search path it cannot list (no such package) leaves option names to Hydra;
    # settings are still checked.
    check_group_choices(["hydra.searchpath=[pkg://my_configs]", "model=my_model"])
    with pytest.raises(LayoutSearchError, match="did you mean 'num_gpus'"):
        check_group_choices(["hydra.searchpath=[pkg://my_configs]", "num_gpu=8"])


@pytest.mark.parametrize(("text", "rule"), [
    ("name: mine\ntp: [1, 2\npp: [1]\n", "expected ',' or ']'"),
    ("tp: [1, 2]\ntp: [4]\n", "found duplicate key tp"),
])
def test_a_chosen_option_that_is_not_valid_yaml_is_named_with_its_line(
        tmp_path: Path, run_layoutsearch: Command, text: str, rule: str) -> None:
    folder = tmp_path / "my_configs"
    (folder / "search_spaces").mkdir(parents=True)
    (folder / "search_spaces" / "mine.yaml").write_text(text)
    with pytest.raises(LayoutSearchError, match=rf"search_spaces=mine: '.*mine.yaml' is not "
                       rf"valid YAML: .*line \d.*{re.escape(rule)}"):
        check_group_choices(["--config-dir", str(folder), "search_spaces=mine"])
    check_group_choices(["--config-dir", str(folder), "search_spaces=paper"])  # not chosen
    done = run_layoutsearch("--config-dir", str(folder), "search_spaces=mine",
                            f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_a_driver_setting_under_another_driver_names_the_driver_that_has_it() -> None:
    with pytest.raises(LayoutSearchError, match=re.escape(
            "driver.n_trials: driver=grid has no setting 'n_trials'; it is a setting of "
            "driver=optuna (add driver=optuna)")):
        check_group_choices(["driver.n_trials=5"])
    with pytest.raises(LayoutSearchError, match="did you mean 'n_trials'"):
        check_group_choices(["driver=optuna", "driver.n_trial=5"])
    check_group_choices(["driver=optuna", "driver.n_trials=5"])


@pytest.mark.parametrize("drivers", ["optuna,grid", "grid,optuna"])
def test_a_setting_of_one_option_of_a_sweep_is_refused_before_any_job(drivers: str) -> None:
    # Hydra gives the setting to every job: the grid job would stop the sweep half-run.
    with pytest.raises(LayoutSearchError, match=re.escape(
            "driver.n_trials: the sweep's driver=grid has no setting 'n_trials' "
            "(driver=optuna has); a setting reaches every job of a --multirun, so sweep "
            "driver=grid in a command of its own")):
        check_group_choices(["-m", f"driver={drivers}", "driver.n_trials=5"])
    check_group_choices(["-m", "driver=optuna", "driver.n_trials=5,10"])
    # A misspelled option is named as such, before or after the setting.
    for argv in (["driver=optuna,optuan", "driver.n_trials=5"],
                 ["driver.n_trials=5", "driver=optuna,optuan"]):
        with pytest.raises(LayoutSearchError, match="unknown driver 'optuan'; did you mean "
                                                    "'optuna'"):
            check_group_choices(["-m", *argv])
    # A glob is expanded over the group's options, as Hydra expands it.
    check_group_choices(["-m", "driver=glob(opt*)", "driver.n_trials=5"])
    with pytest.raises(LayoutSearchError, match="the sweep's driver=grid has no setting"):
        check_group_choices(["-m", "driver=glob(*)", "driver.n_trials=5"])


@pytest.mark.parametrize(("sweep", "message"), [
    ("model=glob(lama2_*)", "model=glob(lama2_*): matches no model option, so no job would "
                            "run; options: gpt3_175b, "),
    ("num_gpus=range(8,8)", "num_gpus=range(8,8): the sweep has no values, so no job would run"),
])
def test_a_sweep_that_would_run_no_job_is_refused(
        sweep: str, message: str, tmp_path: Path, run_layoutsearch: Command) -> None:
    # Hydra launches no job and exits 0, as if the sweep had run.
    with pytest.raises(LayoutSearchError, match=re.escape(message)):
        check_group_choices(["-m", sweep])
    done = run_layoutsearch("-m", sweep, f"hydra.sweep.dir={tmp_path}", cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_a_mapping_set_on_a_group_is_no_sweep_that_matches_nothing(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    # Hydra merges `model={...}` into the default option's config: it chooses no option,
    # and a job runs.
    argv = ["model={num_layers:48,hidden_size:6400}", FAST, f"hydra.run.dir={tmp_path}"]
    check_group_choices(argv)
    done = run_layoutsearch(*argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--num-layers 48 --hidden-size 6400" in pd.read_csv(
        tmp_path / "ranked.csv")["megatron_args"].iloc[0]


def test_a_cost_model_setting_under_another_model_names_the_model_that_has_it() -> None:
    # Not the Megatron-LM settings file of cost_models/, which is not a cost model.
    with pytest.raises(LayoutSearchError, match=re.escape(
            "cost_models.top_k: cost_models=analytic has no setting 'top_k'; it is a setting "
            "of cost_models=measured (add cost_models=measured)")):
        check_group_choices(["cost_models.top_k=8"])
    check_group_choices(["cost_models=measured", "cost_models.top_k=8"])
    check_group_choices(["cost_models.gpus.a100_80gb.gemm_efficiency=0.7"])
    check_group_choices(["cost_models=replay", "cost_models.path=runs.csv"])


@pytest.mark.parametrize("override", ["model=null", "cluster=", "cost_models=null"])
def test_an_empty_group_choice_lists_the_options(override: str) -> None:
    group = override.split("=")[0]
    with pytest.raises(LayoutSearchError, match=rf"{group}=null: a {group} must be chosen; "
                                                r"options: "):
        check_group_choices([override])


def test_spec_fields_the_yaml_leaves_out_can_be_set(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    argv = ["-m", "model.position_embedding_type=rope", "model.num_layers=2", "top_k=1",
            "cluster.gpu.memory_gib=94", FAST]
    # Only the field the YAML leaves to the spec's default needs adding.
    assert settable_spec_fields(argv) == [
        "-m", "++model.position_embedding_type=rope", "model.num_layers=2", "top_k=1",
        "cluster.gpu.memory_gib=94", FAST]
    done = run_layoutsearch("model.add_bias_linear=true", FAST, f"hydra.run.dir={tmp_path}",
                            cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ranked.csv").is_file()


def test_a_setting_of_every_swept_option_is_set_though_the_default_option_lacks_it(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    # A multirun composes its own config from the default options (llama_13b, grid) with
    # the overrides that are no sweeps; struct mode would refuse the key there.
    folder = tmp_path / "conf"
    (folder / "driver").mkdir(parents=True)
    (folder / "driver" / "my_optuna.yaml").write_text(
        (GROUP_DIRS["driver"]() / "optuna.yaml").read_text().replace("sampler: tpe",
                                                                      "sampler: random"))
    argv = ["-m", "--config-dir", str(folder), "model=llama3_8b,llama3_70b",
            "model.rotary_base=1000000", "driver=optuna,my_optuna", "driver.n_trials=2",
            "num_gpus=64"]
    assert settable_spec_fields(argv) == [
        *argv[:4], "++model.rotary_base=1000000", "driver=optuna,my_optuna",
        "++driver.n_trials=2", "num_gpus=64"]
    # Without a sweep over the group, the options' own keys need no adding.
    plain = ["model=llama3_8b", "model.rotary_base=1000000", "driver=optuna",
             "driver.n_trials=2"]
    assert settable_spec_fields(plain) == plain
    done = run_layoutsearch(*argv, FAST, f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = pd.read_csv(tmp_path / "sweep" / "multirun.csv")
    assert list(summary["tried"]) == [2, 2, 2, 2]
    ranked = pd.read_csv(tmp_path / "sweep" / "3" / "ranked.csv")
    assert "--rotary-base 1000000" in ranked["megatron_args"].iloc[0]


def test_every_group_option_is_listed_by_name() -> None:
    assert "llama_13b" in group_options("model")
    assert "a100_80gb" in group_options("cluster")
    assert {"paper", "default"} <= set(group_options("search_spaces"))
    assert "analytic" in group_options("cost_models")
    assert "grid" in group_options("driver")


def test_the_command_line_prints_as_many_rows_as_a_report_shows() -> None:
    # One default for both: results.TOP_K, which the command's config repeats as top_k.
    with initialize_config_module(version_base="1.3", config_module="layoutsearch.conf"):
        cfg = compose("layoutsearch")
    assert cfg.top_k == TOP_K == 10


def test_nothing_fits_prints_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Composed in-process: the same config groups, found through the same plugins.
    with initialize_config_module(version_base="1.3", config_module="layoutsearch.conf"):
        cfg = compose("layoutsearch", overrides=["model=llama_65b", "num_gpus=8", FAST])
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    ranked = run({str(k): v for k, v in config.items()}, tmp_path)
    out = capsys.readouterr().out
    assert not ranked["fits"].any()
    assert ranked.attrs["message"] and ranked.attrs["message"] in out
    assert "best layout" not in out
    assert (tmp_path / "ranked.csv").is_file()


def test_nothing_fits_exits_3_so_a_launch_script_stops(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch("model=llama_65b", "num_gpus=8", FAST, "emit=megatron",
                            f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "no layout fits" in done.stdout and "Traceback" not in done.stderr
    assert (tmp_path / "run" / "ranked.csv").is_file()  # the outputs are still written
    assert "wrote no Megatron-LM launch scripts: no layout fits" in done.stdout
    assert not (tmp_path / "run" / "megatron").exists()


@pytest.mark.parametrize(("override", "message"), [
    ("emit=[megatron]", "emit=['megatron']: must be one name, one of megatron"),
    ("megatron=123", "megatron=123: must be a name of the cost_models/ folder"),
    ("cluster.gpu.name=b200", "cost model 'cost_models=analytic' has no constants for GPU "
                              "kind(s) b200"),
])
def test_a_wrong_setting_value_is_named_without_a_traceback(
        tmp_path: Path, run_layoutsearch: Command, override: str, message: str) -> None:
    done = run_layoutsearch(override, FAST, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("overrides", "message"), [
    # Hydra stopped with status 1: "Cannot merge DictConfig with ListConfig".
    (("search_spaces.tp={a:1}",), "search_spaces.tp={a:1}: search_spaces.tp holds a list in "
                                  "search_spaces=paper, not settings of its own; give a list"),
    (("cluster.gpu=[1]",), "cluster.gpu=[1]: cluster.gpu holds settings of its own in "
                           "cluster=a100_80gb (name, peak_tflops, memory_gib, "
                           "memory_bandwidth_gbps, compute_capability), not a list; set them "
                           "by name"),
    # A traceback: "'bool' object is not iterable".
    (("cost_models=measured", "cost_models.launcher=dry_run", "cost_models.retry=true"),
     "measured.retry=True: must be a list of the statuses to launch again"),
    # Python's words alone: "driver 'optuna': 'bool' object is not iterable".
    (("driver=optuna", "driver.objectives=false"),
     "driver.objectives=False: must be an objective or a list of them (e.g. [mfu])"),
    # Exit 3, every layout "not fitting" on a tp·pp·cp of 1.8e+19.
    (("search_spaces.tp=[1,9223372036854775808]",),
     "search space tp=9223372036854775808: must be a positive integer of at most 2**53"),
])
def test_a_setting_of_the_wrong_type_is_named_with_status_2(
        tmp_path: Path, run_layoutsearch: Command, overrides: tuple[str, ...], message: str,
) -> None:
    done = run_layoutsearch(FAST, *overrides, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"layoutsearch: error: {message}" in done.stderr and "Traceback" not in done.stderr


def test_a_sweep_with_a_job_that_fits_nowhere_exits_0(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch("--multirun", "model=llama_65b", "num_gpus=8,128", FAST,
                            f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "sweep" / "multirun.csv")
    assert sorted(table["feasible"] > 0) == [False, True]
    # The summary says why the 8-GPU job fits nowhere, as its own run would.
    summary = (tmp_path / "sweep" / "multirun.md").read_text()
    assert "no layout fits: the smallest per-GPU footprint is" in summary


def test_a_cost_model_without_breakdowns_says_so() -> None:
    # Replayed and measured rows carry the measured step time and memory, not their parts.
    ranked = search(model="llama_7b", num_gpus=8, seq_length=2048, global_batch_size=64,
                    search_space="paper")
    parts = [c for c in ranked.columns if c.startswith(("time_", "memory_"))]
    ranked[parts] = np.nan
    ranked["peak_memory_gib"] = np.nan
    text = report(ranked, SearchSpace.load("paper"), 3)
    step = ranked["step_time_s"].iloc[0]
    assert (f"best layout, time (step_time_s = {step:.3f}): this cost model gives no "
            "breakdown") in text
    assert ("best layout, memory (peak_memory_gib = not measured): this cost model gives no "
            "breakdown") in text
    assert "Empty DataFrame" not in text


def test_a_dry_run_exits_0_with_its_scripts(tmp_path: Path, run_layoutsearch: Command) -> None:
    done = run_layoutsearch("cost_models=measured", "cost_models.prescreen=analytic",
                            "cost_models.top_k=1", "cost_models.launcher=dry_run", FAST,
                            "emit=megatron", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "note: dry run: wrote 1 launch script and measured nothing (rows 0-0): " \
        in done.stdout
    assert "no layout fits" not in done.stdout
    assert "best layout" not in done.stdout  # nothing was measured: no command to launch
    assert len(list((tmp_path / "megatron_logs").glob("*.sh"))) == 1
    # emit=megatron ranks nothing a dry run did not measure: it points at the dry run's.
    assert (f"wrote no Megatron-LM launch scripts to {tmp_path / 'run' / 'megatron'}: the "
            "dry run measured no layout, so none is ranked; it wrote 1 launch script to "
            "megatron_logs\n") in done.stdout
    assert not (tmp_path / "run" / "megatron").exists()


def test_ctrl_c_stops_an_optuna_search_without_a_traceback_and_says_how_to_resume(
        tmp_path: Path) -> None:
    study = tmp_path / "study.db"
    search_run = subprocess.Popen(
        [sys.executable, "-m", "layoutsearch.cli", "driver=optuna", "driver.n_trials=100000",
         f"driver.storage=sqlite:///{study}", "search_spaces=default",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not study.exists() and time.monotonic() < deadline:  # the study is open
        time.sleep(0.2)
    time.sleep(1.0)
    search_run.send_signal(signal.SIGINT)
    _, stderr = search_run.communicate(timeout=60)
    assert search_run.returncode == 130 and "Traceback" not in stderr
    assert "keeps every finished trial, and the same command resumes the study" in stderr
    assert stderr.rstrip().endswith("layoutsearch: interrupted")


def test_ctrl_c_during_a_sweep_summarizes_the_jobs_that_finished(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep_run = subprocess.Popen(
        [sys.executable, "-m", "layoutsearch.cli", "--multirun", "driver=optuna",
         "driver.n_trials=3,100000", f"driver.storage=sqlite:///{tmp_path / 'study.db'}",
         "search_spaces=default", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (sweep / "1").is_dir() and time.monotonic() < deadline:  # job 0 is done
        time.sleep(0.2)
    time.sleep(2.0)
    sweep_run.send_signal(signal.SIGINT)
    stdout, stderr = sweep_run.communicate(timeout=60)
    assert sweep_run.returncode == 130 and "Traceback" not in stderr
    assert f"wrote {sweep / 'multirun.md'}" in stdout
    table = pd.read_csv(sweep / "multirun.csv")
    assert table["job"].astype(str).tolist() == ["0", "1"]
    assert bool(table.loc[0, "fits"]) and pd.isna(table.loc[0, "error"])
    assert table.loc[1, "error"].startswith("interrupted (Ctrl-C) before this job finished")


def test_a_sweep_job_interrupted_after_its_ranking_says_the_ranking_is_whole(
        tmp_path: Path, run_layoutsearch: Command, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("layoutsearch.cli.write_run_report", interrupt)
    sweep = tmp_path / "sweep"
    done = run_layoutsearch("--multirun", FAST, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert done.returncode == 130, done.stderr
    table = pd.read_csv(sweep / "multirun.csv")
    assert table.loc[0, "error"].startswith(
        "interrupted (Ctrl-C) after its ranking (ranked.csv, complete) was written")
    assert (sweep / "0" / "ranked.csv").is_file()
    assert not (sweep / "0" / "ranked.csv.partial").exists()


def test_a_ctrl_c_while_the_summary_is_written_leaves_it_to_be_written_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The end callback marks the sweep over only once its summary is written: main()'s
    # Ctrl-C handler then writes the summary the interrupt cut short.
    summary = MultirunSummary()
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    summary.on_multirun_start(config)

    def interrupted(sweep_dir: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("layoutsearch.cli._summarize", interrupted)
    with pytest.raises(KeyboardInterrupt):
        summary.on_multirun_end(config)
    assert [tmp_path / "sweep"] == SWEEPS_UNDER_WAY
    mark_sweep_end()


def test_relative_paths_mean_the_same_with_hydra_job_chdir(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    # hydra.job.chdir=true starts the job in its output folder: a settings file named from
    # where the command ran must still be found there.
    shipped = config_dir("cost_models") / "megatron.yaml"
    (tmp_path / "site_megatron.yaml").write_text(
        shipped.read_text().replace("extra_args: []", "extra_args: [--seed, '99']"))
    done = run_layoutsearch("megatron=site_megatron.yaml", "hydra.job.chdir=true", FAST,
                            f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ranked = pd.read_csv(tmp_path / "run" / "ranked.csv")
    assert ranked.loc[0, "megatron_args"].endswith("--seed 99")


def test_names_in_settings_are_found_in_the_users_config_folder(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    # Megatron-LM settings and a calibrated fit kept beside the user's own options.
    folder = tmp_path / "my_configs" / "cost_models"
    folder.mkdir(parents=True)
    shipped = config_dir("cost_models")
    (folder / "my_megatron.yaml").write_text(
        (shipped / "megatron.yaml").read_text() + "\nlog_dir: my_logs\n")
    (folder / "my_fit.yaml").write_text((shipped / "analytic.yaml").read_text())
    done = run_layoutsearch(
        "--config-dir", str(tmp_path / "my_configs"), "cost_models=measured",
        "cost_models.megatron=my_megatron", "cost_models.launcher=dry_run",
        "cost_models.prescreen=my_fit", "cost_models.top_k=1", "model=llama_7b",
        "num_gpus=8", "global_batch_size=64", FAST, f"hydra.run.dir={tmp_path / 'out'}",
        cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "my_logs").glob("*.sh"))) == 1  # my_megatron's log_dir
    # A file of the user's that is not YAML yet is passed over, as Hydra passes it over;
    # and a relative folder is found from where the command ran, whatever the job's cwd.
    (folder / "work_in_progress.yaml").write_text("a: [\n")
    done = run_layoutsearch(
        "hydra.job.chdir=true", "hydra.searchpath=[file://my_configs]",
        "megatron=my_megatron", "model=llama_7b", "num_gpus=8", "global_batch_size=64", FAST,
        f"hydra.run.dir={tmp_path / 'out3'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # Without the folder the names are unknown, and the message lists the shipped ones.
    done = run_layoutsearch("cost_models=measured", "cost_models.megatron=my_megatron",
                            f"hydra.run.dir={tmp_path / 'out2'}", cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown Megatron-LM settings 'my_megatron'" in done.stderr


# my_project.conf has no __init__.py (a namespace package), which Hydra's package source
# reports as "not available" while layoutsearch finds its options (cli/overrides.py).
@pytest.mark.filterwarnings("ignore:provider=hydra.searchpath:UserWarning")
def test_options_in_a_package_on_the_search_path_are_found(
        tmp_path: Path, run_layoutsearch: Command, monkeypatch: pytest.MonkeyPatch) -> None:
    # hydra.searchpath=[pkg://my_project.conf]: a project's options shipped in its package.
    site = tmp_path / "site"
    folder = site / "my_project" / "conf" / "cost_models"
    folder.mkdir(parents=True)
    (site / "my_project" / "__init__.py").write_text("")
    (folder / "my_megatron.yaml").write_text(
        (config_dir("cost_models") / "megatron.yaml").read_text() + "\nlog_dir: my_logs\n")
    (folder / "my_fit.yaml").write_text((config_dir("cost_models") / "analytic.yaml").read_text())
    monkeypatch.syspath_prepend(str(site))
    searchpath = "hydra.searchpath=[pkg://my_project.conf]"
    check_group_choices([searchpath, "cost_models=my_fit"])
    with pytest.raises(LayoutSearchError, match="did you mean 'my_fit'"):
        check_group_choices([searchpath, "cost_models=my_fi"])
    done = run_layoutsearch(
        searchpath, "cost_models=measured", "cost_models.megatron=my_megatron",
        "cost_models.launcher=dry_run", "cost_models.top_k=1", "cost_models.prescreen=my_fit",
        "model=llama_7b", "num_gpus=8", "global_batch_size=64", FAST,
        f"hydra.run.dir={tmp_path / 'out'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "my_logs").glob("*.sh"))) == 1  # my_megatron's log_dir


@pytest.mark.parametrize("setting", ["hydra.run.dir", "hydra.sweep.dir"])
def test_an_output_folder_that_is_a_file_is_refused(tmp_path: Path, setting: str) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("kept\n")
    with pytest.raises(LayoutSearchError, match=re.escape(
            f"{setting}={afile}: is a file; the outputs go into a folder")):
        check_output_dirs([f"{setting}={afile}"])
    check_output_dirs([f"{setting}={tmp_path / 'new'}", "hydra.run.dir=out/${now:%H}"])
    # A folder under a file cannot be made either (Hydra: NotADirectoryError).
    with pytest.raises(LayoutSearchError, match=re.escape(
            f"{setting}={afile}/run/1: lies under {afile}, a file; the outputs go into")):
        check_output_dirs([f"{setting}={afile}/run/1"])
    check_output_dirs([f"{setting}=relative/run"])  # under the folder the command runs in
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    with pytest.raises(LayoutSearchError, match=re.escape(
            f"{setting}={dangling}/run: {dangling} is a symbolic link to {tmp_path / 'gone'}, "
            "which does not exist")):
        check_output_dirs([f"{setting}={dangling}/run"])
    assert afile.read_text() == "kept\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_output_folder_in_a_folder_without_write_permission_is_refused(
        tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(LayoutSearchError, match=re.escape(
            f"hydra.run.dir={locked}/run: cannot make it: {locked} is not writable")):
        check_output_dirs([f"hydra.run.dir={locked}/run"])
