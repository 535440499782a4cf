"""Whether a change made the analytic model's scoring faster: this checkout against another,
their calls alternated.

On a shared machine one checkout's speed varies by a factor of 2 from hour to hour (and
from minute to minute), so two runs of benchmarks/speed.py a minute apart compare the
hours as much as the code. Here each checkout scores speed.py's 1.25M-row table in its own
worker process, and the calls alternate (ABAB, then BABA), so each pair runs under the
same load. It prints each side's median seconds and the median of the per-pair ratios.

    git worktree add /tmp/before HEAD~3   # or any checkout of layoutsearch
    python benchmarks/compare_scoring.py /tmp/before [--pairs 12] [--one-core]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
THIS_CHECKOUT = HERE.parent


def worker(one_core: bool) -> None:
    """Score the table once per line read from stdin, printing the seconds of each call."""
    # Imported here, once the worker's path puts the other checkout first.
    from speed import BIG_SPACE, big_job, on_one_core

    import layoutsearch
    from layoutsearch.catalog import clusters_by_gpu

    candidates, clusters = BIG_SPACE.candidates(big_job()), clusters_by_gpu()
    model = layoutsearch.build_cost_model("analytic")

    def timed() -> float:
        start = time.perf_counter()
        model.score(candidates, clusters)
        return time.perf_counter() - start

    timed()  # the first call pays the page faults of its arrays
    print(f"ready {layoutsearch.__file__}", flush=True)
    for _ in sys.stdin:
        seconds = on_one_core(timed) if one_core else timed()
        print(seconds, flush=True)


def start_worker(checkout: Path, one_core: bool) -> subprocess.Popen[str]:
    """A worker importing layoutsearch from `checkout` (first on its path) and this
    checkout's benchmarks/speed.py (the same table for both sides)."""
    code = (f"import sys; sys.path[:0] = [{str(checkout)!r}, {str(HERE)!r}]; "
            f"import compare_scoring; compare_scoring.worker({one_core})")
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    ready = process.stdout.readline().split()
    expected = str(checkout / "layoutsearch")
    if ready[:1] != ["ready"] or not ready[1].startswith(expected):
        process.kill()
        raise SystemExit(f"{checkout}: its worker imported {ready[1:] or 'nothing'}, not "
                         f"layoutsearch from {expected}")
    return process


def call(process: subprocess.Popen[str]) -> float:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("go\n")
    process.stdin.flush()
    return float(process.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="another checkout of layoutsearch")
    parser.add_argument("--pairs", type=int, default=12, help="alternated pairs of calls")
    parser.add_argument("--one-core", action="store_true",
                        help="hold each call to one core (its affinity mask)")
    args = parser.parse_args()
    other = args.other.resolve()
    if not (other / "layoutsearch" / "__init__.py").is_file():
        raise SystemExit(f"{other}: not a checkout of layoutsearch (no layoutsearch/__init__.py)")
    this, that = start_worker(THIS_CHECKOUT, args.one_core), start_worker(other, args.one_core)
    mine: list[float] = []
    theirs: list[float] = []
    for i in range(args.pairs):
        if i % 2 == 0:
            mine.append(call(this))
            theirs.append(call(that))
        else:
            theirs.append(call(that))
            mine.append(call(this))
    for process in (this, that):
        assert process.stdin is not None
        process.stdin.close()
        process.wait()
    ratios = [t / m for t, m in zip(theirs, mine, strict=True)]
    cores = "one core" if args.one_core else "all usable cores"
    print(f"score() of speed.py's table, {args.pairs} alternated pairs, {cores}:")
    print(f"  this checkout  {THIS_CHECKOUT}: median {statistics.median(mine):.3f} s")
    print(f"  other checkout {other}: median {statistics.median(theirs):.3f} s")
    print(f"  other / this, per pair: median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}); above 1: this one is faster")


if __name__ == "__main__":
    main()
