"""Paths: where the Hydra config groups live, and whether a file to be written can be.

In a checkout (editable install) `search_spaces/` and `cost_models/` sit at the repository
root; a wheel carries them inside the package as `layoutsearch/_configs/` (see pyproject's
force-include).

    config_dir("cost_models") / "analytic.yaml"
    unwritable_file("runs/measurements.csv")  # None, or why not
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def config_root() -> Path:
    """The folder that holds `search_spaces/` and `cost_models/`."""
    bundled = _PACKAGE / "_configs"
    return bundled if (bundled / "cost_models").is_dir() else _PACKAGE.parent


def config_dir(group: str) -> Path:
    return config_root() / group


def unwritable_file(path: str | Path) -> str | None:
    """Why a file cannot be created or appended to at `path` (None: it can), asked before
    the work whose result goes there (a fit, a training run), not after it."""
    try:
        return _unwritable(Path(path), str(path))
    except OSError as error:  # a name the file system refuses (too long, say)
        return f"cannot be used ({error.strerror or error})"


def _unwritable(path: Path, text: str) -> str | None:
    if text.endswith(("/", "\\")) or path.is_dir():
        return "is a folder, not a file"
    if path.exists():
        return None if os.access(path, os.W_OK) else "is not writable"
    folder = path.parent
    while not folder.exists():  # the folders still to be made
        folder = folder.parent
    if not folder.is_dir():
        return f"lies under {folder}, which is a file, not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"lies in the folder {folder}, which is not writable"
    return None
