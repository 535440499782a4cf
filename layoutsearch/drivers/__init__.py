"""Drivers propose layouts and collect their prices: grid, and more by registration.

A driver has a `name` and `run(problem) -> DataFrame` (one row per evaluated layout).

    driver = build_driver("grid")
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import pandas as pd

from layoutsearch.drivers.grid import GridDriver
from layoutsearch.drivers.paper import PaperDriver
from layoutsearch.errors import LayoutSearchError, unknown_name_message
from layoutsearch.problem import SearchProblem


@runtime_checkable
class Driver(Protocol):
    name: str

    def run(self, problem: SearchProblem) -> pd.DataFrame: ...


def _optuna_class() -> Callable[..., Driver]:
    # Imported on use: optuna adds ~0.2 s to `import layoutsearch` for grid-only users.
    from layoutsearch.drivers.optuna import OptunaDriver

    return OptunaDriver


def _optuna_driver(**settings: Any) -> Driver:
    return _optuna_class()(**settings)


DRIVERS: dict[str, Callable[..., Driver]] = {
    "grid": GridDriver, "paper": PaperDriver, "optuna": _optuna_driver,
}
"""Driver name -> factory taking the driver's settings as keywords."""


def build_driver(spec: str | Mapping[str, Any] | Driver, **settings: Any) -> Driver:
    """A driver from its name (`grid`), a config mapping with `name`, or an instance."""
    if isinstance(spec, Driver) and not isinstance(spec, str | Mapping):
        return spec
    if isinstance(spec, Mapping):
        settings = {**{k: v for k, v in spec.items() if k not in ("name", "_target_")}, **settings}
        spec = str(spec.get("name", ""))
    if not isinstance(spec, str):  # a list or a number would fail the lookup with a TypeError
        raise LayoutSearchError(f"driver={spec!r}: must be a name ({', '.join(DRIVERS)}), a "
                                "mapping with its name and settings, or a driver instance")
    if spec not in DRIVERS:
        raise LayoutSearchError(unknown_name_message("driver", str(spec), DRIVERS))
    try:
        return DRIVERS[spec](**settings)
    except TypeError as error:
        built = _optuna_class() if spec == "optuna" else DRIVERS[spec]
        accepted = set(inspect.signature(built).parameters)
        unknown = sorted(set(settings) - accepted)
        if unknown and not accepted:
            raise LayoutSearchError(f"driver={spec} takes no settings, got {unknown[0]!r}"
                                    ) from None
        if unknown:
            raise LayoutSearchError(unknown_name_message(f"driver={spec} setting", unknown[0],
                                                         accepted)) from None
        raise LayoutSearchError(f"driver {spec!r}: {error}") from None


__all__ = ["DRIVERS", "Driver", "GridDriver", "PaperDriver", "build_driver"]
