"""One local trial at a time on this machine's GPUs (megatron/gpu_lock.py)."""

from __future__ import annotations

import errno
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from layoutsearch.catalog import load_cluster, load_model
from layoutsearch.layout import Layout
from layoutsearch.megatron import LocalLauncher, Trial, build_command, parse_log
from layoutsearch.megatron.gpu_lock import holding_the_gpus, lock_path
from layoutsearch.specs import Job
from layoutsearch.testing import fake_megatron_settings, launches

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock and fork are Unix's")

JOB = Job(model=load_model("llama_7b"), cluster=load_cluster("a100_80gb"), num_gpus=8,
          seq_length=2048, global_batch_size=64)


@pytest.fixture(autouse=True)
def lock_folder(tmp_path, monkeypatch) -> Path:
    """The lock files in the test's folder, not this machine's /tmp (forks inherit it)."""
    folder = tmp_path / "locks"
    folder.mkdir()
    monkeypatch.setattr("layoutsearch.megatron.gpu_lock.LOCK_FOLDER", folder)
    return folder


def _hold(seconds: float, held, released) -> None:
    with holding_the_gpus("local: the other search's trial"):
        held.set()
        time.sleep(seconds)
        released.value = time.time()


def held_elsewhere(seconds: float):
    """A process holding this machine's GPUs for `seconds`, as another search's trial
    would; its `released` value is when it let go (seconds since the epoch)."""
    context = multiprocessing.get_context("fork")
    held, released = context.Event(), context.Value("d", 0.0)
    process = context.Process(target=_hold, args=(seconds, held, released))
    process.start()
    assert held.wait(30)
    return process, released


def test_a_trial_waits_for_the_gpus_another_searchs_trial_holds_and_says_so(capsys):
    other, released = held_elsewhere(1.0)
    with holding_the_gpus("local: launch 2 of 8: llama_7b_x"):
        acquired = time.time()
    other.join()
    assert acquired >= released.value > 0
    assert capsys.readouterr().err == (
        "local: launch 2 of 8: llama_7b_x: waiting for this machine's GPUs, which a trial of "
        f"another search runs on ({lock_path()})\n")


def test_the_gpus_of_a_process_that_died_holding_them_are_free(capsys):
    other, _ = held_elsewhere(60.0)
    other.kill()  # no release of its own: the lock ends with its process
    other.join()
    with holding_the_gpus("local: t"):
        pass
    assert capsys.readouterr().err == ""


def test_the_local_launcher_starts_its_trial_once_the_gpus_are_free_and_times_it_from_there(
        tmp_path, capsys):
    # The wait (4 s) is longer than the trial's time limit (3 s): counted in, the trial
    # would be killed as a hang before it trained.
    settings = fake_megatron_settings(tmp_path, timeout_s=3)
    command = build_command(Layout(tp=1, dp=8, rmsnorm_kernel=True), JOB, settings)
    other, released = held_elsewhere(4.0)
    log = LocalLauncher(settings).run(Trial(name="t", command=command,
                                            log_path=tmp_path / "t.log"))
    other.join()
    assert not log.timed_out and parse_log(log.text).status == "ok"
    assert (tmp_path / "t.log").stat().st_mtime >= released.value  # trained after the wait
    assert len(launches(tmp_path)) == 1
    assert "local: t: waiting for this machine's GPUs" in capsys.readouterr().err


def test_the_fake_launcher_of_a_fake_cluster_holds_no_gpus(tmp_path, capsys):
    settings = fake_megatron_settings(tmp_path)
    command = build_command(Layout(tp=1, dp=8, rmsnorm_kernel=True), JOB, settings)
    other, _ = held_elsewhere(60.0)
    try:
        log = LocalLauncher(settings, max_nodes=None, holds_gpus=False).run(
            Trial(name="t", command=command, log_path=tmp_path / "t.log"))
    finally:
        other.terminate()
        other.join()
    assert parse_log(log.text).status == "ok" and capsys.readouterr().err == ""


def test_the_lock_is_the_machines_whatever_tmpdir_says(tmp_path):
    # A TMPDIR of the user's or of a Slurm job would give each search a lock of its own,
    # and one on a shared file system one lock for the GPUs of every machine.
    code = "from layoutsearch.megatron.gpu_lock import lock_path; print(lock_path())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "TMPDIR": str(tmp_path)}).stdout
    assert out.strip() == "/tmp/layoutsearch-gpus.lock"


def test_a_trial_is_launched_unlocked_where_the_lock_file_takes_no_flock(monkeypatch, capsys):
    def no_flock(descriptor: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")  # NFS without its lock daemon

    monkeypatch.setattr("layoutsearch.megatron.gpu_lock.fcntl.flock", no_flock)
    opened = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    with holding_the_gpus("local: t"):
        ran = True
    assert ran
    assert capsys.readouterr().err.startswith(
        f"local: t: cannot lock this machine's GPUs with {lock_path()} ([Errno")
    if opened is not None:
        assert len(os.listdir("/proc/self/fd")) == opened  # the lock file's descriptor closed


def test_another_users_lock_file_in_a_sticky_folder_is_locked(monkeypatch, capsys):
    import fcntl  # Unix's, as the tests here are

    lock_path().touch()
    real_open = os.open

    def protected_regular(path, flags, mode=0o777, **kwargs):
        # The kernel's fs.protected_regular: no O_CREAT of another user's file in /tmp.
        if flags & os.O_CREAT and Path(path).exists():
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", protected_regular)
    with holding_the_gpus("local: t"):
        other = real_open(lock_path(), os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):  # held: another search's trial would wait
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert capsys.readouterr().err == ""


def test_the_lock_file_made_under_a_narrow_umask_is_readable_by_other_users():
    previous = os.umask(0o077)
    try:
        with holding_the_gpus("local: t"):
            pass
    finally:
        os.umask(previous)
    assert lock_path().stat().st_mode & 0o777 == 0o644
