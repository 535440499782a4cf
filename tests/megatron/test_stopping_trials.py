"""A trial the local launcher stops (its time limit) leaves no process behind, ranks included.

torchrun starts each rank in a session of its own, and so does the fake torchrun: a signal to
torchrun's process group does not reach them.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.layout import Layout
from layoutsearch.megatron import LocalLauncher, Trial, build_command
from layoutsearch.megatron.settings import MegatronSettings
from layoutsearch.specs import Job
from layoutsearch.testing import fake_megatron_settings, running_trials

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").is_file(),
                                reason="finds the trial's processes in /proc")

JOB = Job(model=load_model("llama_7b"), cluster=load_cluster("a100_80gb"), num_gpus=8,
          seq_length=2048, global_batch_size=64)
STUCK_RANK = """\
import signal, subprocess, sys, time
# A rank stuck in a CUDA call or a collective does not answer SIGTERM; its data-loader
# worker, in its process group, does not either.
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("stuck in a collective", flush=True)
time.sleep(600)
"""


@pytest.fixture
def workdir(tmp_path):
    """The fake's folder; whatever of a trial a failed test leaves running is killed."""
    yield tmp_path
    for pid in running_trials(tmp_path):
        os.kill(pid, signal.SIGKILL)


def run_until_timeout(settings: MegatronSettings, workdir: Path, **launcher):
    command = build_command(Layout(tp=1, dp=8, rmsnorm_kernel=True), JOB, settings)
    return LocalLauncher(settings, **launcher).run(
        Trial(name="t", command=command, log_path=workdir / "t.log"))


@pytest.mark.parametrize("proc", ["/proc", "/no-proc-here"])
def test_a_timed_out_trial_leaves_no_rank_running(workdir, monkeypatch, proc):
    # Without /proc the ranks cannot be found, but torchrun still passes SIGTERM on to them.
    monkeypatch.setattr("layoutsearch.lifetime.PROC", proc)
    settings = fake_megatron_settings(workdir, inject="1=hang", timeout_s=2)
    log = run_until_timeout(settings, workdir)
    assert log.timed_out and "waiting for a collective" in log.text
    assert running_trials(workdir) == []


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period(workdir):
    checkout = workdir / "Megatron-LM"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text(STUCK_RANK)
    settings = fake_megatron_settings(workdir, timeout_s=2).replace(
        megatron_path=str(checkout))
    started = time.monotonic()
    log = run_until_timeout(settings, workdir, stop_grace_s=0.5)
    assert log.timed_out and "stuck in a collective" in log.text
    assert running_trials(workdir) == []
    assert time.monotonic() - started < 30  # the grace given, not torchrun's own 30 s
