"""Write Megatron-LM settings that run the fake Megatron-LM, to try a measured search on a CPU.

    python -m layoutsearch.testing fake_megatron.yaml [--inject 2=crash,3=oom]
    layoutsearch model=llama_7b num_gpus=8 global_batch_size=256 cost_models=measured \\
        cost_models.megatron=fake_megatron.yaml cost_models.top_k=3

The fake prints real-format Megatron-LM logs priced by the analytic model (one node, the
`local` launcher); its logs and launch list go beside the settings file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from layoutsearch.errors import LayoutSearchError
from layoutsearch.paths import unwritable_file
from layoutsearch.testing import fake_megatron_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m layoutsearch.testing", description=__doc__.splitlines()[0])
    parser.add_argument("settings", type=Path, help="YAML file to write the settings to")
    parser.add_argument("--inject", default="", help=(
        "launches to fail, by number from 1: '2=crash,3=hang,4=nccl,5=oom' ('*' = every one)"))
    parser.add_argument("--sleep-s", type=float, default=0.0,
                        help="seconds the fake sleeps after each iteration (default 0)")
    args = parser.parse_args(argv)
    target = args.settings.resolve()
    problem = unwritable_file(target)
    if problem:
        print(f"python -m layoutsearch.testing: {str(args.settings)!r} {problem}",
              file=sys.stderr)
        return 2
    try:
        settings = fake_megatron_settings(target.parent, inject=args.inject,
                                          sleep_s=args.sleep_s)
    except LayoutSearchError as error:
        print(f"python -m layoutsearch.testing: {error}", file=sys.stderr)
        return 2
    target.write_text(
        "# Megatron-LM settings for layoutsearch's fake Megatron-LM (python -m "
        "layoutsearch.testing):\n# runs on a CPU, prices each run with the analytic model.\n"
        + yaml.safe_dump(settings.to_record(), sort_keys=False))
    print(f"wrote {args.settings}: use it as cost_models.megatron={args.settings} with "
          "cost_models=measured (one node: the local launcher)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
