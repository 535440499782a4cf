"""Megatron-LM checkouts for the tests of the checkout's own argument checks: folders with a
`pretrain_gpt.py` and an arguments module written by the test (real argparse parsers, `assert`
rules and prints shaped as Megatron-LM's)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from layoutsearch.testing import FAKE_MEGATRON_PATH

MICRO_BATCH_1_ONLY = '''
import argparse
import os


def parse_args(extra_args_provider=None, ignore_unknown_args=False):
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    parser.add_argument("--micro-batch-size", type=int)
    args, _ = parser.parse_known_args()  # every other flag of the command is taken
    args.world_size = int(os.getenv("WORLD_SIZE", "1"))
    return args


def validate_args(args, defaults={}):
    print("------------------------ arguments ------------------------")
    assert args.micro_batch_size == 1, (
        f"this checkout trains micro-batch 1 only, got {args.micro_batch_size}")
'''
"""A checkout that takes every flag layoutsearch writes and has one rule the copy of
Megatron-LM's rules lacks: micro-batch 1 only."""
KNOWS_NO_FLAG = '''
import argparse


def parse_args(extra_args_provider=None, ignore_unknown_args=False):
    return argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False).parse_args()


def validate_args(args, defaults={}):
    pass
'''
"""A checkout whose parse_args knows none of the flags: as one far older than the commands."""


def write_checkout(folder: Path, arguments: str,
                   module: str = "megatron/training/arguments.py") -> Path:
    """`folder` as a checkout: the fake `pretrain_gpt.py` (layoutsearch.testing) and
    `arguments` as its arguments module."""
    path = folder / module
    path.parent.mkdir(parents=True)
    path.write_text(textwrap.dedent(arguments))
    shutil.copy(FAKE_MEGATRON_PATH / "pretrain_gpt.py", folder / "pretrain_gpt.py")
    return folder
