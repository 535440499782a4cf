"""Cost models and how they are built from config (an allowlist of `_target_`s).

A config of the `cost_models/` group names its class in `_target_`; only the targets
registered here can be instantiated, so a YAML file cannot run arbitrary code.

    model = build_cost_model("analytic")
    model = build_cost_model({"_target_": "layoutsearch.costs.analytic.AnalyticCostModel",
                              "gpus": {...}})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from layoutsearch.costs.analytic import AnalyticCostModel
from layoutsearch.costs.base import PREDICTION_COLUMNS, CostModel
from layoutsearch.costs.constants import constants_path
from layoutsearch.costs.measured import MeasuredCostModel
from layoutsearch.costs.replay import ReplayCostModel
from layoutsearch.errors import LayoutSearchError
from layoutsearch.paths import read_yaml_mapping

Factory = Callable[..., CostModel]

COST_MODEL_TARGETS: dict[str, Factory] = {
    "layoutsearch.costs.analytic.AnalyticCostModel": AnalyticCostModel.from_config,
    "layoutsearch.costs.replay.ReplayCostModel": ReplayCostModel.from_config,
    "layoutsearch.costs.measured.MeasuredCostModel": MeasuredCostModel.from_config,
}
"""`_target_` -> factory(config without `_target_`, source=...). Register new models here."""


def build_cost_model(
    spec: str | Path | Mapping[str, Any] | CostModel, *, name: str | None = None,
    setting: str = "cost_model", **settings: Any,
) -> CostModel:
    """A cost model from a config name, a YAML path, a config mapping or an instance.

    `name` is how messages call a mapping (e.g. "cost_models=analytic", the option Hydra
    composed it from); a name or path names itself. `setting` is the argument or setting
    that gave `spec` ("driver.warm_start"): messages about it start with that.
    """
    try:
        return _build(spec, name, setting, settings)
    except LayoutSearchError as error:
        if setting == "cost_model" or not isinstance(spec, str | Path):
            raise
        # A named model's messages start with its name: say which setting named it.
        message = str(error).removeprefix(f"{spec}: ")
        raise LayoutSearchError(f"{setting}={spec}: {message}") from None


def _build(spec: Any, name: str | None, setting: str, settings: Mapping[str, Any],
           ) -> CostModel:
    if isinstance(spec, CostModel) and not isinstance(spec, str | Path | Mapping):
        if settings:
            raise LayoutSearchError(
                f"settings {sorted(settings)} need a cost-model config, not an instance"
            )
        return spec
    if isinstance(spec, str | Path):
        path = constants_path(spec)
        config = read_yaml_mapping(path, "cost-model config")
        source = str(spec)
    elif isinstance(spec, Mapping):
        config, source = dict(spec), name or "cost model config"
    else:
        raise LayoutSearchError(
            f"{setting}={spec!r}: must be a name (e.g. 'analytic'), a YAML path, a config "
            "mapping with _target_, or a cost model instance"
        )
    config.update(settings)
    target = config.pop("_target_", None)
    if target is None and "megatron_path" in config:
        raise LayoutSearchError(
            f"{source}: these are the Megatron-LM backend's settings (where Megatron-LM is, "
            "how trials launch), not a cost model; launch layouts with cost_models=measured, "
            "which reads them"
        )
    if target is None:
        # A mapping of settings alone ({"name": "replay", "path": ...}): say how to name one.
        raise LayoutSearchError(
            f"{source}: a cost-model mapping names its class with _target_ (one of "
            f"{', '.join(sorted(COST_MODEL_TARGETS))}), e.g. {{'_target_': "
            "'layoutsearch.costs.replay.ReplayCostModel', 'path': 'runs.csv'}; or pass a "
            "cost model: layoutsearch.costs.ReplayCostModel.load('runs.csv'), or a name of "
            "cost_models/ ('analytic')")
    if target not in COST_MODEL_TARGETS:
        raise LayoutSearchError(
            f"{source}: _target_={target!r} is not a registered cost model; "
            f"registered: {', '.join(sorted(COST_MODEL_TARGETS))}"
        )
    return COST_MODEL_TARGETS[target](config, source=source)


__all__ = [
    "PREDICTION_COLUMNS", "AnalyticCostModel", "CostModel", "ReplayCostModel", "build_cost_model",
]
