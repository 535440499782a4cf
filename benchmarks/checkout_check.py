"""Do the commands layoutsearch emits pass a Megatron-LM checkout's own argument checks?

Puts the commands of ranked layouts to the checkout's `parse_args` and `validate_args`, run
by its Python on this machine's CPU (layoutsearch/megatron/checkout_check.py), and to
layoutsearch's copy of Megatron-LM's rules (megatron/validation.py), and counts where either
rejects and where they disagree:

- the study's five jobs (paper space, vocabulary 128000, 2^22 tokens a step): the five best
  layouts of each, the commands `emit=megatron top_k=5` writes;
- every layout that fits of llama_13b at 2k on 64 GPUs (paper space);
- the 20 best layouts of four catalog models on H100 in the `default` space (vp, cp,
  the distributed optimizer, every recompute granularity, uneven pipeline stages).

    python benchmarks/checkout_check.py --megatron-lm PATH [--python PYTHON]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import layoutsearch
from layoutsearch.layout import Layout
from layoutsearch.megatron import build_command
from layoutsearch.megatron.checkout_check import CheckoutCheck
from layoutsearch.megatron.settings import MegatronSettings
from layoutsearch.megatron.validation import validate_argv
from layoutsearch.results import job_of

STUDY_JOBS = (("llama_13b", 2048, 64), ("llama_13b", 8192, 128), ("llama_30b", 2048, 256),
              ("llama_30b", 8192, 128), ("llama_65b", 2048, 128))
TOKENS_PER_STEP = 2**22
DEFAULT_SPACE_JOBS = (("llama3_8b", 8192, 256, 512), ("llama3_70b", 8192, 512, 1024),
                      ("llama3_405b", 8192, 1024, 2048), ("gpt3_175b", 2048, 1024, 2048))
"""(model, sequence length, GPUs, global batch): gpt3_175b's learned positions stop at 2048."""


def ranked_commands(settings: MegatronSettings, top: int | None, **job: Any,
                    ) -> Iterator[tuple[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ranked = layoutsearch.search(megatron=settings.to_record(), **job)
    built = job_of(ranked, "checkout_check benchmark")
    fitting = ranked[ranked["fits"].astype(bool)]
    for row in (fitting if top is None else fitting.head(top)).to_dict("records"):
        layout = Layout.from_row(row)
        yield layout.describe(), build_command(layout, built, settings)


def groups(settings: MegatronSettings) -> Iterator[tuple[str, Iterator[tuple[str, Any]]]]:
    for model, seq, gpus in STUDY_JOBS:
        yield (f"study {model} {seq // 1024}k {gpus} GPUs, top 5",
               ranked_commands(settings, 5, model=model, seq_length=seq, num_gpus=gpus,
                               global_batch_size=TOKENS_PER_STEP // seq, vocab_size=128000,
                               search_space="paper"))
    yield ("llama_13b 2k 64 GPUs, every layout that fits",
           ranked_commands(settings, None, model="llama_13b", seq_length=2048, num_gpus=64,
                           global_batch_size=2048, vocab_size=128000, search_space="paper"))
    for model, seq, gpus, batch in DEFAULT_SPACE_JOBS:
        yield (f"default space {model} {seq // 1024}k {gpus} GPUs h100, top 20",
               ranked_commands(settings, 20, model=model, seq_length=seq, num_gpus=gpus,
                               global_batch_size=batch, cluster="h100_sxm",
                               search_space="default"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megatron-lm", type=Path, required=True,
                        help="a Megatron-LM checkout (holds megatron/training/arguments.py)")
    parser.add_argument("--python", default="python",
                        help="the Python that imports it (torch, megatron.core)")
    args = parser.parse_args()
    settings = MegatronSettings(megatron_path=str(args.megatron_lm), python=args.python,
                                validate_args=True)
    started = time.perf_counter()
    timings: list[float] = []  # s, of each distinct command's check
    seen: set[tuple[Any, ...]] = set()
    total = {"commands": 0, "passed": 0, "rejected": 0, "ours rejects": 0, "disagree": 0}
    with CheckoutCheck(settings) as check:
        for title, commands in groups(settings):
            counts = dict.fromkeys(total, 0)
            shown: list[str] = []
            for label, command in commands:
                # Layouts that run as one command (flash1 and flash2, say) are checked once.
                key = (command.argv, tuple(sorted(command.env.items())))
                before = time.perf_counter()
                verdict = check.verdict(command, command.env)
                if key not in seen:
                    seen.add(key)
                    timings.append(time.perf_counter() - before)
                assert verdict is not None  # validate_args=True asks, or stops
                ours = [p for p in validate_argv(command.argv, env=command.env,
                                                 world_size=command.num_gpus)
                        if p.severity == "error"]
                rejected = verdict.outcome == "rejected"
                counts["commands"] += 1
                counts["passed"] += verdict.outcome == "passed"
                counts["rejected"] += rejected
                counts["ours rejects"] += bool(ours)
                if rejected != bool(ours):
                    counts["disagree"] += 1
                    if len(shown) < 3:
                        shown.append(f"    {label}: checkout {verdict.outcome} {verdict}; ours "
                                     f"{ours[0] if ours else 'passes'}")
            for key in total:
                total[key] += counts[key]
            print(f"{title}: " + ", ".join(f"{key} {n}" for key, n in counts.items()))
            for line in shown:
                print(line)
        print(f"checkout: {check.module}")
    first, rest = timings[0], timings[1:]
    print("all: " + ", ".join(f"{key} {n}" for key, n in total.items()))
    print(f"time: first check {first:.2f} s (starts the process, imports Megatron-LM); "
          f"then median {1000 * statistics.median(rest):.2f} ms a command, "
          f"{len(timings)} distinct commands; "
          f"{time.perf_counter() - started:.0f} s in all with the searches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
