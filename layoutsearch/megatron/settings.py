"""How layoutsearch launches Megatron-LM: checkout, Python, launcher, extra flags, environment.

The values live in `cost_models/megatron.yaml` (or any YAML of the same shape) so that a
user points layoutsearch at their own checkout and cluster without touching code.

    settings = MegatronSettings.load("megatron")
    settings = MegatronSettings.from_dict({"megatron_path": "/opt/Megatron-LM"})
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.megatron.slurm_options import check_slurm_settings, check_submitit_values
from layoutsearch.paths import config_dir
from layoutsearch.space import KNOBS

LAUNCHERS = ("dry_run", "local", "slurm")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A POSIX shell variable name: what `export NAME=value` in a launch script accepts."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MegatronSettings:
    """Where Megatron-LM lives and how one trial is run."""

    megatron_path: str = "Megatron-LM"
    """The Megatron-LM checkout (the folder that holds `pretrain_gpt.py`)."""
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
    slurm: Mapping[str, Any] = field(default_factory=dict)
    """submitit AutoExecutor parameters (`slurm_partition`, `slurm_account`, `mem_gb`,
    `slurm_setup`, ...), also written into sbatch scripts (`slurm_options`)."""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise LayoutSearchError(
                f"megatron.launcher={self.launcher!r}: must be one of {', '.join(LAUNCHERS)}"
            )
        for name in ("train_iters", "master_port"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise LayoutSearchError(f"megatron.{name}={value!r}: must be a positive integer")
        if not 0 <= self.warmup_iters < self.train_iters:
            raise LayoutSearchError(
                f"megatron.warmup_iters={self.warmup_iters!r}: must be >= 0 and below "
                f"train_iters ({self.train_iters}) so that some iterations are averaged"
            )
        if self.timeout_s is not None and (
                isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int | float)
                or not self.timeout_s > 0):
            raise LayoutSearchError(
                f"megatron.timeout_s={self.timeout_s!r}: must be a number of seconds > 0, or "
                "null for 1800 s raised to the layout's predicted run")
        for name in self.env:
            if not ENV_NAME.fullmatch(name):
                raise LayoutSearchError(
                    f"megatron.env: {name!r} is not an environment variable name (letters, "
                    "digits and _, not starting with a digit); launch scripts export it as is")
        check_slurm_settings(self.slurm)
        if self.launcher == "slurm":
            check_submitit_values(self.slurm)

    @property
    def script_path(self) -> Path:
        """The training script as an absolute path: launchers run it with the checkout as
        their working directory, and a written script may be started from any folder."""
        return Path(self.megatron_path).expanduser().absolute() / self.script

    def launch_prefix(self) -> list[str]:
        """The torchrun command, before its own options."""
        return list(self.torchrun) or [self.python, "-m", "torch.distributed.run"]

    def replace(self, **changes: Any) -> MegatronSettings:
        return dataclasses.replace(self, **_coerce(changes, "megatron settings"))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str = "megatron settings",
                  ) -> MegatronSettings:
        return cls(**_coerce(values, where))

    @classmethod
    def load(cls, name_or_path: str | Path = "megatron") -> MegatronSettings:
        """Settings from a `cost_models/` file by name, or from a YAML path."""
        path = Path(name_or_path)
        if path.suffix not in (".yaml", ".yml"):
            names = settings_names()
            if str(name_or_path) not in names:
                raise LayoutSearchError(unknown_name_message(
                    "Megatron-LM settings", str(name_or_path), names))
            path = config_dir("cost_models") / f"{name_or_path}.yaml"
        elif not path.is_file():
            raise LayoutSearchError(f"megatron={str(path)!r}: no such settings file")
        with path.open() as handle:
            return cls.from_dict(yaml.safe_load(handle) or {}, str(path))


def settings_names() -> list[str]:
    """The `cost_models/` files that are Megatron-LM settings (they name megatron_path)."""
    return sorted(p.stem for p in config_dir("cost_models").glob("*.yaml")
                  if "megatron_path" in (yaml.safe_load(p.read_text()) or {}))


def _coerce(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(MegatronSettings)}
    unknown = set(values) - known - {"_target_"}
    knobs = sorted(unknown & set(KNOBS))
    if knobs:
        raise LayoutSearchError(
            f"{where}: {', '.join(knobs)} is a layout knob, not a Megatron-LM setting: set it "
            f"in the search space (e.g. {knobs[0]}: [true]) or pin it ({knobs[0]}=...)")
    if unknown:
        raise LayoutSearchError(
            f"{where}: unknown setting(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )
    out = {k: v for k, v in values.items() if k != "_target_"}
    for name in ("torchrun", "extra_args"):
        if name in out:
            raw = out[name]
            out[name] = (raw,) if isinstance(raw, str) else tuple(str(v) for v in raw or ())
    for name in ("env", "slurm"):
        if name in out:
            out[name] = {str(k): (str(v) if name == "env" else v)
                         for k, v in dict(out[name] or {}).items()}
    return out


def resolve_settings(spec: str | Path | Mapping[str, Any] | MegatronSettings | None,
                     ) -> MegatronSettings:
    """Settings from a name, a path, a mapping, an instance, or the shipped defaults."""
    if spec is None:
        return MegatronSettings.load("megatron")
    if isinstance(spec, MegatronSettings):
        return spec
    if isinstance(spec, Mapping):
        return MegatronSettings.from_dict(spec)
    if not isinstance(spec, str | Path):
        raise LayoutSearchError(
            f"megatron={spec!r}: must be a name of the cost_models/ folder (e.g. 'megatron'), "
            "the path of a YAML file of Megatron-LM settings, or a mapping of them")
    return MegatronSettings.load(spec)
