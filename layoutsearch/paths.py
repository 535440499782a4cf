"""Paths: where the Hydra config groups live, and whether a file to be written can be.

In a checkout (editable install) `search_spaces/` and `cost_models/` sit at the repository
root; a wheel carries them inside the package as `layoutsearch/_configs/` (see pyproject's
force-include). A name given in a setting (`cost_models.megatron=mine`,
`cost_models.prescreen=my_fit`) is looked up there and, while `config_folders` is in effect
(the command's `--config-dir` and the `file://` and `pkg://` folders of
`hydra.searchpath`), in the user's folders too.

    config_dir("cost_models") / "analytic.yaml"
    with config_folders([Path("my_configs")]):
        option_files("cost_models")["mine"]   # my_configs/cost_models/mine.yaml
    unwritable_file("runs/measurements.csv")  # None, or why not
    unwritable_folder("outputs/run")          # None, or why not
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import yaml

from layoutsearch.errors import LayoutSearchError, type_of

_PACKAGE = Path(__file__).resolve().parent
_USER_FOLDERS: ContextVar[tuple[Path, ...]] = ContextVar("layoutsearch_config_folders",
                                                         default=())


def config_root() -> Path:
    """The folder that holds `search_spaces/` and `cost_models/`."""
    bundled = _PACKAGE / "_configs"
    return bundled if (bundled / "cost_models").is_dir() else _PACKAGE.parent


def config_dir(group: str) -> Path:
    return config_root() / group


@contextlib.contextmanager
def config_folders(folders: Iterable[str | Path]) -> Iterator[None]:
    """Within the block, names of options are also looked for in `folders`, each holding
    `<group>/<name>.yaml` as a `--config-dir` does."""
    token = _USER_FOLDERS.set(tuple(Path(f).expanduser() for f in folders))
    try:
        yield
    finally:
        _USER_FOLDERS.reset(token)


def package_folder(package: str) -> Path | None:
    """The folder of a `pkg://` search-path entry (`my_project.conf`, a package or a folder
    in one, as Hydra imports it); None where it cannot be found or is not a folder on disk
    (a package inside a zip)."""
    try:
        spec = importlib.util.find_spec(package.replace("/", ".").rstrip("."))
    except (ImportError, ValueError):
        return None
    # A package's folders; a folder without __init__.py (a namespace package) has them too.
    folders = [Path(f) for f in (spec.submodule_search_locations or [])] if spec else []
    return next((f for f in folders if f.is_dir()), None)


def option_files(group: str) -> dict[str, Path]:
    """The options of `group` by name, sorted: the shipped ones, then the user's folders'
    (`config_folders`). As in Hydra's search path, the first file of a name wins."""
    files: dict[str, Path] = {}
    for folder in (config_dir(group), *(f / group for f in _USER_FOLDERS.get())):
        for path in sorted(folder.glob("*.yaml")):
            files.setdefault(path.stem, path)
    return dict(sorted(files.items()))


def option_mapping(path: Path) -> dict[str, Any] | None:
    """An option file's YAML mapping; None for one that cannot be read or is no mapping (a
    user's work in progress beside the options: Hydra reads only the option chosen)."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return config if isinstance(config, dict) else None


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """A YAML file's top-level mapping ({} for an empty file). A file that cannot be read,
    is not YAML or holds no mapping is refused, naming `what` it is and its path."""
    try:
        with path.open() as handle:  # a parse error then names the file and line
            config = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError) as error:
        raise LayoutSearchError(f"{what} {str(path)!r} cannot be read: {error}") from None
    except yaml.YAMLError as error:
        raise LayoutSearchError(f"{what} {str(path)!r} is not valid YAML: "
                                f"{' '.join(str(error).split())}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise LayoutSearchError(f"{what} {str(path)!r} must hold a mapping of settings "
                                f"(name: value), not {type_of(config)}")
    return config


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
    if path.exists() and not path.is_file():
        return "is not a regular file (a pipe or a device: writing to it would block or be lost)"
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


def unwritable_folder(path: str | Path) -> str | None:
    """Why the outputs cannot go into a folder at `path` (None: they can): it, or the
    nearest existing path above it, is a file, a dangling link or a folder that cannot be
    written in. Asked before the work whose outputs go there, which would otherwise end in
    Python's NotADirectoryError or FileExistsError."""
    path = Path(path).expanduser()
    existing = next(p for p in (path, *path.parents)
                    if p.exists() or p.is_symlink() or p == Path("."))
    if existing.is_symlink() and not existing.exists():
        return (f"{existing} is a symbolic link to {os.readlink(existing)}, which does not "
                "exist; make that folder, or name another")
    if not existing.is_dir():
        named = "is a file" if existing == path else f"lies under {existing}, a file"
        return f"{named}; the outputs go into a folder (name a new or existing folder)"
    if existing != path and not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot make it: {existing} is not writable; name a folder where you may write"
    return None
