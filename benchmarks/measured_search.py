"""The measured cost model end to end on the fake Megatron-LM (issue 4's first target).

The fake `pretrain_gpt.py` and torchrun (`layoutsearch.testing`) print real-format Megatron-LM
logs priced by the analytic model, so the whole measured path runs on a CPU: prescreen,
launch, log parsing, the measurement file, failures and resume. Three parts, one job (the
study's llama_13b, 64 A100 80GB, 2k sequence, global batch 2048, the paper space):

1. an analytic search, then a measured search with `top_k` launches where the 2nd launch
   crashes, the 3rd hangs past its wall-clock limit and the 4th runs out of memory: same best
   layout?, launches, the status recorded for each;
2. a measured search killed with SIGKILL once some rows are recorded, then started again:
   what was recorded before the kill, what the restart launched, and whether any recorded
   layout was launched again (the trial in flight at the kill stops with the search and,
   having no row, is measured again);
3. the same measured search alone on a file of its own, then two of them started at once on
   one measurement file (a parallel multirun, two notebooks): how many launches between
   them and by each, whether any layout was launched twice, whether both answer with the
   same best layout, and the wall time beside the one search's.

    python benchmarks/measured_search.py [--top-k 8] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import layoutsearch
from layoutsearch.layout import LAYOUT_COLUMNS
from layoutsearch.measurements import read_measurements
from layoutsearch.reporting.explain import label
from layoutsearch.testing import fake_measured_model, launches

JOB = dict(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048,
           vocab_size=128000, search_space="paper")
INJECT = "2=crash,3=hang,4=oom"
HANG_TIMEOUT_S = 5.0
KILL_AFTER_ROWS = 2
RESUME_TOP_K = 4
SLEEP_PER_ITERATION_S = 0.4  # slows each fake launch to ~2.5 s so the kill lands mid-search
SHARED_SLEEP_PER_ITERATION_S = 1.0
"""~6 s a fake launch when two searches share a file: the launches, not the ~5 s each search
takes to start and prescreen, are most of the wall time, as with real trials of minutes to
hours."""


def failures_and_prescreen(workdir: Path, top_k: int) -> None:
    analytic = layoutsearch.search(**JOB)
    model = fake_measured_model(workdir, top_k=top_k, inject=INJECT, timeout_s=HANG_TIMEOUT_S)
    start = time.perf_counter()
    measured = layoutsearch.search(cost_model=model, **JOB)
    seconds = time.perf_counter() - start
    recorded = read_measurements(workdir / "measurements.csv")
    same = label(measured.iloc[0]) == label(analytic.iloc[0])
    print(f"== measured search, top_k={top_k}, injected {INJECT} (hang limit {HANG_TIMEOUT_S:g} s)")
    print(f"layouts in the space: {len(analytic)}; predicted to fit: {int(analytic['fits'].sum())}")
    print(f"analytic best: {label(analytic.iloc[0])}  MFU {analytic.iloc[0]['mfu']:.3f}")
    print(f"measured best: {label(measured.iloc[0])}  MFU {measured.iloc[0]['mfu']:.3f}"
          f"  -> same layout: {same}")
    print(f"launches: {len(launches(workdir))} (at most top_k={top_k}); wall time {seconds:.1f} s")
    for _, row in recorded.iterrows():
        note = f"  ({str(row['message']).splitlines()[0][:70]})" if row["status"] != "ok" else ""
        print(f"  {row['status']:8s} {label(row)}{note}")
    again_model = fake_measured_model(workdir, top_k=top_k)
    again = layoutsearch.search(cost_model=again_model, **JOB)
    print(f"the same search again over that file: {again_model.launched} launches, best "
          f"{label(again.iloc[0])}")


CHILD = """
import json
import sys
import layoutsearch
from layoutsearch.reporting.explain import label
from layoutsearch.testing import fake_measured_model
model = fake_measured_model(sys.argv[1], top_k=int(sys.argv[2]), sleep_s=float(sys.argv[3]))
ranked = layoutsearch.search(cost_model=model, **json.loads(sys.argv[4]))
print(model.launched, label(ranked.iloc[0]))
"""


def _search_argv(workdir: Path, sleep_s: float) -> list[str]:
    return [sys.executable, "-c", CHILD, str(workdir), str(RESUME_TOP_K), str(sleep_s),
            json.dumps(JOB)]


def kill_and_resume(workdir: Path) -> None:
    measurements = workdir / "measurements.csv"
    process = subprocess.Popen(_search_argv(workdir, SLEEP_PER_ITERATION_S),
                               start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if measurements.is_file() and len(measurements.read_text().splitlines()) > KILL_AFTER_ROWS:
            break
        time.sleep(0.05)
    # The search alone, as `kill -9 PID` would: its trial in flight gets SIGTERM from the
    # kernel (the local launcher's parent-death signal) and stops; give it a second to.
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    time.sleep(1.0)
    before = read_measurements(measurements)
    launched_before = launches(workdir)
    print(f"\n== SIGKILL after {len(before)} recorded rows (top_k={RESUME_TOP_K}); "
          f"{len(launched_before)} launches started before the kill")
    subprocess.run(_search_argv(workdir, 0.0), check=True, stdout=subprocess.DEVNULL)
    after = read_measurements(measurements)
    launched_after = launches(workdir)[len(launched_before):]
    recorded_commands = set(launched_before[: len(before)])
    relaunched = sum(command in recorded_commands for command in launched_after)
    # A trial in flight at the kill has no row: the restart measures it, as it should.
    in_flight = set(launched_before[len(before):])
    rerun_in_flight = sum(command in in_flight for command in launched_after)
    duplicates = int(after.duplicated(subset=list(LAYOUT_COLUMNS)).sum())
    print(f"restart: {len(launched_after)} launches ({rerun_in_flight} of them the trial in "
          f"flight at the kill), rows now {len(after)}, recorded layouts launched again: "
          f"{relaunched}, duplicate rows: {duplicates}")


def _searches_at_once(workdir: Path, count: int) -> tuple[list[str], float]:
    """`count` searches of the job started together on `workdir`'s file: each one's output
    line (its launches and best layout), and the wall time until the last ended."""
    start = time.perf_counter()
    searches = [subprocess.Popen(_search_argv(workdir, SHARED_SLEEP_PER_ITERATION_S),
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                for _ in range(count)]
    outputs = [search.communicate()[0].strip().splitlines()[-1] for search in searches]
    seconds = time.perf_counter() - start
    if any(search.returncode for search in searches):
        raise SystemExit(f"a search sharing the file failed: {[s.returncode for s in searches]}")
    return outputs, seconds


def two_at_once(workdir: Path) -> None:
    (_,), alone_s = _searches_at_once(workdir / "alone", 1)
    outputs, seconds = _searches_at_once(workdir / "shared", 2)
    launched = launches(workdir / "shared")
    rows = read_measurements(workdir / "shared" / "measurements.csv")
    duplicates = int(rows.duplicated(subset=list(LAYOUT_COLUMNS)).sum())
    each = [int(output.split(" ", 1)[0]) for output in outputs]
    bests = [output.split(" ", 1)[1] for output in outputs]
    print(f"\n== two searches at once on one file (top_k={RESUME_TOP_K} each)")
    print(f"launches: {len(launched)} in all ({' + '.join(map(str, each))}), layouts launched "
          f"twice: {len(launched) - len(set(launched))}; rows {len(rows)}, duplicate rows: "
          f"{duplicates}; both best {bests[0]}: {bests[0] == bests[1]}")
    print(f"wall time {seconds:.1f} s; one such search alone {alone_s:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the fake runs write (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = (args.workdir or Path(scratch)).resolve()
        failures_and_prescreen(root / "failures", args.top_k)
        kill_and_resume(root / "resume")
        two_at_once(root / "two")


if __name__ == "__main__":
    main()
