"""The built-in catalog: published model dimensions and GPU clusters, one YAML file each.

The folders `model/` and `cluster/` double as Hydra config groups (`model=llama_13b`,
`cluster=a100_80gb`), so the CLI and Python read the very same files.

    model = load_model("llama_13b", vocab_size=128000)
    cluster = load_cluster("a100_80gb")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.specs import ClusterSpec, GPUSpec, ModelSpec

CATALOG_DIR = Path(__file__).parent
MODEL_DIR = CATALOG_DIR / "model"
CLUSTER_DIR = CATALOG_DIR / "cluster"


def model_names() -> list[str]:
    return sorted(p.stem for p in MODEL_DIR.glob("*.yaml"))


def cluster_names() -> list[str]:
    return sorted(p.stem for p in CLUSTER_DIR.glob("*.yaml"))


@cache
def _read(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        return dict(yaml.safe_load(handle))


def _require_mapping(cls: type, kind: str, fields: Any) -> None:
    if not isinstance(fields, Mapping):  # e.g. a YAML file written as a list of fields
        valid = ", ".join(f.name for f in dataclasses.fields(cls))
        raise LayoutSearchError(f"{kind} definition {fields!r}: must be a mapping of field "
                                f"names to values (fields: {valid})")


def _construct(cls: type, kind: str, fields: Any) -> Any:
    _require_mapping(cls, kind, fields)
    valid = [f.name for f in dataclasses.fields(cls)]
    name = fields.get("name", "")
    who = f"{kind} {name!r}" if name else f"{kind} definition"
    unknown = [k for k in fields if k not in valid]
    if unknown:
        raise LayoutSearchError(
            f"{who}: " + "; ".join(
                unknown_name_message(f"{kind} field", str(k), valid) for k in unknown))
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in fields]
    if missing:
        raise LayoutSearchError(f"{who}: missing field(s) {', '.join(missing)}; a {kind} "
                                f"needs {', '.join(required)}")
    return cls(**fields)


def model_from_dict(fields: Mapping[str, Any]) -> ModelSpec:
    """A ModelSpec from YAML/Hydra fields (keys as in `catalog/model/*.yaml`)."""
    _require_mapping(ModelSpec, "model", fields)
    return _construct(ModelSpec, "model", {k: v for k, v in fields.items() if k != "_target_"})


def cluster_from_dict(fields: Mapping[str, Any]) -> ClusterSpec:
    """A ClusterSpec from YAML/Hydra fields; `gpu` is a nested mapping."""
    _require_mapping(ClusterSpec, "cluster", fields)
    fields = dict(fields)
    gpu = fields.get("gpu")
    if "gpu" in fields and not isinstance(gpu, GPUSpec):
        if not isinstance(gpu, Mapping):  # e.g. a catalog name, which is no GPU's figures
            valid = ", ".join(f.name for f in dataclasses.fields(GPUSpec))
            raise LayoutSearchError(
                f"cluster {fields.get('name', '')!r}.gpu={gpu!r}: must be a mapping of the "
                f"GPU's fields ({valid}); copy the gpu block of a catalog cluster, e.g. "
                f"{CLUSTER_DIR / 'a100_80gb.yaml'}")
        fields["gpu"] = _construct(GPUSpec, "gpu", gpu)
    return _construct(ClusterSpec, "cluster", fields)


def _catalog_file(kind: str, name: Any, folder: Path, names: list[str]) -> Path:
    # Membership, not a path test: a name is a name ('../cluster/h200' is none), and None
    # or a number gets the list of valid names rather than a failure inside the matcher.
    if not isinstance(name, str) or name not in names:
        raise LayoutSearchError(unknown_name_message(kind, name, names))
    return folder / f"{name}.yaml"


def load_model(name: str, /, **overrides: Any) -> ModelSpec:
    """A catalog model by name, with any field overridden (`vocab_size=128000`)."""
    model = model_from_dict(_read(_catalog_file("model", name, MODEL_DIR, model_names())))
    return model.replace(**overrides) if overrides else model


def load_cluster(name: str, /, **overrides: Any) -> ClusterSpec:
    """A catalog cluster by name (named after its GPU kind, e.g. `h100_sxm`)."""
    cluster = cluster_from_dict(
        _read(_catalog_file("cluster", name, CLUSTER_DIR, cluster_names())))
    return cluster.replace(**overrides) if overrides else cluster


def clusters_by_gpu() -> dict[str, ClusterSpec]:
    """Every catalog cluster keyed by its GPU name (the `gpu` column of measurements)."""
    return {c.gpu.name: c for c in map(load_cluster, cluster_names())}
