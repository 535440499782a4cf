"""How layoutsearch launches Megatron-LM: checkout, Python, launcher, extra flags, environment.

The values live in `cost_models/megatron.yaml` (or any YAML of the same shape) so that a
user points layoutsearch at their own checkout and cluster without touching code.

    settings = MegatronSettings.load("megatron")
    settings = MegatronSettings.from_dict({"megatron_path": "/opt/Megatron-LM"})
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.megatron.slurm_options import check_slurm_settings, check_submitit_values
from layoutsearch.paths import option_files, option_mapping, read_yaml_mapping
from layoutsearch.space import KNOBS

LAUNCHERS = ("dry_run", "local", "slurm")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A POSIX shell variable name: what `export NAME=value` in a launch script accepts."""
VALIDATE_ARGS_VALUES = ("auto", True, False)
ARGUMENTS_MODULE_FILES = ("megatron/training/arguments.py", "megatron/arguments.py")
"""Where a Megatron-LM checkout keeps parse_args and validate_args: since 2024, and before."""
LARGEST_PORT = 65535
"""The highest TCP port: torchrun's rendezvous on a larger master_port could never bind."""


def program(word: str) -> str:
    """A program as a process started in the checkout finds it: one named by a relative
    path (`venv/bin/python`) is made absolute from this folder, where layoutsearch's own
    checks find it, as the same path would name nothing in the checkout; a bare name
    (`python`) is left to the PATH."""
    if "/" in word or word.startswith("~"):
        return str(Path(word).expanduser().absolute())
    return word


@dataclass(frozen=True, kw_only=True, slots=True)
class MegatronSettings:
    """Where Megatron-LM lives and how one trial is run."""

    megatron_path: str = "Megatron-LM"
    """The Megatron-LM checkout (the folder that holds `pretrain_gpt.py`), relative to the
    folder layoutsearch runs in. Every trial runs in it, however it is launched (`checkout`),
    so relative paths in `extra_args`, `env` and `slurm_setup` lines are relative to it."""
    script: str = "pretrain_gpt.py"
    """The training script, relative to `megatron_path`."""
    python: str = "python"
    """The Python that runs torchrun (`python -m torch.distributed.run`)."""
    torchrun: tuple[str, ...] = ()
    """The launcher command; empty means `<python> -m torch.distributed.run`."""
    launcher: str = "local"
    """`dry_run` (write scripts), `local` (torchrun on this node) or `slurm` (submitit)."""
    train_iters: int = 10
    """Training iterations per trial: enough to average after the warm-up."""
    warmup_iters: int = 3
    """Logged iterations dropped before averaging (allocator, NCCL and kernel warm-up)."""
    timeout_s: float | None = None
    """Wall-clock limit (s) of one trial; a trial past it is killed and recorded as
    `timeout`. None: 1800 s, raised to the layout's predicted run when one is known
    (`scripts.trial_time_limit_s`); a number is used as given."""
    master_port: int = 29500
    """Rendezvous port of torchrun."""
    grad_reduce_in_bf16: bool | None = None
    """`--grad-reduce-in-bf16`; None follows the analytic model's `gradient_bytes` (2 = bf16)."""
    lr: float = 1.0e-4
    """Learning rate of the short trial (irrelevant to speed, required by Megatron-LM)."""
    extra_args: tuple[str, ...] = ()
    """Flags appended to every command line, e.g. `--use-flash-attn` never (deprecated)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment added to every trial (NCCL settings, PYTHONPATH ...)."""
    log_dir: str = "megatron_logs"
    """Where the local and Slurm launchers keep one log per trial."""
    validate_args: bool | str = "auto"
    """Whether each command is checked by the checkout's own `parse_args` and
    `validate_args`, run by `python` on this machine's CPU before the command is launched
    or written (checkout_check.py): true, false, or `auto` (where the checkout is here)."""
    slurm: Mapping[str, Any] = field(default_factory=dict)
    """submitit AutoExecutor parameters (`slurm_partition`, `slurm_account`, `mem_gb`,
    `slurm_setup`, ...), also written into sbatch scripts (`slurm_options`)."""

    def __post_init__(self) -> None:
        # Words and environment as YAML writes them (numbers, a single word) become strings
        # here, so that settings built in Python get the same checks as those from a file.
        for name in ("torchrun", "extra_args"):
            object.__setattr__(self, name, _arguments(f"megatron.{name}", getattr(self, name)))
        object.__setattr__(self, "env", {
            str(k): _env_value(f"megatron.env.{k}", v)
            for k, v in _mapping("megatron.env", self.env).items()})
        object.__setattr__(self, "slurm", {
            str(k): v for k, v in _mapping("megatron.slurm", self.slurm).items()})
        if self.launcher not in LAUNCHERS:
            raise LayoutSearchError(
                f"megatron.launcher={self.launcher!r}: must be one of {', '.join(LAUNCHERS)}"
            )
        for name in ("megatron_path", "script", "python", "log_dir"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise LayoutSearchError(f"megatron.{name}={value!r}: must be a non-empty "
                                        "string (a path or a command name)")
        for name in ("train_iters", "master_port", "warmup_iters"):
            value = getattr(self, name)
            least = 0 if name == "warmup_iters" else 1
            most = LARGEST_PORT if name == "master_port" else math.inf
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
                kind = ("an integer >= 0" if least == 0 else
                        f"a TCP port, 1 .. {LARGEST_PORT}" if name == "master_port" else
                        "a positive integer")
                raise LayoutSearchError(f"megatron.{name}={value!r}: must be {kind}")
        if (isinstance(self.lr, bool) or not isinstance(self.lr, int | float)
                or not 0 < self.lr < math.inf):
            # Megatron-LM refuses --min-lr above --lr: every layout would be rejected.
            raise LayoutSearchError(f"megatron.lr={self.lr!r}: must be a positive number")
        if self.grad_reduce_in_bf16 is not None and not isinstance(self.grad_reduce_in_bf16,
                                                                   bool):
            # A string such as "false" is truthy: it would emit --grad-reduce-in-bf16.
            raise LayoutSearchError(f"megatron.grad_reduce_in_bf16={self.grad_reduce_in_bf16!r}"
                                    ": must be true, false or null")
        if not 0 <= self.warmup_iters < self.train_iters:
            raise LayoutSearchError(
                f"megatron.warmup_iters={self.warmup_iters!r}: must be >= 0 and below "
                f"train_iters ({self.train_iters}) so that some iterations are averaged"
            )
        if self.timeout_s is not None and (
                isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int | float)
                or not 0 < self.timeout_s < math.inf):
            raise LayoutSearchError(
                f"megatron.timeout_s={self.timeout_s!r}: must be a finite number of seconds > "
                "0, or "
                "null for 1800 s raised to the layout's predicted run")
        if self.validate_args not in VALIDATE_ARGS_VALUES or not isinstance(
                self.validate_args, bool | str):  # 1 == True, but is no setting
            raise LayoutSearchError(
                f"megatron.validate_args={self.validate_args!r}: must be auto, true or false")
        for name in self.env:
            if not ENV_NAME.fullmatch(name):
                raise LayoutSearchError(
                    f"megatron.env: {name!r} is not an environment variable name (letters, "
                    "digits and _, not starting with a digit); launch scripts export it as is")
        # Imported here: the checks read Megatron-LM's parser, whose module builds commands
        # from these settings.
        from layoutsearch.megatron.checks import settings_conflicts

        conflict = settings_conflicts(self.extra_args, self.env)
        if conflict:
            raise LayoutSearchError(conflict)
        check_slurm_settings(self.slurm)
        if self.launcher == "slurm":
            check_submitit_values(self.slurm)

    @property
    def checkout(self) -> Path:
        """The Megatron-LM checkout as an absolute path, `~` expanded: the working folder of
        every launch, the local launcher's torchrun (a process's cwd is taken literally, `~`
        and all), a written script and a Slurm job (`scripts.enter_checkout`)."""
        return Path(self.megatron_path).expanduser().absolute()

    @property
    def script_path(self) -> Path:
        """The training script as an absolute path: a written script may be started from
        any folder."""
        return self.checkout / self.script

    def launch_prefix(self) -> list[str]:
        """The torchrun command, before its own options, its program as `program` has it."""
        prefix = list(self.torchrun) or [self.python, "-m", "torch.distributed.run"]
        return [program(prefix[0]), *prefix[1:]]

    @property
    def checks_in_checkout(self) -> bool:
        """Whether each command is put to the checkout's own parse_args and validate_args
        before it is launched or written (checkout_check.py): `validate_args: true`, or
        `auto` where the checkout holds Megatron-LM's arguments module."""
        if self.validate_args != "auto":
            return bool(self.validate_args)
        return any((self.checkout / path).is_file() for path in ARGUMENTS_MODULE_FILES)

    def replace(self, **changes: Any) -> MegatronSettings:
        return dataclasses.replace(self, **_coerce(changes, "megatron settings"))

    def to_record(self) -> dict[str, Any]:
        """The settings as plain values, which `from_dict` reads back: a frame's `attrs`
        must hold JSON values, as DataFrame.to_parquet writes them."""
        return {f.name: (list(value) if isinstance(value := getattr(self, f.name), tuple)
                         else dict(value) if isinstance(value, Mapping) else value)
                for f in fields(self)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str = "megatron settings",
                  ) -> MegatronSettings:
        coerced = _coerce(values, where)
        try:
            return cls(**coerced)
        except LayoutSearchError as error:
            if where == "megatron settings":
                raise
            raise LayoutSearchError(f"{where}: {error}") from None  # which file says so

    @classmethod
    def load(cls, name_or_path: str | Path = "megatron") -> MegatronSettings:
        """Settings from a `cost_models/` file by name, or from a YAML path."""
        if not isinstance(name_or_path, str | Path):
            raise LayoutSearchError(
                f"megatron={name_or_path!r}: must be a name of the cost_models/ folder (e.g. "
                "'megatron'), the path of a YAML file of Megatron-LM settings, or a mapping "
                "of them")
        path = Path(name_or_path)
        if path.suffix not in (".yaml", ".yml"):
            found = option_files("cost_models").get(str(name_or_path))
            config = None if found is None else option_mapping(found)
            # A file of that name that cannot be read is read below, to say why.
            if found is None or (config is not None and "megatron_path" not in config):
                raise LayoutSearchError(unknown_name_message(
                    "Megatron-LM settings", str(name_or_path), settings_names()))
            path = found
        elif not path.is_file():
            raise LayoutSearchError(f"megatron={str(path)!r}: no such settings file")
        return cls.from_dict(read_yaml_mapping(path, "Megatron-LM settings file"), str(path))


def settings_names() -> list[str]:
    """The `cost_models/` files that are Megatron-LM settings (they name megatron_path)."""
    return [name for name, path in option_files("cost_models").items()
            if "megatron_path" in (option_mapping(path) or {})]


def _coerce(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(values, Mapping):
        raise LayoutSearchError(f"{where}: {values!r} must be a mapping of Megatron-LM "
                                "settings (megatron_path: ..., python: ..., ...)")
    known = {f.name for f in dataclasses.fields(MegatronSettings)}
    unknown = set(values) - known - {"_target_"}
    knobs = sorted(unknown & set(KNOBS))
    if knobs:
        raise LayoutSearchError(
            f"{where}: {', '.join(knobs)} is a layout knob, not a Megatron-LM setting: set it "
            f"in the search space (e.g. {knobs[0]}: [true]) or pin it ({knobs[0]}=...)")
    if unknown:
        # The first misspelt name with the closest known one, as the command's own keys are.
        first, *others = sorted(unknown, key=str)
        more = f"; also unknown: {', '.join(map(repr, others))}" if others else ""
        raise LayoutSearchError(
            f"{where}: {unknown_name_message('Megatron-LM setting', first, known)}{more}")
    return {k: v for k, v in values.items() if k != "_target_"}


def _arguments(where: str, raw: Any) -> tuple[str, ...]:
    """A command's words from a list (numbers written as such in YAML are words too)."""
    if raw is None:
        return ()
    if isinstance(raw, str) and len(raw.split()) <= 1:
        return (raw,) if raw else ()
    rule = (f"{where}={raw!r}: must be a list of words, one argument each "
            "(e.g. [--seed, '1234']); quoting is layoutsearch's job")
    if isinstance(raw, str | Mapping) or not isinstance(raw, list | tuple):
        raise LayoutSearchError(rule)
    for word in raw:
        if isinstance(word, bool) or not isinstance(word, str | int | float):
            raise LayoutSearchError(f"{rule}; {word!r} is not a word")
        flag = str(word).split("=", 1)[0]
        if flag.startswith("-") and len(flag.split()) > 1:
            # Passed as one argument, '--seed 1234' is a flag no parser knows.
            raise LayoutSearchError(f"{rule}; {word!r} is several words in one: give them "
                                    f"apart, {', '.join(map(repr, str(word).split()))}")
    return tuple(str(word) for word in raw)


def _mapping(where: str, raw: Any) -> Mapping[Any, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise LayoutSearchError(f"{where}={raw!r}: must be a mapping of names to values")
    return raw


def _env_value(where: str, value: Any) -> str:
    # YAML reads `true` and `null` as a bool and None: exported as "True" and "None", which
    # NCCL and CUDA do not read as 1 and unset.
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise LayoutSearchError(f"{where}={value!r}: must be a string or a number (quote "
                                "flags as '1' or '0'; leave an unset variable out)")
    return str(value)


def resolve_settings(spec: str | Path | Mapping[str, Any] | MegatronSettings | None,
                     ) -> MegatronSettings:
    """Settings from a name, a path, a mapping, an instance, or the shipped defaults."""
    if spec is None:
        return MegatronSettings.load("megatron")
    if isinstance(spec, MegatronSettings):
        return spec
    if isinstance(spec, Mapping):
        return MegatronSettings.from_dict(spec)
    return MegatronSettings.load(spec)  # which refuses anything but a name or a path
