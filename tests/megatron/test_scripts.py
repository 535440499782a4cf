"""Launch scripts, the megatron_args column, and the launchers (fake Megatron-LM, fake Slurm)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from megatron_study import study_job, study_layout

import layoutsearch
from layoutsearch.errors import LayoutSearchError
from layoutsearch.layout import Layout
from layoutsearch.megatron import (
    DryRunLauncher,
    LocalLauncher,
    MegatronSettings,
    SlurmLauncher,
    Trial,
    build_command,
    parse_argv,
    parse_log,
    validate_argv,
    with_megatron_args,
    write_launch_scripts,
)
from layoutsearch.results import job_of
from layoutsearch.testing import fake_megatron_settings
from tests.fake_submitit import FakeExecutor, JobStillRunning, executor_of

HOSTILE = MegatronSettings(megatron_path="/opt/my megatron", extra_args=("--tensorboard-dir",
                           "/tmp/$(rm -rf ~)"), env={"NCCL_SOCKET_IFNAME": "eth0; reboot"})


def _last_command(path: Path) -> list[str]:
    return shlex.split(path.read_text().strip().splitlines()[-1])


def test_one_node_script_quotes_everything(tmp_path):
    command = build_command(Layout(tp=8, dp=1), study_job("llama_13b", 2048, 8), HOSTILE)
    path = tmp_path / "run.sh"
    from layoutsearch.megatron.scripts import write_script
    write_script(command, HOSTILE, path, label="tp8")
    text = path.read_text()
    assert "export NCCL_SOCKET_IFNAME='eth0; reboot'" in text
    assert "\ncd '/opt/my megatron' || exit 1\n" in text  # runs in the checkout, as local
    argv = _last_command(path)
    assert argv[argv.index("--nproc_per_node") + 1] == "8"
    assert "/opt/my megatron/pretrain_gpt.py" in argv
    assert argv[-1] == "/tmp/$(rm -rf ~)"  # one literal argument, never run


def test_one_node_with_slurm_settings_gets_an_sbatch_script(tmp_path):
    # Its partition, account and setup lines would be lost in a torchrun script.
    from layoutsearch.megatron.scripts import write_script
    settings = MegatronSettings(slurm={"slurm_partition": "gpu",
                                       "slurm_setup": ["module load cuda"]})
    command = build_command(Layout(tp=8, dp=1), study_job("llama_13b", 2048, 8), settings)
    text = write_script(command, settings, tmp_path / "run.sh").read_text()
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --nodes=1" in text
    assert "module load cuda" in text and "srun --ntasks-per-node=1" in text
    plain = write_script(command, MegatronSettings(), tmp_path / "plain.sh").read_text()
    assert "#SBATCH" not in plain
    launcher = write_script(command, MegatronSettings(launcher="slurm"),
                            tmp_path / "submitted.sh").read_text()
    assert "#SBATCH --nodes=1" in launcher


def test_multi_node_sbatch_script_uses_slurm_rendezvous(tmp_path):
    settings = MegatronSettings(slurm={"slurm_partition": "gpu"})
    command = build_command(study_layout(128, 2, 4), study_job("llama_65b", 2048, 128), settings)
    from layoutsearch.megatron.scripts import write_script
    text = write_script(command, settings, tmp_path / "job.sh").read_text()
    assert "#SBATCH --nodes=16" in text and "#SBATCH --gpus-per-node=8" in text
    assert "#SBATCH --partition=gpu" in text
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text
    srun = text.strip().splitlines()[-1]
    # One node's failure (an OOM on one pipeline stage) ends the others' ranks at once,
    # instead of leaving them in NCCL until its timeout, holding the nodes.
    assert srun.startswith("srun --ntasks-per-node=1 --kill-on-bad-exit=1 ")
    assert '--rdzv_id "$SLURM_JOB_ID" --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT"' in srun
    argv = shlex.split(srun)
    script = argv.index(str(settings.script_path))
    assert validate_argv(argv[script + 1:], env=command.env, world_size=128) == []


def _sbatch(slurm: dict | None = None, step_time_s: float | None = None,
            megatron_path: str = "Megatron-LM") -> list[str]:
    """The lines of a 16-node sbatch script (llama_65b, 128 GPUs) with these Slurm settings."""
    from layoutsearch.megatron.scripts import sbatch_script
    settings = MegatronSettings(slurm=slurm or {}, megatron_path=megatron_path)
    command = build_command(study_layout(128, 2, 4), study_job("llama_65b", 2048, 128), settings)
    return sbatch_script(command, settings, step_time_s=step_time_s).splitlines()


def test_sbatch_srun_carries_the_users_srun_args_as_the_slurm_launcher_does():
    # Slurm 22.05 and later bind an srun task to --cpus-per-task CPUs (1 unless srun is told),
    # which torchrun's ranks would share; `slurm_srun_args` is where a user says otherwise.
    from layoutsearch.megatron.slurm_options import submitit_parameters
    slurm = {"slurm_srun_args": ["--cpu-bind=none", "--cpus-per-task=96"]}
    srun = next(line for line in _sbatch(slurm) if line.startswith("srun "))
    assert srun.startswith("srun --ntasks-per-node=1 --kill-on-bad-exit=1 --cpu-bind=none "
                           "--cpus-per-task=96 python -m torch.distributed.run ")
    shape = dict(nodes=16, gpus_per_node=8, time_limit_s=60.0, name="t")
    assert submitit_parameters(slurm, **shape)["slurm_srun_args"] == [
        "--kill-on-bad-exit=1", "--cpu-bind=none", "--cpus-per-task=96"]


def test_sbatch_boolean_slurm_settings_are_bare_flags_or_left_out():
    lines = _sbatch({"slurm_exclusive": True, "slurm_requeue": False, "slurm_mem": 0,
                     "slurm_partition": None})
    assert "#SBATCH --exclusive" in lines and "#SBATCH --mem=0" in lines
    assert not any("True" in line or "False" in line or "requeue" in line for line in lines)
    assert not any("partition" in line for line in lines)  # None: unset, as in submitit


def test_trials_own_their_nodes_unless_told_otherwise():
    from layoutsearch.megatron.slurm_options import submitit_parameters
    assert "#SBATCH --exclusive" in _sbatch()
    assert not any("exclusive" in line for line in _sbatch({"slurm_exclusive": False}))
    shape = dict(nodes=2, gpus_per_node=8, time_limit_s=60.0, name="t")
    assert submitit_parameters({}, **shape)["slurm_exclusive"] is True
    assert "slurm_exclusive" not in submitit_parameters({"slurm_exclusive": False}, **shape)


def test_sbatch_spreads_submitit_additional_parameters_one_line_each():
    lines = _sbatch({"slurm_additional_parameters": {
        "mail_type": "END", "reservation": "my res", "overcommit": True, "requeue": False}})
    directives = [line for line in lines if line.startswith("#SBATCH")]
    assert directives[-3:] == ["#SBATCH --mail-type=END", '#SBATCH --reservation="my res"',
                               "#SBATCH --overcommit"]
    assert not any("additional" in line or "requeue" in line for line in lines)


def _sbatch_reads(line: str) -> str:
    """The value sbatch takes from `#SBATCH --name=value`: its _get_argument (src/sbatch/
    opt.c) as written there: a backslash escapes the next character, a double quote toggles
    whether whitespace ends the value, an unescaped # ends the line."""
    text, value, escaped, quoted = line.split("=", 1)[1], [], False, False
    for char in text:
        if escaped:
            value.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "#" or (char.isspace() and not quoted):
            break
        else:
            value.append(char)
    return "".join(value)


@pytest.mark.parametrize("value", [
    "gpu", "node[01-03]", "a100|h100", "run #1", 'say "hi"', "back\\slash", "it's mine",
    "two  spaces",
])
def test_sbatch_reads_back_each_value_as_given(value):
    lines = _sbatch({"slurm_comment": value})
    [line] = [line for line in lines if line.startswith("#SBATCH --comment=")]
    assert _sbatch_reads(line) == value


def test_sbatch_refuses_a_value_with_a_line_break():
    with pytest.raises(LayoutSearchError, match=r"slurm_comment='a\\nb': an sbatch option is "
                                                r"one line"):
        _sbatch({"slurm_comment": "a\nb"})


@pytest.mark.parametrize(("slurm", "named"), [
    ({"slurm_nodelist": ["a", "b"]}, "megatron.slurm.slurm_nodelist=['a', 'b']"),
    ({"slurm_gres": {"gpu": 8}}, "megatron.slurm.slurm_gres={'gpu': 8}"),
    ({"slurm_additional_parameters": {"gres": {"gpu": 8}}},
     "megatron.slurm.slurm_additional_parameters.gres={'gpu': 8}"),
])
def test_sbatch_rejects_list_and_mapping_slurm_values(slurm, named):
    with pytest.raises(LayoutSearchError) as caught:
        _sbatch(slurm)
    message = str(caught.value)
    assert named in message and "only slurm_additional_parameters may be a mapping" in message


def test_sbatch_additional_parameters_must_be_a_mapping():
    with pytest.raises(LayoutSearchError, match=r"slurm_additional_parameters='--qos=high': "
                       "must be a mapping of sbatch option to value"):
        _sbatch({"slurm_additional_parameters": "--qos=high"})


@pytest.mark.parametrize(("step_time_s", "time"), [
    (None, "00:30:00"),    # no prediction: 1800 s
    (50.0, "00:30:00"),    # 10 x 50 s x 1.5 + 600 s = 1350 s fits in 1800 s
    (207.0, "01:02:00"),   # 10 x 207 s x 1.5 + 600 s = 3705 s, rounded up to 62 min
    (600.0, "02:40:00"),   # 10 x 600 s x 1.5 + 600 s = 9600 s
])
def test_sbatch_time_covers_the_predicted_run(step_time_s, time):
    lines = _sbatch(step_time_s=step_time_s)
    assert [line for line in lines if line.startswith("#SBATCH --time")] == [
        f"#SBATCH --time={time}"]
    assert not any(line.startswith("# warning") for line in lines)


@pytest.mark.parametrize(("value", "below"), [
    ("00:30:00", "00:30:00"), (30, "00:30:00"), ("61:00", "01:01:00"), ("0-0:40", "00:40:00"),
    ("01:02:00", None), (65, None), ("1-00", None), ("UNLIMITED", None), (0, None),
])
def test_explicit_slurm_time_is_kept_and_warned_when_below_the_prediction(value, below):
    # The prediction: 10 iterations x 207 s x 1.5 + 600 s start-up = 3705 s, 01:02:00.
    lines = _sbatch({"slurm_time": value}, step_time_s=207.0)
    assert [line for line in lines if line.startswith("#SBATCH --time")] == [
        f"#SBATCH --time={value}"]
    warnings = [line for line in lines if line.startswith("# warning")]
    assert warnings == ([] if below is None else [
        f"# warning: slurm_time={value} ({below}) is below the predicted run time 01:02:00 "
        "(10 iterations x 207.0 s x 1.5 margin + 600 s start-up); Slurm may kill the job "
        "before it ends"])


def test_explicit_timeout_s_is_the_limit_as_given():
    from layoutsearch.megatron.scripts import sbatch_script, trial_time_limit_s
    settings = MegatronSettings(timeout_s=1200)
    assert trial_time_limit_s(settings, 207.0) == 1200  # the user's, even below the prediction
    assert trial_time_limit_s(MegatronSettings(), 207.0) == 3705.0
    assert trial_time_limit_s(MegatronSettings(), None) == 1800.0
    command = build_command(study_layout(128, 2, 4), study_job("llama_65b", 2048, 128), settings)
    lines = sbatch_script(command, settings, step_time_s=207.0).splitlines()
    assert "#SBATCH --time=00:20:00" in lines
    assert any(line.startswith("# warning: timeout_s=00:20:00 (00:20:00) is below the "
                               "predicted run time 01:02:00") for line in lines)


@pytest.mark.parametrize("value", [0, -5, True, "30 min", float("inf")])
def test_timeout_s_must_be_positive_seconds(value):
    # inf overflowed the sbatch --time of a multi-node dry run.
    with pytest.raises(LayoutSearchError, match=rf"megatron.timeout_s={value!r}: must be a "
                       "finite number of seconds > 0, or null"):
        MegatronSettings(timeout_s=value)


def test_sbatch_takes_submitits_generic_names_and_script_lines():
    lines = _sbatch({"name": "probe", "timeout_min": 90, "mem_gb": 1.5, "cpus_per_task": 12,
                     "slurm_partition": "gpu", "slurm_signal_delay_s": 120,
                     "slurm_setup": ["module load cuda/12.4", "source ~/env.sh"],
                     "slurm_teardown": ["echo done"]})
    for line in ("#SBATCH --job-name=probe", "#SBATCH --time=90", "#SBATCH --mem=1536MB",
                 "#SBATCH --cpus-per-task=12", "#SBATCH --partition=gpu"):
        assert line in lines
    # submitit's own mechanics have no sbatch option; the shell lines run around torchrun.
    assert not any("signal" in line or "timeout-min" in line or "mem-gb" in line
                   for line in lines)
    run = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    # The job moves into the checkout first: the setup lines run there too.
    setup = lines.index("set -euo pipefail") + 2
    assert lines[setup - 1] == f"cd {Path('Megatron-LM').absolute()} || exit 1"
    assert lines[setup].startswith("set +u")
    assert lines[setup + 1:setup + 4] == ["module load cuda/12.4", "source ~/env.sh", "set -u"]
    assert lines[setup + 4].startswith("export ") and lines[run - 1] == "status=0"
    assert lines[run].endswith("|| status=$?")
    assert lines[run + 2:run + 5] == ["echo done", "set -u", 'exit "$status"']
    # A Slurm-specific name wins over the generic one, as in submitit.
    assert "#SBATCH --time=02:00:00" in _sbatch({"slurm_time": "02:00:00", "timeout_min": 90})
    # false: no --time line, the partition's default limit applies.
    assert not any(line.startswith("#SBATCH --time") for line in _sbatch({"slurm_time": False}))


def _slurm_stubs(tmp_path: Path, srun: str) -> dict[str, str]:
    """The environment of a batch job's shell with `scontrol` and `srun` replaced by stubs
    (no Slurm here): `srun` runs the bash lines `srun`; PS1 unset, as in a batch shell."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("scontrol", "echo node001"), ("srun", srun)):
        stub = bin_dir / name
        stub.write_text(f"#!/usr/bin/env bash\n{body}\n")
        stub.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[001-016]",
            "SLURM_JOB_ID": "42"}


def _run_sbatch_script(tmp_path: Path, slurm: dict, checkout: Path | None = None,
                       ) -> subprocess.CompletedProcess[str]:
    """Run a 16-node sbatch script under bash, its `srun` a stub that prints what it was
    asked and in which folder; the checkout a folder of `tmp_path` unless given."""
    if checkout is None:
        checkout = tmp_path / "Megatron-LM"
        checkout.mkdir()
    env = _slurm_stubs(tmp_path, srun='echo "srun ran" "$@"; echo "srun in $PWD"')
    script = tmp_path / "job.sh"
    script.write_text("\n".join(_sbatch(slurm, megatron_path=str(checkout))))
    return subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=30, check=False)


def test_setup_lines_may_read_unset_variables_as_conda_activate_does(tmp_path):
    # conda's activate reads PS1, unset in a batch shell; under `set -u` it aborted the job.
    done = _run_sbatch_script(tmp_path, {"slurm_setup": ['[ -n "$PS1" ] || echo no prompt'],
                                         "slurm_teardown": ['echo "teardown $UNSET_TOO"']})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "no prompt"
    assert "srun ran --ntasks-per-node=1" in done.stdout
    assert done.stdout.splitlines()[-1] == "teardown "


def test_the_commands_environment_wins_over_what_setup_lines_export(tmp_path):
    # A module or activate script may export its own NCCL or CUDA settings; the script
    # exported the command's before the setup lines ran, so theirs reached torchrun, where
    # the slurm launcher applies the command's last. The layout (tp 2) needs 1 connection.
    done = _run_sbatch_script(tmp_path, {
        "slurm_setup": ["export CUDA_DEVICE_MAX_CONNECTIONS=8 NVTE_FLASH_ATTN=0"],
        "slurm_teardown": ['echo "at srun: $CUDA_DEVICE_MAX_CONNECTIONS $NVTE_FLASH_ATTN"']})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "at srun: 1 1"


def test_a_failing_setup_line_still_stops_the_job(tmp_path):
    done = _run_sbatch_script(tmp_path, {"slurm_setup": ["false"]})
    assert done.returncode == 1
    assert "srun ran" not in done.stdout


def test_the_job_runs_in_the_checkout_and_stops_where_it_is_missing(tmp_path):
    # srun's steps start in the folder srun is called from (srun(1), --chdir): the script's
    # own, which was the one sbatch was called from.
    checkout = tmp_path / "my $HOME's Megatron-LM"
    checkout.mkdir()
    done = _run_sbatch_script(tmp_path, {"slurm_setup": ['echo "setup in $PWD"']}, checkout)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"setup in {checkout}"
    assert done.stdout.splitlines()[-1] == f"srun in {checkout}"
    # Slurm would run the steps in /tmp; the job stops before the setup lines instead.
    gone, again = tmp_path / "gone", tmp_path / "again"
    again.mkdir()
    stopped = _run_sbatch_script(again, {"slurm_setup": ["echo setup ran"]}, gone)
    assert stopped.returncode == 1 and stopped.stdout == ""
    assert f"cd: {gone}: No such file or directory" in stopped.stderr


@pytest.mark.parametrize(("slurm", "named"), [
    ({"nodes": 4}, "megatron.slurm.nodes"),
    ({"slurm_gpus_per_node": 4}, "megatron.slurm.slurm_gpus_per_node"),
    ({"tasks_per_node": 4}, "megatron.slurm.tasks_per_node"),
    ({"slurm_additional_parameters": {"ntasks-per-node": 4}},
     "megatron.slurm.slurm_additional_parameters.ntasks-per-node"),
])
def test_slurm_settings_cannot_change_the_jobs_shape(slurm, named):
    with pytest.raises(LayoutSearchError, match=rf"{named}: the nodes, tasks and GPUs per node "
                       "follow from the layout"):
        MegatronSettings(slurm=slurm)
    # None is unset, as in submitit (a null slurm_additional_parameters failed the Slurm
    # launcher's check with "'NoneType' object has no attribute 'items'").
    for launcher in ("local", "slurm"):
        MegatronSettings(launcher=launcher, slurm={key: None for key in slurm})


@pytest.mark.parametrize(("slurm", "message"), [
    ({"partition": "gpu"}, r"megatron.slurm.partition='gpu': submitit takes Slurm options as "
                           r"slurm_<name> \(e.g. slurm_partition\)"),
    ({"setup": ["module load cuda"]}, r"megatron.slurm.setup=.*e.g. slurm_setup"),
    ({"mem_gb": "16G"}, r"megatron.slurm.mem_gb='16G': must be a number of gigabytes"),
    ({"timeout_min": 90.5}, r"megatron.slurm.timeout_min=90.5: must be a whole number"),
    ({"name": 123}, r"megatron.slurm.name=123: must be a string"),
    ({"timeout_min": -5}, r"megatron.slurm.timeout_min=-5: must be a whole number of minutes "
                          r"above 0"),
    ({"mem_gb": 0}, r"megatron.slurm.mem_gb=0: must be a number of gigabytes above 0"),
    # No whole megabytes: writing the scripts failed with ValueError or OverflowError.
    ({"mem_gb": float("nan")}, r"megatron.slurm.mem_gb=nan: must be a finite number of "
                               r"gigabytes$"),
    ({"mem_gb": float("inf")}, r"megatron.slurm.mem_gb=inf: must be a finite number of "
                               r"gigabytes$"),
])
def test_slurm_settings_submitit_would_refuse_are_refused_up_front(slurm, message):
    with pytest.raises(LayoutSearchError, match=message):
        MegatronSettings(slurm=slurm)


@pytest.mark.parametrize(("value", "shown"), [("module load cuda", "'module load cuda'"),
                                               (False, "False"), (3, "3")])
def test_slurm_setup_must_be_shell_lines(value, shown):
    with pytest.raises(LayoutSearchError, match=rf"slurm_setup={shown}: must be a "
                       "list of shell lines"):
        MegatronSettings(slurm={"slurm_setup": value})


def test_slurm_srun_args_must_be_a_list_of_options():
    # A string would reach srun one character at a time ('-', '-', 'c', ...).
    with pytest.raises(LayoutSearchError, match=r"megatron.slurm.slurm_srun_args="
                       r"'--cpu-bind=none': must be a list of srun options, e.g. "
                       r"\['--cpu-bind=none'\]"):
        MegatronSettings(slurm={"slurm_srun_args": "--cpu-bind=none"})
    assert MegatronSettings(slurm={"slurm_srun_args": ["--cpu-bind=none"]})


def test_explicit_slurm_time_must_be_an_sbatch_time():
    with pytest.raises(LayoutSearchError, match=r"megatron.slurm.slurm_time='half an hour': "
                       "not an sbatch time"):
        _sbatch({"slurm_time": "half an hour"}, step_time_s=207.0)


@pytest.mark.parametrize("step_time_s", [float("nan"), float("inf"), 0.0, -1.0])
def test_predicted_step_time_must_be_positive_and_finite(step_time_s):
    with pytest.raises(LayoutSearchError, match=r"step_time_s=.*: must be a positive, finite "
                       "number of seconds"):
        _sbatch(step_time_s=step_time_s)


def test_launch_scripts_of_ranked_rows_get_time_for_their_predicted_steps(tmp_path):
    ranked = layoutsearch.search(model="llama_65b", num_gpus=128, seq_length=2048,
                                 global_batch_size=2048, vocab_size=128000)
    ranked = ranked.head(1).assign(step_time_s=207.0)
    path, = write_launch_scripts(ranked, job_of(ranked, "test"), tmp_path, top_k=1)
    assert "#SBATCH --time=01:02:00" in path.read_text().splitlines()


def test_ranked_results_carry_commands_and_scripts(tmp_path):
    ranked = layoutsearch.search(model="llama_13b", num_gpus=64, seq_length=2048,
                                 global_batch_size=2048, vocab_size=128000)
    job = job_of(ranked, "test")
    with_args = with_megatron_args(ranked, job)
    best = with_args.iloc[0]
    args = parse_argv(shlex.split(best["megatron_args"]))
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
            args.micro_batch_size) == (best["tp"], best["pp"], best["micro_batch_size"])
    paths = write_launch_scripts(ranked, job, tmp_path, top_k=5)
    assert len(paths) == 5 and paths[0].name.startswith("01_")
    assert all(p.stat().st_mode & 0o111 for p in paths)
    # Past rank 99 every name takes three digits: a listing stays in rank order.
    many = write_launch_scripts(ranked, job, tmp_path / "many", top_k=120)
    assert len(many) == 120 and many[0].name.startswith("001_")
    assert sorted(many, key=lambda p: p.name) == many


def test_dry_run_writes_a_script_and_measures_nothing(tmp_path):
    command = build_command(Layout(dp=8), study_job("llama_13b", 2048, 8))
    log = DryRunLauncher(MegatronSettings()).run(
        Trial(name="x", command=command, log_path=tmp_path / "x.log"))
    assert not log.ran and (tmp_path / "x.sh").is_file()


def test_local_launcher_runs_the_fake_and_kills_a_hang(tmp_path):
    job = study_job("llama_13b", 2048, 8).model
    from layoutsearch.catalog import load_cluster
    from layoutsearch.specs import Job
    small = Job(model=job, cluster=load_cluster("a100_80gb"), num_gpus=8, seq_length=2048,
                global_batch_size=64)
    settings = fake_megatron_settings(tmp_path, inject="2=hang", timeout_s=60)
    command = build_command(Layout(tp=8, dp=1, rmsnorm_kernel=True), small, settings)
    first = LocalLauncher(settings).run(Trial(name="a", command=command,
                                              log_path=tmp_path / "a.log"))
    assert parse_log(first.text).status == "ok"
    second = LocalLauncher(settings.replace(timeout_s=2)).run(
        Trial(name="b", command=command, log_path=tmp_path / "b.log"))
    assert second.timed_out and parse_log(second.text, timed_out=True).status == "timeout"
    missing = LocalLauncher(settings.replace(script="missing.py")).run(
        Trial(name="c", command=command, log_path=tmp_path / "c.log"))
    assert parse_log(missing.text, returncode=missing.returncode).status == "error"


def test_local_launcher_finds_a_checkout_given_relative_to_the_working_folder(
        tmp_path, monkeypatch):
    # The shipped settings say megatron_path: Megatron-LM (a folder beside the user).
    checkout = tmp_path / "Megatron-LM"
    checkout.mkdir()
    fake = fake_megatron_settings(tmp_path)
    (checkout / "pretrain_gpt.py").write_text(Path(fake.script_path).read_text())
    monkeypatch.chdir(tmp_path)
    settings = fake.replace(megatron_path="Megatron-LM")
    job = study_job("llama_13b", 2048, 8)
    command = build_command(Layout(tp=8, dp=1, rmsnorm_kernel=True), job, settings)
    assert settings.script_path == checkout / "pretrain_gpt.py"
    run = LocalLauncher(settings).run(Trial(name="a", command=command,
                                            log_path=tmp_path / "a.log"))
    assert parse_log(run.text, returncode=run.returncode).status == "ok", run.text


def test_slurm_launcher_submits_one_task_per_node(tmp_path, monkeypatch):
    settings = MegatronSettings(launcher="slurm", slurm={"slurm_partition": "gpu"})
    command = build_command(study_layout(128, 2, 4), study_job("llama_65b", 2048, 128), settings)
    launcher = SlurmLauncher(settings, executor_factory=FakeExecutor)
    log = launcher.run(Trial(name="t", command=command, log_path=tmp_path / "t.log"))
    parameters, run_node, (argv, env, _) = FakeExecutor.submitted[-1]
    assert parameters["nodes"] == 16 and parameters["tasks_per_node"] == 1
    assert parameters["slurm_partition"] == "gpu" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert parameters["slurm_srun_args"] == ["--kill-on-bad-exit=1"]  # as the sbatch script
    assert parse_log(log.text, returncode=log.returncode, warmup_iters=3).step_time_s == 3.0
    # Each node's task runs torchrun with Slurm's rendezvous in place of the single-node
    # rank and master: the first host scontrol names, the job's id, the settings' port.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'gpu017\\ngpu018\\n'\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[017-018]")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    seen = tmp_path / "argv.txt"
    recorder = [sys.executable, "-c", f"import sys; open({str(seen)!r}, 'w').write("
                                      "'\\n'.join(sys.argv[1:]))"]
    assert argv[:3] == ["python", "-m", "torch.distributed.run"]
    assert run_node([*recorder, *argv[3:]], env, str(tmp_path)) == 0
    assert seen.read_text().splitlines() == [
        "--nproc_per_node", "8", "--nnodes", "16", "--rdzv_backend", "c10d",
        "--rdzv_id", "4242", "--rdzv_endpoint", "gpu017:29500",
        str(settings.script_path), *command.argv]


def test_ctrl_c_while_waiting_cancels_the_slurm_job(tmp_path):
    executor = executor_of(JobStillRunning)
    settings = MegatronSettings(launcher="slurm")
    command = build_command(study_layout(128, 2, 4), study_job("llama_65b", 2048, 128), settings)
    launcher = SlurmLauncher(settings, executor_factory=executor)
    with pytest.raises(KeyboardInterrupt):
        launcher.run(Trial(name="t", command=command, log_path=tmp_path / "t.log"))
    assert [job.cancelled for job in executor.jobs] == [True]


@pytest.mark.parametrize(("slurm", "named"), [
    ({"slurm_exclude": "node[01-03]"}, "megatron.slurm.slurm_exclude='node[01-03]'"),
    ({"slurm_additional_parameters": {"reservation": "my res"}},
     "megatron.slurm.slurm_additional_parameters.reservation='my res'"),
])
def test_submitit_refuses_values_it_would_quote_for_a_shell(slurm, named):
    with pytest.raises(LayoutSearchError, match=re.escape(named) + ": submitit would write"):
        MegatronSettings(launcher="slurm", slurm=slurm)
    MegatronSettings(launcher="dry_run", slurm=slurm)  # the scripts quote it for sbatch


def test_slurm_parameters_are_submitits_and_agree_with_the_sbatch_script(tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")
    from submitit.slurm.slurm import SlurmExecutor

    from layoutsearch.megatron.scripts import enter_checkout, sbatch_script
    from layoutsearch.megatron.slurm_options import submitit_parameters
    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # srun "found"
    slurm = {"name": "probe", "timeout_min": 90, "mem_gb": 1.5, "cpus_per_task": 12,
             "slurm_partition": "gpu", "slurm_exclusive": True, "slurm_signal_delay_s": 120,
             "slurm_requeue": False, "slurm_qos": "high", "slurm_setup": ["module load cuda"],
             "slurm_srun_args": ["--verbose"],
             "slurm_additional_parameters": {"reservation": "my_res", "qos": "low",
                                             "comment": None}}
    settings = MegatronSettings(launcher="slurm", slurm=slurm)
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(**submitit_parameters(
        slurm, nodes=16, gpus_per_node=8, time_limit_s=3705.0, name="t",
        first_lines=[enter_checkout(settings)]))
    theirs = executor._executor._make_submission_file_text("python -m run", "uid").splitlines()
    command = build_command(study_layout(128, 2, 4), study_job("llama_65b", 2048, 128), settings)
    ours = [line for line in sbatch_script(command, settings, step_time_s=207.0).splitlines()
            if line.startswith("#SBATCH")]
    # Every line of ours is submitit's for the same settings (the user's time and name win,
    # additional parameters win over slurm_ names, False and None leave an option out).
    assert set(ours) <= set(theirs), set(ours) - set(theirs)
    assert "#SBATCH --time=90" in ours and "#SBATCH --nodes=16" in ours
    assert "#SBATCH --qos=low" in ours and not any(
        "requeue" in line or "comment" in line for line in theirs)
    # Both jobs move into the checkout first, then run the setup lines, then srun.
    setup = theirs.index("# setup")
    assert theirs[setup + 1:setup + 3] == [enter_checkout(settings), "module load cuda"]
    assert enter_checkout(settings) in sbatch_script(command, settings).splitlines()
    srun = next(line for line in theirs if line.startswith("srun "))
    assert "--kill-on-bad-exit=1 --verbose" in srun  # ours, then the user's srun_args
    ours_srun = next(line for line in sbatch_script(command, settings).splitlines()
                     if line.startswith("srun "))
    assert "--kill-on-bad-exit=1 --verbose python" in ours_srun  # the same on both paths


def test_slurm_launcher_time_limit_rounds_up_and_the_users_wins(tmp_path):
    from layoutsearch.megatron.slurm_options import submitit_parameters
    automatic = submitit_parameters({}, nodes=2, gpus_per_node=8, time_limit_s=3705.0, name="t")
    assert automatic["timeout_min"] == 62  # 61.75 min, never cut shorter
    users = submitit_parameters({"timeout_min": 30}, nodes=2, gpus_per_node=8,
                                time_limit_s=3705.0, name="t")
    assert users["timeout_min"] == 30
    # submitit always writes a --time: "no time" (false) there is the trial's own limit.
    unset = submitit_parameters({"slurm_time": False}, nodes=2, gpus_per_node=8,
                                time_limit_s=3705.0, name="t")
    assert unset["timeout_min"] == 62 and "slurm_time" not in unset
    settings = MegatronSettings(launcher="slurm", slurm={"timeout_min": 30, "name": "mine"})
    command = build_command(study_layout(128, 2, 4), study_job("llama_65b", 2048, 128), settings)
    SlurmLauncher(settings, executor_factory=FakeExecutor).run(
        Trial(name="t", command=command, log_path=tmp_path / "t.log", step_time_s=207.0))
    parameters, _, _ = FakeExecutor.submitted[-1]
    assert (parameters["timeout_min"], parameters["name"]) == (30, "mine")


def test_layouts_that_share_a_command_share_one_script(tmp_path):
    # flash1 and flash2 are one Megatron-LM command (--attention-backend flash): measuring
    # both would run the same trial twice.
    ranked = layoutsearch.search(model="llama_13b", num_gpus=64, seq_length=2048,
                                 global_batch_size=2048, vocab_size=128000,
                                 attention=["flash1", "flash2"], rmsnorm_kernel=[True])
    paths = write_launch_scripts(ranked, job_of(ranked, "test"), tmp_path, top_k=3)
    commands = [p.read_text().strip().splitlines()[-1] for p in paths]
    assert len(paths) == 3 and len(set(commands)) == 3
    feasible = ranked[ranked["fits"]].reset_index(drop=True)
    first = feasible.iloc[0]
    twin = feasible[(feasible["tp"] == first["tp"]) & (feasible["pp"] == first["pp"])
                    & (feasible["micro_batch_size"] == first["micro_batch_size"])
                    & (feasible["recompute"] == first["recompute"])
                    & (feasible["attention"] != first["attention"])].index[0]
    assert f"the same command runs rank {twin + 1} (" in paths[0].read_text()
    # Ranks in the file names skip the rows that got no script of their own.
    ranks = [int(p.name[:2]) for p in paths]
    assert ranks[0] == 1 and ranks == sorted(ranks) and ranks[-1] > 3


def test_the_slurm_launcher_refuses_a_machine_without_sbatch(tmp_path, monkeypatch):
    # Without sbatch, submitit's AutoExecutor runs the "job" here instead: one failure
    # per layout, each recorded as a measurement, had the search gone on.
    monkeypatch.setenv("PATH", str(tmp_path))
    settings = fake_megatron_settings(tmp_path).replace(launcher="slurm")
    command = build_command(study_layout(128, 2, 4), study_job("llama_65b", 2048, 128), settings)
    problem = SlurmLauncher(settings).preflight(command)
    assert problem is not None and "Slurm's sbatch, which is not on this machine's PATH" in problem
    (tmp_path / "sbatch").write_text("#!/bin/sh\n")
    (tmp_path / "sbatch").chmod(0o755)
    assert SlurmLauncher(settings).preflight(command) is None


PROBE = """import os, sys
args = sys.argv[1:]
folder = args[args.index("--tensorboard-dir") + 1]
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "seen.txt"), "w") as seen:
    seen.write(os.getcwd() + "\\n" + os.path.abspath(os.environ["PROBE_DATA"]) + "\\n")
"""
"""A training script that writes, into the folder its relative --tensorboard-dir names, its
working folder and where its relative PROBE_DATA points."""


def _probe_run(tmp_path: Path) -> tuple[MegatronSettings, object, Path, list[str]]:
    """Settings whose checkout (a name with a space, a quote and `$`) holds PROBE, run by the
    fake torchrun with a relative path in extra_args and one in env; a command of one node,
    the file PROBE writes and the two lines it should hold."""
    checkout = tmp_path / "my $HOME's checkout"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text(PROBE)
    settings = fake_megatron_settings(tmp_path).replace(
        megatron_path=str(checkout), extra_args=("--tensorboard-dir", "tb"),
        env={"PROBE_DATA": "data/my_text_document"})
    command = build_command(Layout(tp=1, dp=8, rmsnorm_kernel=True),
                            study_job("llama_13b", 2048, 8), settings)
    return settings, command, checkout / "tb" / "seen.txt", [
        str(checkout), str(checkout / "data" / "my_text_document")]


def test_relative_paths_name_the_same_files_locally_and_in_a_written_script(
        tmp_path, monkeypatch):
    from layoutsearch.megatron.scripts import write_script
    settings, command, seen, expected = _probe_run(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    local = LocalLauncher(settings).run(Trial(name="local", command=command,
                                              log_path=tmp_path / "local.log"))
    assert local.returncode == 0, local.text
    assert seen.read_text().splitlines() == expected
    seen.unlink()
    # The dry run's one-node script, run by hand from another folder.
    script = write_script(command, settings, tmp_path / "run.sh")
    done = subprocess.run(["bash", str(script)], cwd=elsewhere, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert seen.read_text().splitlines() == expected
    assert list(elsewhere.iterdir()) == []


def test_relative_paths_name_the_same_files_in_an_sbatch_script(tmp_path):
    # srun a stub that runs its step here, in the folder srun is called from, as Slurm does.
    from layoutsearch.megatron.scripts import write_script
    settings, command, seen, expected = _probe_run(tmp_path)
    settings = settings.replace(slurm={"slurm_partition": "gpu"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _slurm_stubs(tmp_path, srun='while [[ $1 == -* ]]; do shift; done; exec "$@"')
    script = write_script(command, settings, tmp_path / "job.sh")
    assert "#SBATCH --partition=gpu" in script.read_text()
    done = subprocess.run(["bash", str(script)], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert seen.read_text().splitlines() == expected
    assert list(elsewhere.iterdir()) == []


def test_the_slurm_launchers_job_moves_into_the_checkout_first(tmp_path):
    settings, command, _, _ = _probe_run(tmp_path)
    settings = settings.replace(launcher="slurm", slurm={"slurm_setup": ["module load cuda"]})
    SlurmLauncher(settings, executor_factory=FakeExecutor).run(
        Trial(name="t", command=command, log_path=tmp_path / "t.log"))
    parameters, _, (_, _, cwd) = FakeExecutor.submitted[-1]
    assert parameters["slurm_setup"] == [
        f"cd {shlex.quote(str(settings.checkout))} || exit 1", "module load cuda"]
    assert cwd == str(settings.checkout)


def test_the_local_launcher_refuses_a_checkout_that_is_not_a_folder(tmp_path):
    # A training script given by absolute path, elsewhere: the run would start nowhere.
    settings, command, _, _ = _probe_run(tmp_path)
    script = str(settings.script_path)
    missing = settings.replace(megatron_path=str(tmp_path / "no checkout"), script=script)
    problem = LocalLauncher(missing).preflight(command)
    assert problem == (f"megatron_path={str(tmp_path / 'no checkout')!r}: "
                       f"{tmp_path / 'no checkout'} is not a folder; trials run in the "
                       "Megatron-LM checkout: set megatron_path (cost_models/megatron.yaml) "
                       "to one")
    log = LocalLauncher(missing).run(Trial(name="m", command=command,
                                           log_path=tmp_path / "m.log"))
    assert not log.ran and log.text == problem
