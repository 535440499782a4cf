"""The checkout's own parse_args and validate_args, asked of each command before it is launched
or written (layoutsearch/megatron/checkout_check.py, checkout_worker.py).

The checkouts here are folders with a `megatron/training/arguments.py` written by the test:
real argparse parsers and `assert` rules shaped as Megatron-LM's (its parse_args reads RANK
and WORLD_SIZE, its validate_args prints, asserts, and exit()s on a removed flag).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from layoutsearch.errors import LayoutSearchError
from layoutsearch.megatron.args import MegatronCommand
from layoutsearch.megatron.checkout_check import CheckoutCheck
from layoutsearch.megatron.settings import MegatronSettings
from tests.checkouts import write_checkout

TORCH_WITHOUT_A_GPU = '''
"""torch on a machine without a GPU, as far as validate_args asks it."""
import types

def _no_driver(*args, **kwargs):
    raise RuntimeError("Found no NVIDIA driver on your system.")

cuda = types.SimpleNamespace(is_available=lambda: False, get_device_properties=_no_driver,
                             get_device_capability=_no_driver)
device = str
'''
ARGUMENTS = '''
import argparse
import os

import torch

with open("imports.log", "a") as log:  # in the checkout: the worker runs there
    log.write("imported\\n")


def parse_args(extra_args_provider=None, ignore_unknown_args=False):
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    parser.add_argument("--tensor-model-parallel-size", type=int, default=1)
    parser.add_argument("--num-attention-heads", type=int, default=8)
    parser.add_argument("--checkpoint-activations", action="store_true")
    parser.add_argument("--tokenizer-type", default=None)
    args = parser.parse_args()
    args.rank = int(os.getenv("RANK", "0"))
    args.world_size = int(os.getenv("WORLD_SIZE", "1"))
    print("WARNING: The MSC feature is disabled.")
    return args


def validate_args(args, defaults={}):
    for key in defaults:
        if getattr(args, key, None) is None:
            setattr(args, key, defaults[key])
    print("using world size:", args.world_size)
    assert args.world_size % args.tensor_model_parallel_size == 0, (
        f"world size ({args.world_size}) is not divisible by tensor model parallel size "
        f"({args.tensor_model_parallel_size})")
    if args.checkpoint_activations:
        print("--checkpoint-activations is no longer valid, use --recompute-activations")
        exit()
    arch = torch.cuda.get_device_properties(torch.device("cuda:0")).major
    if args.tensor_model_parallel_size > 1 and arch < 10:
        assert os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1", (
            "Using tensor model parallelism requires setting CUDA_DEVICE_MAX_CONNECTIONS to 1")
    assert args.tokenizer_type == "GPT2BPETokenizer", args.tokenizer_type
    print("------------------------ arguments ------------------------")
'''


def checkout(tmp_path: Path, arguments: str = ARGUMENTS,
             module: str = "megatron/training/arguments.py", name: str = "Megatron-LM") -> Path:
    folder = write_checkout(tmp_path / name, arguments, module)
    (folder / "torch.py").write_text(TORCH_WITHOUT_A_GPU)
    return folder


def settings(folder: Path, validate_args: bool | str = "auto") -> MegatronSettings:
    return MegatronSettings(megatron_path=str(folder), python=sys.executable,
                            validate_args=validate_args)


def command(*argv: str, num_gpus: int = 8,
            compute_capability: tuple[int, int] | None = (8, 0)) -> MegatronCommand:
    return MegatronCommand(argv=argv, num_gpus=num_gpus, compute_capability=compute_capability)


def test_a_command_the_checkout_accepts_passes_and_its_prints_do_not_garble_the_answer(
        tmp_path):
    with CheckoutCheck(settings(checkout(tmp_path))) as check:
        verdict = check.verdict(command("--tensor-model-parallel-size", "2"),
                                {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
        assert check.module == str(tmp_path / "Megatron-LM/megatron/training/arguments.py")
    assert (verdict.outcome, verdict.stage, verdict.message) == ("passed", "validate_args", "")


def test_a_rule_of_validate_args_rejects_with_its_message_and_line(tmp_path):
    with CheckoutCheck(settings(checkout(tmp_path))) as check:
        verdict = check.verdict(command("--tensor-model-parallel-size", "3"), {})
    assert (verdict.outcome, verdict.stage) == ("rejected", "validate_args")
    assert verdict.message.startswith(
        "AssertionError: world size (8) is not divisible by tensor model parallel size (3) (")
    rule = next(n for n, line in enumerate(ARGUMENTS.splitlines(), 1)
                if "assert args.world_size %" in line)
    assert verdict.message.endswith(f"megatron/training/arguments.py:{rule})")


def test_world_size_and_environment_are_the_commands_and_each_check_starts_clean(tmp_path):
    """The environment of one command does not leak into the next one's check."""
    tp2 = command("--tensor-model-parallel-size", "2", num_gpus=16)
    with CheckoutCheck(settings(checkout(tmp_path))) as check:
        first = check.verdict(tp2, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
        second = check.verdict(tp2, {})
        odd = check.verdict(command("--tensor-model-parallel-size", "2", num_gpus=6),
                            {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert first.outcome == "passed"
    assert second.outcome == "rejected"
    assert "requires setting CUDA_DEVICE_MAX_CONNECTIONS to 1" in second.message
    assert odd.outcome == "passed"  # 6 GPUs divide by tp 2: WORLD_SIZE is the command's


def test_without_a_gpu_here_validate_args_is_answered_with_the_commands_gpu(tmp_path):
    """With tp > 1, validate_args asks torch for the GPU's architecture: before Blackwell
    (10) it needs CUDA_DEVICE_MAX_CONNECTIONS=1."""
    tp2 = ("--tensor-model-parallel-size", "2")
    with CheckoutCheck(settings(checkout(tmp_path))) as check:
        ampere = check.verdict(command(*tp2), {})
        blackwell = check.verdict(command(*tp2, compute_capability=(10, 0)), {})
        unknown = check.verdict(command(*tp2, compute_capability=None), {})
        after = check.verdict(command(*tp2, compute_capability=None, num_gpus=16), {})
    assert ampere.outcome == "rejected"
    assert "requires setting CUDA_DEVICE_MAX_CONNECTIONS to 1" in ampere.message
    assert blackwell.outcome == "passed"
    # No GPU named, none here: torch's own answer, which says nothing of the command.
    assert unknown.outcome == "unchecked"
    assert unknown.message.startswith("RuntimeError: Found no NVIDIA driver on your system. (")
    assert unknown.message.endswith("/Megatron-LM/torch.py:6)")
    assert after.outcome == "unchecked"  # torch.cuda was given back after each check


def test_a_flag_the_checkout_does_not_know_is_rejected_by_parse_args(tmp_path):
    """An older checkout than the commands' (no --attention-backend before 2025)."""
    with CheckoutCheck(settings(checkout(tmp_path))) as check:
        verdict = check.verdict(command("--attention-backend", "flash"), {})
    assert (verdict.outcome, verdict.stage) == ("rejected", "parse_args")
    assert verdict.message == ("pretrain_gpt.py: error: unrecognized arguments: "
                               "--attention-backend flash")


def test_a_value_the_checkouts_own_type_rejects_in_the_standard_library_is_rejected(
        tmp_path):
    """Megatron-LM parses --attention-backend with `lambda attn_backend:
    AttnBackend[attn_backend]`: in a checkout whose enum lacks the value, the KeyError is
    raised by Python's enum module, called by Megatron-LM's parser."""
    folder = checkout(tmp_path, ARGUMENTS.replace(
        '    parser.add_argument("--tokenizer-type", default=None)\n',
        '    parser.add_argument("--tokenizer-type", default=None)\n'
        '    parser.add_argument("--attention-backend", type=lambda attn_backend: '
        'AttnBackend[attn_backend])\n').replace(
        "import argparse\n", "import argparse\nimport enum\n"
        "AttnBackend = enum.Enum('AttnBackend', 'flash fused unfused local')\n"))
    with CheckoutCheck(settings(folder)) as check:
        verdict = check.verdict(command("--attention-backend", "auto"), {})
    assert (verdict.outcome, verdict.stage) == ("rejected", "parse_args")
    rule = next(n for n, line in enumerate((folder / "megatron/training/arguments.py")
                                           .read_text().splitlines(), 1)
                if "--attention-backend" in line)
    assert verdict.message == (
        f"KeyError: 'auto' ({folder}/megatron/training/arguments.py:{rule})")


def test_a_removed_flag_that_validate_args_exits_on_is_rejected_with_what_it_printed(
        tmp_path):
    with CheckoutCheck(settings(checkout(tmp_path))) as check:
        verdict = check.verdict(command("--checkpoint-activations"), {})
    assert (verdict.outcome, verdict.stage) == ("rejected", "validate_args")
    assert verdict.message == ("--checkpoint-activations is no longer valid, use "
                               "--recompute-activations")


def test_the_worker_checks_on_after_validate_args_exits(tmp_path):
    """Python's exit() closes sys.stdin before it raises SystemExit; the worker read its
    requests from it, and died at the next one."""
    with CheckoutCheck(settings(checkout(tmp_path))) as check:
        check.verdict(command("--checkpoint-activations"), {})
        after = check.verdict(command("--tensor-model-parallel-size", "3"), {})
    assert (after.outcome, after.stage) == ("rejected", "validate_args")
    assert after.message.startswith("AssertionError: world size (8) is not divisible")


def test_one_process_imports_megatron_once_for_many_commands_and_answers_are_kept(tmp_path):
    folder = checkout(tmp_path)
    with CheckoutCheck(settings(folder)) as check:
        for tp in ("1", "2", "4", "1"):
            check.verdict(command("--tensor-model-parallel-size", tp),
                          {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
        check.close()
        again = check.verdict(command("--tensor-model-parallel-size", "2"),
                              {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})  # kept: no new process
        assert again.outcome == "passed"
        assert (folder / "imports.log").read_text() == "imported\n"
        check.verdict(command("--tensor-model-parallel-size", "8"),
                      {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert (folder / "imports.log").read_text() == "imported\n" * 2  # a new command, anew


def test_a_checkout_of_before_2024_keeps_its_arguments_module_in_megatron(tmp_path):
    folder = checkout(tmp_path, module="megatron/arguments.py")
    assert settings(folder).checks_in_checkout
    with CheckoutCheck(settings(folder)) as check:
        verdict = check.verdict(command("--tensor-model-parallel-size", "3"), {})
        assert check.module == str(folder / "megatron/arguments.py")
    assert verdict.outcome == "rejected"


def test_auto_asks_nothing_where_the_checkout_has_no_arguments_module_and_false_never(
        tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    assert CheckoutCheck(settings(bare)).verdict(command(), {}) is None
    folder = checkout(tmp_path)
    assert CheckoutCheck(settings(folder, validate_args=False)).verdict(command(), {}) is None
    assert not (folder / "imports.log").exists()


def test_without_torch_where_it_runs_auto_says_so_once_and_true_stops(tmp_path, capsys):
    folder = checkout(tmp_path, "import torch_that_is_not_installed\n" + ARGUMENTS)
    with CheckoutCheck(settings(folder)) as check:
        first = check.verdict(command("--tensor-model-parallel-size", "1"), {})
        check.verdict(command("--tensor-model-parallel-size", "2"), {})
    assert first.outcome == "unchecked"
    assert first.message == ("megatron.python cannot import it: ModuleNotFoundError: No module "
                             "named 'torch_that_is_not_installed'")
    said = capsys.readouterr().err
    assert said.count(f"note: Megatron-LM in {folder} could not check a command with its own "
                      "validate_args (megatron.python cannot import it: ") == 1
    with pytest.raises(LayoutSearchError, match=r"megatron.validate_args=true: Megatron-LM in "
                       r".* could not check the command with its own validate_args: "
                       r"megatron.python cannot import it: ModuleNotFoundError"):
        CheckoutCheck(settings(folder, validate_args=True)).verdict(command(), {})


def test_an_exception_from_outside_megatron_leaves_the_command_unchecked(tmp_path):
    """validate_args querying the GPU on a machine without one fails in torch, not in a rule."""
    folder = checkout(tmp_path, ARGUMENTS.replace(
        "def validate_args(args, defaults={}):\n",
        "def validate_args(args, defaults={}):\n    import cuda_query; cuda_query.arch()\n"))
    (folder / "cuda_query.py").write_text(
        "def arch():\n    raise RuntimeError('Found no NVIDIA driver on your system.')\n")
    with CheckoutCheck(settings(folder)) as check:
        verdict = check.verdict(command(), {})
    assert verdict.outcome == "unchecked"
    assert verdict.message.startswith("RuntimeError: Found no NVIDIA driver on your system. (")


def test_torchs_error_is_unchecked_though_a_folder_above_it_is_named_megatron(tmp_path):
    """~/megatron/venv/.../torch/cuda: the module that raised is torch, not Megatron-LM."""
    folder = checkout(tmp_path, name="megatron/Megatron-LM")
    tp2 = command("--tensor-model-parallel-size", "2", compute_capability=None)
    with CheckoutCheck(settings(folder)) as check:
        verdict = check.verdict(tp2, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert verdict.outcome == "unchecked"
    assert verdict.message.endswith("/megatron/Megatron-LM/torch.py:6)")


def test_a_rule_raised_for_a_package_missing_here_leaves_the_command_unchecked(tmp_path):
    """Megatron-LM's `raise RuntimeError('nvidia_resiliency_ext is required ...') from e`:
    the machine that trains may have the package."""
    folder = checkout(tmp_path, ARGUMENTS.replace(
        "def validate_args(args, defaults={}):\n",
        "def validate_args(args, defaults={}):\n"
        "    try:\n"
        "        import nvidia_resiliency_ext\n"
        "    except ModuleNotFoundError as e:\n"
        "        raise RuntimeError('nvidia_resiliency_ext is required for local "
        "checkpointing') from e\n"))
    with CheckoutCheck(settings(folder)) as check:
        verdict = check.verdict(command(), {})
    assert (verdict.outcome, verdict.stage) == ("unchecked", "validate_args")
    assert verdict.message.startswith(
        "RuntimeError: nvidia_resiliency_ext is required for local checkpointing (")


def test_a_check_past_its_time_limit_is_unchecked_and_its_process_stopped(tmp_path):
    folder = checkout(tmp_path, ARGUMENTS.replace(
        "def validate_args(args, defaults={}):\n",
        "def validate_args(args, defaults={}):\n    import time; time.sleep(60)\n"))
    with CheckoutCheck(settings(folder), check_timeout_s=1.0) as check:
        verdict = check.verdict(command(), {})
        assert check._process is None
    assert verdict.outcome == "unchecked"
    assert verdict.message == (f"{sys.executable} checkout_worker.py took over 1 s to check a "
                               "command")


def test_what_earlier_checks_printed_is_not_kept_nor_given_as_a_later_failures_cause(
        tmp_path):
    """Megatron-LM prints every argument of each command (34 kB): a search checking
    thousands of commands kept them all in the worker's log, whose last line was quoted as
    the reason of a later check that failed."""
    folder = checkout(tmp_path, ARGUMENTS.replace(
        "def validate_args(args, defaults={}):\n",
        "def validate_args(args, defaults={}):\n"
        "    if args.tensor_model_parallel_size == 4:\n"
        "        import time; time.sleep(60)\n"))
    with CheckoutCheck(settings(folder), check_timeout_s=1.0) as check:
        first = check.verdict(command(), {})
        hung = check.verdict(command("--tensor-model-parallel-size", "4"), {})
    assert first.outcome == "passed"
    assert hung.message == (f"{sys.executable} checkout_worker.py took over 1 s to check a "
                            "command")


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_what_a_python_wrapper_says_on_stdout_before_the_worker_starts_is_passed_over(
        tmp_path):
    """A site's `python` (a module system's wrapper) may say something first."""
    wrapper = executable(tmp_path / "python", f'#!/bin/sh\necho "Loading torch/2.4"\n'
                                              f'exec {sys.executable} "$@"\n')
    folder = checkout(tmp_path)
    with CheckoutCheck(settings(folder).replace(python=str(wrapper))) as check:
        verdict = check.verdict(command("--tensor-model-parallel-size", "3"), {})
    assert (verdict.outcome, verdict.stage) == ("rejected", "validate_args")


def test_an_answer_that_is_no_json_object_stops_the_worker_and_leaves_it_unchecked(tmp_path):
    """A worker that writes its ready line in one piece with a line before it, then answers
    each request with a list: the ready line is not waited for (it came with the first
    read), and the list is no answer to read the next request's from."""
    worker = tmp_path / "worker.py"
    worker.write_text('import json, os, sys\n'
                      'os.write(1, b"banner\\n" + json.dumps({"ready": True}).encode() + '
                      'b"\\n")\n'
                      'for line in sys.stdin:\n'
                      '    os.write(1, b"[]\\n")\n')
    wrapper = executable(tmp_path / "python", f"#!/bin/sh\nexec {sys.executable} {worker}\n")
    folder = checkout(tmp_path)
    with CheckoutCheck(settings(folder).replace(python=str(wrapper)),
                       start_timeout_s=5.0) as check:
        verdict = check.verdict(command(), {})
        assert check._process is None
    assert verdict.outcome == "unchecked"
    assert verdict.message == f"{wrapper} checkout_worker.py answered b'[]', not a JSON object"


def test_a_worker_gone_before_a_command_leaves_it_unchecked(tmp_path):
    """Killed between two commands (by the out-of-memory killer, say): the request it can
    no longer read is not the search's error."""
    with CheckoutCheck(settings(checkout(tmp_path))) as check:
        check.verdict(command(), {})
        worker = check._process
        worker.kill()
        worker.wait()
        verdict = check.verdict(command("--tensor-model-parallel-size", "2"), {})
    assert verdict.outcome == "unchecked"
    assert verdict.message == (f"{sys.executable} checkout_worker.py stopped before it was "
                               "asked")


def test_a_ctrl_c_during_a_check_stops_its_worker_and_the_next_command_gets_its_own_answer(
        tmp_path):
    folder = checkout(tmp_path, ARGUMENTS.replace(
        "def validate_args(args, defaults={}):\n",
        "def validate_args(args, defaults={}):\n"
        "    if args.tensor_model_parallel_size == 3:\n"
        "        import time; time.sleep(2)\n"))

    def ctrl_c(*_):
        raise KeyboardInterrupt

    with CheckoutCheck(settings(folder)) as check:
        check.verdict(command(), {})
        worker = check._process
        handler = signal.signal(signal.SIGALRM, ctrl_c)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            with pytest.raises(KeyboardInterrupt):
                check.verdict(command("--tensor-model-parallel-size", "3"), {})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, handler)
        assert worker.poll() is not None  # stopped and reaped, not left checking
        after = check.verdict(command("--tensor-model-parallel-size", "2"),
                              {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert after.outcome == "passed"


def test_a_python_that_does_not_start_leaves_it_unchecked(tmp_path):
    folder = checkout(tmp_path)
    missing = MegatronSettings(megatron_path=str(folder), python=str(tmp_path / "no-python"))
    verdict = CheckoutCheck(missing).verdict(command(), {})
    assert verdict.outcome == "unchecked"
    assert verdict.message.startswith(f"megatron.python={str(tmp_path / 'no-python')!r} did not "
                                      "start: [Errno 2] No such file or directory")


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_validate_args_setting_is_auto_true_or_false(value):
    with pytest.raises(LayoutSearchError,
                       match=rf"megatron.validate_args={value!r}: must be auto, true or false"):
        MegatronSettings(validate_args=value)
