"""Write Megatron-LM settings that run the fake Megatron-LM, to try a measured search on a CPU.

    python -m layoutsearch.testing fake_megatron.yaml [--inject 2=crash,3=oom] [--gpu h100_sxm]
    layoutsearch model=llama_7b num_gpus=8 global_batch_size=256 cost_models=measured \\
        cost_models.megatron=fake_megatron.yaml \\
        cost_models.measurements=fake_measurements.csv cost_models.top_k=3

The fake prints real-format Megatron-LM logs priced by the analytic model (one node, the
`local` launcher); its logs and launch list go beside the settings file. Its figures are the
analytic model's, not measurements: keep them in a file of their own, away from the
`measurements.csv` a real measured search reads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.errors import LayoutSearchError
from layoutsearch.paths import unwritable_file
from layoutsearch.testing import FAILURE_KINDS, LAUNCHES_FILE, fake_megatron_settings

PROG = "python -m layoutsearch.testing"
MEASUREMENTS_FILE = "fake_measurements.csv"
"""The measurement file the printed command names, beside the settings."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    # A string, not a Path: Path drops the trailing slash that says "a folder".
    parser.add_argument("settings", help="YAML file to write the settings to")
    parser.add_argument("--inject", default="", help=(
        "launches to fail, by number from 1 counted from this command on: '2=crash,3=oom' "
        f"('*' = every one; kinds {', '.join(FAILURE_KINDS)})"))
    parser.add_argument("--sleep-s", type=float, default=0.0,
                        help="seconds the fake sleeps after each iteration (default 0)")
    parser.add_argument("--gpu", default="a100_80gb", help=(
        "the GPU the fake runs on, as the job's cluster=... names it (default a100_80gb): "
        "its runs are priced for that GPU"))
    args = parser.parse_args(argv)
    problem = unwritable_file(args.settings)
    if problem:
        print(f"{PROG}: {args.settings!r} {problem}", file=sys.stderr)
        return 2
    target = Path(args.settings).resolve()
    try:
        settings = fake_megatron_settings(target.parent, inject=args.inject,
                                          sleep_s=args.sleep_s, gpu=args.gpu)
    except LayoutSearchError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    target.parent.mkdir(parents=True, exist_ok=True)
    # Launch numbers (--inject) count from 1 for these settings.
    (target.parent / LAUNCHES_FILE).unlink(missing_ok=True)
    target.write_text(
        f"# Megatron-LM settings for layoutsearch's fake Megatron-LM ({PROG}):\n"
        "# runs on a CPU and prices each run with the analytic model.\n"
        + yaml.safe_dump(settings.to_record(), sort_keys=False))
    measurements = target.parent / MEASUREMENTS_FILE
    print(f"wrote {target}; search with it (one node: the local launcher):\n"
          f"  layoutsearch cluster={clusters_by_gpu()[args.gpu].name} ... "
          f"cost_models=measured cost_models.megatron={target} "
          f"cost_models.measurements={measurements}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
