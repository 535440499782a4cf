"""Launch scripts, the megatron_args column, and the launchers (fake Megatron-LM, fake Slurm)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import ClassVar

import pytest
from megatron_study import study_job, study_layout

import layoutsearch
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
from layoutsearch.testing import fake_megatron_settings

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
    argv = _last_command(path)
    assert argv[argv.index("--nproc_per_node") + 1] == "8"
    assert "/opt/my megatron/pretrain_gpt.py" in argv
    assert argv[-1] == "/tmp/$(rm -rf ~)"  # one literal argument, never run


def test_multi_node_sbatch_script_uses_slurm_rendezvous(tmp_path):
    settings = MegatronSettings(slurm={"slurm_partition": "gpu"})
    command = build_command(study_layout(128, 2, 4), study_job("llama_65b", 2048, 128), settings)
    from layoutsearch.megatron.scripts import write_script
    text = write_script(command, settings, tmp_path / "job.sh").read_text()
    assert "#SBATCH --nodes=16" in text and "#SBATCH --gpus-per-node=8" in text
    assert "#SBATCH --partition=gpu" in text
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text
    srun = text.strip().splitlines()[-1]
    assert srun.startswith("srun --ntasks-per-node=1")
    assert '--rdzv_id "$SLURM_JOB_ID" --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT"' in srun
    argv = shlex.split(srun)
    script = argv.index(str(settings.script_path))
    assert validate_argv(argv[script + 1:], env=command.env, world_size=128) == []


def test_ranked_results_carry_commands_and_scripts(tmp_path):
    ranked = layoutsearch.search(model="llama_13b", num_gpus=64, seq_length=2048,
                                 global_batch_size=2048, vocab_size=128000)
    job = ranked.attrs["job"]
    with_args = with_megatron_args(ranked, job)
    best = with_args.iloc[0]
    args = parse_argv(shlex.split(best["megatron_args"]))
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
            args.micro_batch_size) == (best["tp"], best["pp"], best["micro_batch_size"])
    paths = write_launch_scripts(ranked, job, tmp_path, top_k=5)
    assert len(paths) == 5 and paths[0].name.startswith("01_")
    assert all(p.stat().st_mode & 0o111 for p in paths)


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


class FakeJob:
    def __init__(self, codes):
        self.codes = codes

    def results(self):
        return self.codes

    def stdout(self):
        return " iteration        4/       6 | consumed samples: 4 | elapsed time per " \
            "iteration (ms): 1500.0 | throughput per GPU (TFLOP/s/GPU): 150.0 |"

    def stderr(self):
        return ""


class FakeExecutor:
    submitted: ClassVar[list] = []

    def __init__(self, folder):
        self.folder = folder

    def update_parameters(self, **parameters):
        self.parameters = parameters

    def submit(self, function, *args):
        FakeExecutor.submitted.append((self.parameters, function, args))
        return FakeJob([0] * self.parameters["nodes"])


def test_slurm_launcher_submits_one_task_per_node(tmp_path):
    settings = MegatronSettings(launcher="slurm", slurm={"slurm_partition": "gpu"})
    command = build_command(study_layout(128, 2, 4), study_job("llama_65b", 2048, 128), settings)
    launcher = SlurmLauncher(settings, executor_factory=FakeExecutor)
    log = launcher.run(Trial(name="t", command=command, log_path=tmp_path / "t.log"))
    parameters, _, (_argv, env, _) = FakeExecutor.submitted[-1]
    assert parameters["nodes"] == 16 and parameters["tasks_per_node"] == 1
    assert parameters["slurm_partition"] == "gpu" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert parse_log(log.text, returncode=log.returncode, warmup_iters=3).step_time_s == 1.5


class InterruptedJob(FakeJob):
    cancelled = False

    def results(self):
        raise KeyboardInterrupt

    def cancel(self, check=True):
        self.cancelled = True


def test_ctrl_c_while_waiting_cancels_the_slurm_job(tmp_path):
    job = InterruptedJob([])

    class Executor(FakeExecutor):
        def submit(self, function, *args):
            return job

    settings = MegatronSettings(launcher="slurm")
    command = build_command(study_layout(128, 2, 4), study_job("llama_65b", 2048, 128), settings)
    launcher = SlurmLauncher(settings, executor_factory=Executor)
    with pytest.raises(KeyboardInterrupt):
        launcher.run(Trial(name="t", command=command, log_path=tmp_path / "t.log"))
    assert job.cancelled
