"""Searches sharing one measurement file launch each layout once (costs/claims.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import layoutsearch
from layoutsearch.costs.claims import Claimant, LayoutClaim, claims_folder
from layoutsearch.costs.measurement_file import MeasurementFile, measurement_key
from layoutsearch.liveness import HOST, STALE_S
from layoutsearch.measurements import read_measurements
from layoutsearch.testing import fake_measured_model, launches

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock and fork are Unix's")

SMALL_JOB = dict(model="llama_7b", num_gpus=8, seq_length=2048, global_batch_size=64)
MEASURED = ["tp", "pp", "micro_batch_size", "sequence_parallel", "measured_status",
            "step_time_s", "reason"]
"""What a search's answer says of a measured layout: its layout, status, step time, reason."""


def measured_rows(ranked) -> list[dict]:
    rows = ranked[ranked["measured_status"].fillna("") != ""]
    return sorted(rows[MEASURED].to_dict("records"), key=str)


def _search_at_once(workdir: Path, start, answers) -> None:
    start.wait()  # both searches at once, so that each would launch every layout
    model = fake_measured_model(workdir, top_k=3, sleep_s=0.05)
    ranked = layoutsearch.search(cost_model=model, **SMALL_JOB)
    answers.put((model.launched, measured_rows(ranked)))


def test_two_searches_sharing_a_file_launch_each_layout_once_and_answer_alike(
        tmp_path, monkeypatch):
    monkeypatch.setattr("layoutsearch.costs.claims.POLL_S", 0.05)  # the forks inherit it
    context = multiprocessing.get_context("fork")
    start, answers = context.Barrier(2), context.Queue()
    searches = [context.Process(target=_search_at_once, args=(tmp_path, start, answers))
                for _ in range(2)]
    for process in searches:
        process.start()
    (launched_a, rows_a), (launched_b, rows_b) = answers.get(timeout=120), answers.get(
        timeout=120)
    for process in searches:
        process.join()
    assert [p.exitcode for p in searches] == [0, 0]
    # Three layouts, each launched once in all: by one search, read from the file by the other.
    assert len(launches(tmp_path)) == 3 == len(set(launches(tmp_path)))
    assert launched_a + launched_b == 3
    recorded = read_measurements(tmp_path / "measurements.csv")
    assert len(recorded) == 3 and list(recorded["status"]) == ["ok"] * 3
    assert rows_a == rows_b and len(rows_a) == 3
    assert sorted(row["step_time_s"] for row in rows_a) == sorted(recorded["step_time_s"])
    assert list(claims_folder(tmp_path / "measurements.csv").iterdir()) == []


def first_launch(tmp_path: Path) -> dict:
    """The row a one-layout search of SMALL_JOB measures (measured in a folder of its own)."""
    layoutsearch.search(cost_model=fake_measured_model(tmp_path / "first", top_k=1),
                        **SMALL_JOB)
    (row,) = MeasurementFile(tmp_path / "first" / "measurements.csv").runs()
    return row


def write_claim(measurements: Path, row: dict, pid: int, host: str, age_s: float = 0) -> Path:
    """A claim on `row`'s layout as a search with `pid` on `host` writes it, stamped
    `age_s` ago."""
    path = LayoutClaim(MeasurementFile(measurements), row, "", since=0, retry=()).path
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "host": host, "token": "by hand", "trial": ""}))
    stamped = time.time() - age_s
    os.utime(path, (stamped, stamped))
    return path


def gone_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()  # reaped: its pid names no process
    return process.pid


@pytest.mark.parametrize("where", ["this host, its pid gone", "another host, stale",
                                   "this process, left behind"])
def test_a_claim_whose_search_is_gone_is_taken_over(tmp_path, capsys, where):
    row = first_launch(tmp_path)
    measurements = tmp_path / "shared" / "measurements.csv"
    measurements.parent.mkdir()
    if where == "this host, its pid gone":
        pid, host, age_s = gone_pid(), HOST, 0.0
        why = f"pid {pid} on host {HOST}, which claimed it, is gone"
    elif where == "this process, left behind":
        # A notebook's search whose claim a second Ctrl-C kept from being removed: a later
        # search of the same kernel does not wait for itself.
        pid, host, age_s = os.getpid(), HOST, 0.0
        why = f"pid {pid} on host {HOST} (this process), which claimed it, left it behind"
    else:
        pid, host, age_s = 4242, "gpu-node-17", STALE_S + 60
        why = "pid 4242 on host gpu-node-17, which claimed it, has not stamped its claim for 11 min"
    claim = write_claim(measurements, row, pid, host, age_s)
    capsys.readouterr()
    model = fake_measured_model(tmp_path / "shared", top_k=1)
    layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert model.launched == 1
    told = [line for line in capsys.readouterr().err.splitlines() if "claimed it" in line]
    assert len(told) == 1
    assert re.fullmatch(rf"local: llama_7b_\S+: {re.escape(why)}; launching it here", told[0])
    assert not claim.exists()  # the row is written: the claim taken over is let go


def test_a_claim_that_cannot_be_read_is_judged_by_its_stamp(tmp_path, monkeypatch):
    # Another user's claim, written under umask 077: the search that met it could not read
    # it and launched the layout unclaimed, beside the other search's run of it, instead
    # of judging the claim by its time.
    row = first_launch(tmp_path)
    measurements = tmp_path / "shared.csv"
    claim = write_claim(measurements, row, 4242, "gpu-node-17")
    read_bytes = Path.read_bytes

    def refused(path):
        if path == claim:
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", refused)
    other = LayoutClaim(MeasurementFile(measurements), row, "local: a trial", since=0,
                        retry=())
    holder = other.take()
    assert isinstance(holder, Claimant) and holder.pid is None
    assert holder.gone(time.time()) == ""  # stamped now: its search may be running
    assert "has not stamped its claim for 11 min" in holder.gone(time.time() + STALE_S + 60)


def ended_unreaped() -> subprocess.Popen:
    """A process that has ended but that its parent (this one) has not waited for yet: a
    zombie, as a search killed while the script that started it waits for another is."""
    process = subprocess.Popen([sys.executable, "-c", ""])
    deadline = time.time() + 30
    while Path(f"/proc/{process.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        assert time.time() < deadline
        time.sleep(0.01)
    return process


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc")
def test_a_claim_whose_search_ended_unreaped_is_taken_over(tmp_path, capsys):
    # Its pid still answers kill(0): judged alive, the claim was waited for as long as the
    # parent of the dead search did not reap it (for ever, where that parent waits for the
    # search that waits).
    row = first_launch(tmp_path)
    zombie = ended_unreaped()
    try:
        claim = write_claim(tmp_path / "runs.csv", row, zombie.pid, HOST)
        capsys.readouterr()
        taker = LayoutClaim(MeasurementFile(tmp_path / "runs.csv"), row, "local: a trial",
                            since=0, retry=())
        assert taker.take() is None and taker.held
    finally:
        zombie.wait()
    assert capsys.readouterr().err == (f"local: a trial: pid {zombie.pid} on host {HOST}, "
                                       "which claimed it, is gone; launching it here\n")
    assert json.loads(claim.read_text())["token"] == taker.token
    taker.release()
    assert not claim.exists()


WAITING_SEARCH = """
import json
import sys
import layoutsearch
from layoutsearch.costs import claims
from layoutsearch.testing import fake_measured_model
claims.POLL_S = 0.05
model = fake_measured_model(sys.argv[1], top_k=int(sys.argv[3]))
model.retry = tuple(json.loads(sys.argv[2]))
ranked = layoutsearch.search(cost_model=model, model="llama_7b", num_gpus=8, seq_length=2048,
                             global_batch_size=64)
measured = ranked[ranked["measured_status"].fillna("") != ""]
print(json.dumps({"launched": model.launched, "rows": measured[
    ["measured_status", "step_time_s", "reason"]].to_dict("records")}))
"""


def read_until(stream, text: str, seconds: float = 60) -> list[str]:
    """Lines of `stream` up to the first that holds `text` (all of them if none does)."""
    lines: list[str] = []
    deadline = time.time() + seconds
    while time.time() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if text in line:
            break
    return lines


@dataclasses.dataclass
class SearchBesideAClaim:
    process: subprocess.Popen
    """WAITING_SEARCH of SMALL_JOB, started while `claimant` held a claim."""
    told: list[str]
    """Its lines up to the first that says it waits."""
    claimant: int
    """The pid of the live process holding the claim."""
    claim: Path


@contextlib.contextmanager
def search_beside_a_claim(shared: Path, claimed_row: dict, *, top_k: int,
                          retry: list[str]) -> Iterator[SearchBesideAClaim]:
    """A search of `shared`'s measurement file in a process of its own (WAITING_SEARCH),
    started while a live process claims `claimed_row`'s layout, once it has said that it
    waits; both processes are ended when the block does."""
    claimant = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    claim = write_claim(shared / "measurements.csv", claimed_row, claimant.pid, HOST)
    search = subprocess.Popen([sys.executable, "-c", WAITING_SEARCH, str(shared),
                               json.dumps(retry), str(top_k)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield SearchBesideAClaim(process=search, told=read_until(search.stderr, "waiting for it"),
                                 claimant=claimant.pid, claim=claim)
    finally:
        for process in (search, claimant):
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.mark.parametrize("case", ["a run the file lacks", "a failure to launch again"])
def test_a_layout_another_live_search_measures_is_waited_for_and_its_row_used(tmp_path, case):
    row = first_launch(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    measurements = MeasurementFile(shared / "measurements.csv")
    retry = []
    if case == "a failure to launch again":
        # The file holds a crash of the layout, and both searches retry errors: the run
        # that the other search records is the one to use, whatever its status, not one
        # to launch a third time.
        retry = ["error"]
        crash = {**row, "status": "error", "step_time_s": math.nan, "mfu": math.nan}
        measurements.append({**crash, "message": "the first crash"})
        row = {**crash, "message": "crashed again"}
    with search_beside_a_claim(shared, row, top_k=1, retry=retry) as search:
        assert re.fullmatch(
            rf"local: llama_7b_\S+: waiting for it, being measured by pid {search.claimant} on "
            rf"host {re.escape(HOST)} \(stamped \d\d:\d\d:\d\d\); its row is read from "
            rf"{re.escape(str(measurements.path))} once written", search.told[-1]), search.told
        time.sleep(0.3)  # it reads the file a few times, and still waits
        assert search.process.poll() is None and launches(shared) == []
        measurements.append(row)  # the other search's run ends
        out, err = search.process.communicate(timeout=60)
    assert search.process.returncode == 0, err
    answer = json.loads(out)
    assert answer["launched"] == 0 and launches(shared) == []
    (measured,) = answer["rows"]
    assert measured["measured_status"] == row["status"]
    if row["status"] == "ok":
        assert measured["step_time_s"] == pytest.approx(row["step_time_s"])
        assert f": ok, {row['step_time_s']:.2f} s per step, measured by another search, read " \
               f"from {measurements.path} (log {row['log_path']})" in err
    else:
        assert measured["reason"].startswith("measured error: crashed again")
    assert search.claim.exists()  # the other search's claim, which it removes itself


def test_a_search_launches_its_other_layouts_before_waiting_for_one_another_measures(
        tmp_path):
    # Searches sharing a file queued behind each other's claims: the second of two waited
    # for the first's launch of the best layout before launching its own second best, so
    # two searches took as long as one after the other.
    best = first_launch(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    measurements = MeasurementFile(shared / "measurements.csv")
    with search_beside_a_claim(shared, best, top_k=2, retry=[]) as search:
        told = search.told
        passed_over = [line for line in told if "launching the others first" in line]
        assert len(passed_over) == 1 and re.fullmatch(
            rf"local: launch 1 of 2: llama_7b_\S+: being measured by pid {search.claimant} on "
            rf"host {re.escape(HOST)}; launching the others first, then reading its row from "
            rf"{re.escape(str(measurements.path))}", passed_over[0]), told
        # Waiting for the best only now, its second layout already measured and recorded.
        assert "waiting for it" in told[-1] and told.index(passed_over[0]) < len(told) - 1
        (second,) = measurements.runs()
        assert launches(shared) != [] and len(launches(shared)) == 1
        assert measurement_key(second) != measurement_key(best)
        measurements.append(best)  # the other search's run of the best ends
        out, err = search.process.communicate(timeout=60)
    assert search.process.returncode == 0, err
    answer = json.loads(out)
    assert answer["launched"] == 1 and len(launches(shared)) == 1
    assert sorted(row["step_time_s"] for row in answer["rows"]) == pytest.approx(
        sorted([best["step_time_s"], second["step_time_s"]]))
    assert f": ok, {best['step_time_s']:.2f} s per step, measured by another search" in err


def test_a_waiting_search_reads_the_row_once_the_claim_is_gone_not_at_its_next_poll(
        tmp_path, monkeypatch):
    # The file was read every POLL_S (5 s) alone: each layout waited for cost up to that
    # after its row was written, the last one of a search sharing its file included.
    monkeypatch.setattr("layoutsearch.costs.claims.POLL_S", 60.0)
    row = first_launch(tmp_path)
    measurements = MeasurementFile(tmp_path / "shared.csv")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        claim = write_claim(measurements.path, row, sleeper.pid, HOST)

        def other_search_ends() -> None:  # its row is written, then its claim removed
            time.sleep(0.5)
            measurements.append(row)
            claim.unlink()

        ends = threading.Thread(target=other_search_ends)
        waiter = LayoutClaim(measurements, row, "local: a trial", since=0, retry=())
        started = time.monotonic()
        ends.start()
        recorded = waiter.acquire()
        waited_s = time.monotonic() - started
        ends.join()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert recorded is not None and recorded["step_time_s"] == pytest.approx(row["step_time_s"])
    assert 0.5 <= waited_s < 10  # well before the next read of the file, 60 s on
    assert not waiter.held


def test_the_last_layout_to_launch_that_another_search_measures_is_waited_for_at_once(
        tmp_path):
    # Two searches of the same layouts each ended saying of the last one the other held
    # "launching the others first", with none left to launch, then waited for it.
    both = tmp_path / "both"
    layoutsearch.search(cost_model=fake_measured_model(both, top_k=2), **SMALL_JOB)
    best, last = MeasurementFile(both / "measurements.csv").runs()
    shared = tmp_path / "shared"
    shared.mkdir()
    measurements = MeasurementFile(shared / "measurements.csv")
    with search_beside_a_claim(shared, last, top_k=2, retry=[]) as search:
        told = search.told
        assert re.fullmatch(r"local: launch 2 of 2: llama_7b_\S+: waiting for it, being "
                            rf"measured by pid {search.claimant} on host {re.escape(HOST)} .*",
                            told[-1]), told
        assert not [line for line in told if "launching the others first" in line], told
        (launched,) = measurements.runs()
        assert measurement_key(launched) == measurement_key(best)
        measurements.append(last)  # the other search's run ends
        out, err = search.process.communicate(timeout=60)
    assert search.process.returncode == 0, err
    assert json.loads(out)["launched"] == 1 and len(launches(shared)) == 1


class SeesItsClaim:
    """A launcher that notes the claims beside the file while its trial runs, then ends
    the trial as the wrapped launcher does, or as Ctrl-C does."""

    def __init__(self, inner, claims: Path, interrupted: bool) -> None:
        self.inner, self.name, self.trains = inner, inner.name, inner.trains
        self.claims, self.interrupted = claims, interrupted
        self.seen: list[list[str]] = []

    def __getattr__(self, name):
        if name == "inner":  # not set yet (a copy being made): no endless recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def run(self, trial):
        self.seen.append([json.loads(p.read_text())["pid"] for p in self.claims.iterdir()])
        if self.interrupted:
            raise KeyboardInterrupt  # as a launcher does once it stopped its trial
        return self.inner.run(trial)


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_launch_holds_its_claim_while_it_runs_and_lets_it_go_after(tmp_path, interrupted):
    model = fake_measured_model(tmp_path, top_k=2)
    claims = claims_folder(model.file.path)
    model.launcher = SeesItsClaim(model.launcher, claims, interrupted)
    if interrupted:
        with pytest.raises(KeyboardInterrupt):
            layoutsearch.search(cost_model=model, **SMALL_JOB)
    else:
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    # One claim, this search's, while each trial ran; none once it ended, row or not.
    assert model.launcher.seen == [[os.getpid()]] * (1 if interrupted else 2)
    assert list(claims.iterdir()) == []
    assert len(MeasurementFile(model.file.path).runs()) == (0 if interrupted else 2)


def test_a_ctrl_c_as_a_claim_is_removed_waits_until_it_is_gone(tmp_path, monkeypatch):
    # Pressed again as the claim of a trial stopped by Ctrl-C was being removed, it left the
    # claim of a live process (a notebook's kernel): every other search of this machine
    # waited for a run nobody was making, for as long as the kernel ran.
    model = fake_measured_model(tmp_path, top_k=1)
    claims = claims_folder(model.file.path)
    model.launcher = SeesItsClaim(model.launcher, claims, interrupted=True)
    unlink = Path.unlink
    pressed: list[Path] = []

    def pressed_first(path, *args, **kwargs):
        if path.parent == claims and path.suffix == ".json" and not pressed:
            pressed.append(path)
            signal.raise_signal(signal.SIGINT)
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", pressed_first)
    with pytest.raises(KeyboardInterrupt):
        layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert len(pressed) == 1 and model.launcher.seen == [[os.getpid()]]
    assert list(claims.iterdir()) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_search_that_cannot_claim_launches_unclaimed_and_says_so(tmp_path, capsys):
    # Where the claims cannot be written (a file in the way here; another user's folder it
    # may not enter, elsewhere), removing the claim's temporary file failed too, and that
    # error stopped the search instead of the launch going on unclaimed.
    measurements = tmp_path / "measurements.csv"
    claims_folder(measurements).write_text("")
    model = fake_measured_model(tmp_path, top_k=1)
    layoutsearch.search(cost_model=model, **SMALL_JOB)
    assert model.launched == 1 and len(MeasurementFile(measurements).runs()) == 1
    (told,) = [line for line in capsys.readouterr().err.splitlines() if "claim" in line]
    assert re.fullmatch(
        rf"local: llama_7b_\S+: cannot claim it in {re.escape(str(claims_folder(measurements)))} "
        rf"\(\[Errno 17\] File exists: .+\); launching it unclaimed, so a search sharing "
        rf"{re.escape(str(measurements))} may launch it too", told), told


def test_a_claim_is_stamped_while_its_launch_runs_and_judged_by_its_stamp(tmp_path):
    row = first_launch(tmp_path)
    claim = LayoutClaim(MeasurementFile(tmp_path / "runs.csv"), row, "local: a trial", since=0,
                        retry=())
    assert claim.take() is None and claim.held  # nobody held it: this search does now
    long_ago = time.time() - STALE_S - 60
    os.utime(claim.path, (long_ago, long_ago))
    other = LayoutClaim(claim.file, row, "local: another", since=0, retry=())
    holder = other.take()  # this process runs: its claim is live, whatever its stamp says
    assert holder is not None and not isinstance(holder, dict)
    assert (holder.pid, holder.host) == (os.getpid(), HOST)
    claim.stamp()
    assert time.time() - claim.path.stat().st_mtime < 60
    claim.release()
    assert not claim.path.exists() and other.take() is None
    other.release()
