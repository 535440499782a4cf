"""Where the Hydra config groups `search_spaces/` and `cost_models/` live.

In a checkout (editable install) they sit at the repository root; a wheel carries them
inside the package as `layoutsearch/_configs/` (see pyproject's force-include).

    config_dir("cost_models") / "analytic.yaml"
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def config_root() -> Path:
    """The folder that holds `search_spaces/` and `cost_models/`."""
    bundled = _PACKAGE / "_configs"
    return bundled if (bundled / "cost_models").is_dir() else _PACKAGE.parent


def config_dir(group: str) -> Path:
    return config_root() / group
