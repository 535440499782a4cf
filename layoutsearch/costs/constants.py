"""The analytic model's constants: efficiencies and overheads, per GPU kind, as data.

They live in `cost_models/analytic.yaml`, each with a comment that
says where its value comes from; calibration writes new files of the same shape.

    constants = load_constants("analytic")["a100_80gb"]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.paths import option_files, option_mapping, read_yaml_mapping


@dataclass(frozen=True, kw_only=True, slots=True)
class AnalyticConstants:
    """Physical efficiencies and overheads of one GPU kind running Megatron-style training."""

    gemm_efficiency: float
    """Fraction of the dense bf16 peak that the transformer's GEMMs reach."""
    flash1_efficiency: float
    """Fraction of peak reached by FlashAttention 1, forward and backward together."""
    flash2_efficiency: float
    """Same for FlashAttention 2."""
    flash3_efficiency: float
    """Same for FlashAttention 3 (Hopper only)."""
    memory_bandwidth_efficiency: float
    """Fraction of HBM bandwidth that memory-bound kernels (norms, softmax, adds) reach."""
    nvlink_efficiency: float
    """NCCL bus bandwidth as a fraction of the NVLink rate, inside a node."""
    network_efficiency: float
    """NCCL bus bandwidth as a fraction of the per-GPU NIC rate, between nodes."""
    kernel_overhead_s: float
    """Seconds of launch and synchronization overhead per kernel (counted in timing.py)."""
    dp_comm_exposed: float
    """Fraction of the data-parallel communication left on the step: all of it without the
    overlap flags (layout `overlap_grad_reduce`), what outlasts the compute window with them;
    below 1 where a code base hides more than that (timing.py)."""
    gradient_bytes: float
    """Bytes per gradient value kept per parameter (2 = bf16, 4 = fp32 main grads)."""
    memory_overhead_gib: float
    """CUDA context, NCCL buffers and workspaces per GPU, GiB."""
    activation_memory_factor: float
    """Activation memory kept / the tensors counted in memory.py (extra copies, fragmentation)."""
    logit_bytes: float
    """Bytes per logit value alive at the loss (bf16 logits, fp32 copies, softmax, gradient)."""
    logits_sharded_by_tp: float
    """1 if the loss keeps only its vocabulary shard per TP rank (Megatron's vocab-parallel
    cross entropy), 0 if every rank holds the whole vocabulary's logits."""

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any], where: str) -> AnalyticConstants:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(fields) - names
        missing = names - set(fields)
        # Each kind of mistake is named only where there is one: a file missing a constant
        # was told "unknown constant(s) [], missing [...]".
        problems = [f"{kind} constant(s) {', '.join(sorted(names))}"
                    for kind, names in (("unknown", unknown), ("missing", missing)) if names]
        if problems:
            raise LayoutSearchError(f"{where}: {'; '.join(problems)}")
        for name, value in fields.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise LayoutSearchError(f"{where}.{name}={value!r}: must be a number")
            rule, allows = _rule_of(name)
            if not allows(float(value)):
                raise LayoutSearchError(f"{where}.{name}={value!r}: must be {rule}")
        return cls(**{k: float(v) for k, v in fields.items()})

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


RANGE_RULES = {
    "a fraction in (0, 1]": lambda v: 0.0 < v <= 1.0,
    "a finite number > 0": lambda v: 0.0 < v < math.inf,
    "a finite number >= 0": lambda v: 0.0 <= v < math.inf,
}
"""What each continuous constant may be: efficiencies and shares are fractions of a rate;
the byte counts and factors multiply or divide; the overheads may be none. None may be
infinite: an infinite overhead or byte count prices every layout at MFU 0 or out of memory."""

DISCRETE_VALUES: dict[str, tuple[float, ...]] = {
    # bf16 or fp32 main gradients: the emitted commands reduce in bf16 at 2 and fp32 at 4
    # (megatron/args.py reduces_in_bf16), so no other count has a command that runs it.
    "gradient_bytes": (2.0, 4.0),
    "logits_sharded_by_tp": (0.0, 1.0),  # loss over the whole vocabulary, or 1/tp per rank
}
"""The constants that are switches, each with the values it may take."""


def _rule_of(name: str) -> tuple[str, Callable[[float], bool]]:
    """What constant `name` must be, in words, and the test of a value."""
    if name in DISCRETE_VALUES:
        values = DISCRETE_VALUES[name]
        return " or ".join(f"{v:g}" for v in values), lambda v: v in values
    if name.endswith("_efficiency") or name == "dp_comm_exposed":
        rule = "a fraction in (0, 1]"
    elif name in ("kernel_overhead_s", "memory_overhead_gib"):
        rule = "a finite number >= 0"
    else:
        rule = "a finite number > 0"
    return rule, RANGE_RULES[rule]


ANALYTIC_TARGET = "layoutsearch.costs.analytic.AnalyticCostModel"
"""The `_target_` of a `cost_models/` file that holds analytic constants."""


def config_target(config: object) -> str | None:
    """The cost-model class a `cost_models/` config names (`_target_`); None for a file that
    is not a cost model (the Megatron-LM settings beside them)."""
    return config.get("_target_") if isinstance(config, dict) else None


CONSTANTS_SUFFIXES = (".yaml", ".yml")
"""How the name of a cost-model file ends: anything else is taken as a config name."""


def constants_path(name_or_path: str | Path, target: str | None = None) -> Path:
    """A cost-model config by group name (`analytic`) or by file path; an unknown name lists
    the cost models (those of `target` only, when given)."""
    path = Path(name_or_path)
    if path.suffix in CONSTANTS_SUFFIXES:
        if not path.is_file():
            raise LayoutSearchError(f"cost-model constants file {str(path)!r} does not exist")
        return path
    files = option_files("cost_models")
    if str(name_or_path) not in files:
        # Cost models name their class; the Megatron-LM settings file beside them does not.
        names = [name for name, file in files.items()
                 if (found := config_target(option_mapping(file)))
                 and (target is None or found == target)]
        kind = "analytic constants" if target == ANALYTIC_TARGET else "cost model"
        raise LayoutSearchError(unknown_name_message(kind, str(name_or_path), names))
    return files[str(name_or_path)]


def parse_constants(config: Mapping[str, Any], where: str) -> dict[str, AnalyticConstants]:
    """`{gpu name: constants}` from a config with a `gpus:` mapping."""
    gpus = config.get("gpus")
    if not isinstance(gpus, Mapping) or not gpus:
        got = "none" if gpus is None else f"gpus={gpus!r}"
        raise LayoutSearchError(
            f"{where}: needs a 'gpus' mapping of GPU kind -> constants, got {got}; start from "
            "a copy of cost_models/analytic.yaml (fitted to the study's cluster) or "
            "cost_models/analytic_prior.yaml (a-priori values), or name one of them")
    for gpu, values in gpus.items():
        if not isinstance(values, Mapping):
            raise LayoutSearchError(f"{where}: gpus.{gpu}={values!r}: must be a mapping of "
                                    "constant name -> value")
    return {
        str(gpu): AnalyticConstants.from_dict(dict(values), f"{where}: gpus.{gpu}")
        for gpu, values in gpus.items()
    }


def fitted_gpus(config: Mapping[str, Any], where: str) -> frozenset[str] | None:
    """The GPU kinds whose constants were fitted to measured runs of that kind, as the
    config's `provenance.gpus` lists them (layoutsearch-calibrate writes the kinds it
    fitted there); None when the config does not say."""
    provenance = config.get("provenance")
    if not isinstance(provenance, Mapping) or "gpus" not in provenance:
        return None
    kinds = provenance["gpus"]
    if not isinstance(kinds, list) or not all(isinstance(kind, str) for kind in kinds):
        raise LayoutSearchError(
            f"{where}: provenance.gpus={kinds!r}: must be a list of the GPU kinds whose "
            "constants were fitted to measured runs of that kind (e.g. [a100_80gb], or [])")
    # A fitted kind has fitted constants in the file: a name that has none is a typo, and
    # would leave the kind it meant uncovered by the note on a-priori constants.
    unknown = [kind for kind in kinds if kind not in config.get("gpus", {})]
    if unknown:
        raise LayoutSearchError(
            f"{where}: provenance.gpus names {', '.join(map(repr, unknown))}, which the file "
            f"has no constants for; its GPU kinds: {', '.join(config.get('gpus', {}))}")
    return frozenset(kinds)


def analytic_config(name_or_path: str | Path = "analytic") -> tuple[Path, dict[str, Any]]:
    """The file and contents of a `cost_models/` config of analytic constants."""
    path = constants_path(name_or_path, target=ANALYTIC_TARGET)
    config = read_yaml_mapping(path, "cost-model constants file")
    target = config_target(config)
    if target not in (None, ANALYTIC_TARGET):
        raise LayoutSearchError(
            f"{path}: holds a {target.rsplit('.', 1)[-1]} config, not analytic constants; "
            "name an analytic one (analytic, analytic_prior or a calibrated file)")
    return path, config


def load_constants(name_or_path: str | Path = "analytic") -> dict[str, AnalyticConstants]:
    path, config = analytic_config(name_or_path)
    return parse_constants(config, str(path))
