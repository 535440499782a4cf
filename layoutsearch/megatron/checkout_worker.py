"""Megatron-LM's own argument checks, run by the Python that trains, in the user's checkout.

Started by `layoutsearch.megatron.checkout_check` as

    <megatron.python> checkout_worker.py <checkout>

this file imports the standard library and the checkout's `megatron.training.arguments`
(`megatron.arguments` before Megatron-LM moved it), never layoutsearch: the Python that
trains may not have layoutsearch installed. It does what `initialize_megatron` does before
touching a GPU: `parse_args()` on the command's flags, then `validate_args(args,
{'tokenizer_type': 'GPT2BPETokenizer'})`, the defaults `pretrain_gpt.py` passes.

Its first line on stdout says whether the module imported:
    {"ready": true, "module": "/…/megatron/training/arguments.py"}
    {"ready": false, "message": "ModuleNotFoundError: No module named 'torch'"}
Then it reads one request a line on stdin,
    {"argv": ["--num-layers", "40", …], "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
     "world_size": 64, "compute_capability": [8, 0]}
and answers each with one line,
    {"outcome": "passed" | "rejected" | "unchecked", "stage": "parse_args" | …,
     "message": "…"}
What Megatron-LM prints while it checks a command (every argument, 34 kB) is read for the
message and dropped; what reaches the process's stdout otherwise (C code, a subprocess) goes
to stderr, so that stdout carries the answers alone.
"""

import contextlib
import importlib
import io
import json
import os
import sys
import traceback
import types

MODULES = ("megatron.training.arguments", "megatron.arguments")
"""Where Megatron-LM keeps parse_args and validate_args: since 2024, and before."""
STANDARD_LIBRARY = frozenset(getattr(sys, "stdlib_module_names", ()))
"""Python's own modules (3.10 on; before, no frame is passed over as one)."""
PRETRAIN_GPT_DEFAULTS = {"tokenizer_type": "GPT2BPETokenizer"}
"""`args_defaults` of pretrain_gpt.py's `pretrain(...)` call, which validate_args applies."""


def _describe(error):
    return f"{type(error).__name__}: {error}".strip().rstrip(":")


def _last_line(text):
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _verdict(error, stage, printed):
    """What an exception raised by parse_args or validate_args says about the command."""
    if isinstance(error, SystemExit):
        # argparse's error() (an unknown flag, a bad choice) and validate_args' exit() for
        # removed flags both end the process; what they printed last says why.
        return {"outcome": "rejected", "stage": stage,
                "message": _last_line(printed) or f"exited with status {error.code}"}
    raiser = _raiser(error)
    at = f" ({raiser[1]}:{raiser[2]})" if raiser else ""
    # An exception from torch (a CUDA query on a machine without a GPU), or one for a package
    # missing here, says nothing of the command: the check could not be made here. Megatron-LM's
    # own code (the checkout's, or an installed megatron-core) is told by its module, not by
    # its file's path, which may run through any folder named megatron
    # (~/megatron/venv/lib/.../torch/cuda/__init__.py).
    missing_package = any(isinstance(link, ImportError) for link in _chain(error))
    ours = raiser is not None and raiser[0].split(".")[0] == "megatron" and not missing_package
    return {"outcome": "rejected" if ours else "unchecked", "stage": stage,
            "message": _describe(error) + at}


def _raiser(error):
    """(module, file, line) of the code whose call raised the exception: the innermost frame
    outside Python's standard library (an enum lookup, os.environ[...] raise there for the
    code that called them); None without a traceback."""
    frames = list(traceback.walk_tb(error.__traceback__))
    for frame, line in reversed(frames):
        module = str(frame.f_globals.get("__name__", ""))
        if module.split(".")[0] not in STANDARD_LIBRARY:
            return module, frame.f_code.co_filename, line
    return None


def _chain(error):
    """The exception and those it was raised from or while handling (`raise ... from e`)."""
    while error is not None:
        yield error
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)


@contextlib.contextmanager
def _gpu_of_the_command(capability):
    """validate_args asks torch which GPU it runs on: with tp or cp > 1, before Blackwell
    (compute capability 10), it requires CUDA_DEVICE_MAX_CONNECTIONS=1. On a machine without
    a GPU, the command's own GPU answers: torch.cuda's capability and properties give its
    compute capability while the command is checked. With a GPU here, or none given, torch
    answers as it would."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if capability is None or cuda is None or cuda.is_available():
        yield
        return
    major, minor = capability
    saved = cuda.get_device_capability, cuda.get_device_properties
    cuda.get_device_capability = lambda device=None: (major, minor)
    cuda.get_device_properties = lambda device=None: types.SimpleNamespace(
        major=major, minor=minor, name=f"the command's GPU (sm{major}{minor})")
    try:
        yield
    finally:
        cuda.get_device_capability, cuda.get_device_properties = saved


def _check(parse_args, validate_args, request):
    saved_env, saved_argv = dict(os.environ), sys.argv
    os.environ.update({str(k): str(v) for k, v in request.get("env", {}).items()})
    # torchrun's variables for rank 0, which parse_args reads (args.rank, args.world_size).
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(request["world_size"]))
    sys.argv = ["pretrain_gpt.py", *request["argv"]]
    printed = io.StringIO()
    stage = "parse_args"
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed), \
                _gpu_of_the_command(request.get("compute_capability")):
            args = parse_args(None, False)
            stage = "validate_args"
            validate_args(args, dict(PRETRAIN_GPT_DEFAULTS))
        return {"outcome": "passed", "stage": stage, "message": ""}
    except (Exception, SystemExit) as error:
        return _verdict(error, stage, printed.getvalue())
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv


def _import_checks():
    """parse_args, validate_args and the module's file; or the reason they did not import."""
    for name in MODULES:
        try:
            with contextlib.redirect_stdout(sys.stderr):
                module = importlib.import_module(name)
            found = (module.parse_args, module.validate_args, module.__file__)
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if missing and (name == missing or name.startswith(missing + ".")):
                continue  # not where this version keeps it: try the next place
            return None, _describe(error)  # a package it needs (torch) is not installed
        except (Exception, SystemExit) as error:
            return None, _describe(error)
        return found, ""
    return None, f"neither {' nor '.join(MODULES)} is in the checkout"


def main():
    checkout = os.path.abspath(sys.argv[1])
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what Megatron-LM prints to the process's stdout reaches stderr
    # Requests come on a descriptor of their own, stdin reads nothing: Python's exit(), which
    # validate_args calls on a removed flag, closes sys.stdin, and no read of Megatron-LM's
    # may take a request.
    requests = os.fdopen(os.dup(0), "r")
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.close(nothing)
    sys.path.insert(0, checkout)  # as `python pretrain_gpt.py` in the checkout has it
    os.chdir(checkout)
    found, reason = _import_checks()
    if found is None:
        answers.write(json.dumps({"ready": False, "message": reason}) + "\n")
        return
    parse_args, validate_args, module_file = found
    answers.write(json.dumps({"ready": True, "module": module_file}) + "\n")
    for line in requests:
        if line.strip():
            answers.write(json.dumps(_check(parse_args, validate_args, json.loads(line))) + "\n")


if __name__ == "__main__":
    main()
