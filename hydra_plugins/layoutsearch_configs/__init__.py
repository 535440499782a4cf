"""Lets Hydra find layoutsearch's config groups, from a checkout and from an installed wheel.

The groups live in different folders: `model` and `cluster` in the package's catalog,
`search_spaces` and `cost_models` in `layoutsearch.paths.config_root()` (the repository
root of a checkout, `layoutsearch/_configs/` inside a wheel), `driver` beside the primary
config. `layoutsearch.cli.GROUP_DIRS` names them; a config source of scheme
`layoutsearch://` serves exactly those groups (a `file://` path to the repository root would
also expose every other folder of the checkout as a group), and a search-path plugin adds it
to the `layoutsearch` application only. Hydra discovers both in the `hydra_plugins`
namespace package.

    layoutsearch model=llama_65b cluster=h100_sxm search_spaces=default cost_models=analytic
    layoutsearch --info searchpath    # shows provider=layoutsearch, path=layoutsearch://groups
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

# The primary config folder of layoutsearch.cli as Hydra names it: "pkg://layoutsearch.conf"
# (the console script and `python -m layoutsearch.cli` both run it as a module), or a
# "file://.../layoutsearch/conf" path where an application names the folder itself.
_MAIN_CONFIG_SUFFIXES = ("layoutsearch.conf", "layoutsearch/conf")


def _group_dirs() -> dict[str, Path]:
    # Imported late: Hydra imports this module for every application in the environment.
    from layoutsearch.cli import GROUP_DIRS

    return {group: folder() for group, folder in GROUP_DIRS.items()}


class LayoutSearchConfigSource(ConfigSource):
    """`layoutsearch://groups`: each config group of layoutsearch, read from its own folder."""

    @staticmethod
    def scheme() -> str:
        return "layoutsearch"

    def _resolve(self, config_path: str) -> Path | None:
        group, _, rest = config_path.strip("/").partition("/")
        folder = _group_dirs().get(group)
        return None if folder is None else folder / rest

    def load_config(self, config_path: str) -> ConfigResult:
        path = self._resolve(self._normalize_file_name(config_path))
        if path is None or not path.is_file():
            raise ConfigLoadError(f"Config not found : {self.full_path()}/{config_path}")
        text = path.read_text(encoding="utf-8")
        return ConfigResult(
            config=OmegaConf.create(text),
            path=self.full_path(),
            provider=self.provider,
            header=ConfigSource._get_header_dict(text[:512]),
        )

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        if not config_path.strip("/"):
            return True
        path = self._resolve(config_path)
        return path is not None and path.is_dir()

    def is_config(self, config_path: str) -> bool:
        path = self._resolve(self._normalize_file_name(config_path))
        return path is not None and path.is_file()

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        prefix = config_path.strip("/")
        if prefix:
            folder = self._resolve(prefix)
            names = [p.name for p in folder.iterdir()] if folder and folder.is_dir() else []
        else:
            names = list(_group_dirs())
        found: list[str] = []
        for name in names:
            self._list_add_result(
                files=found,
                file_path=f"{prefix}/{name}" if prefix else name,
                file_name=name,
                results_filter=results_filter,
            )
        return sorted(set(found))


class LayoutSearchSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        ours = any(
            element.provider == "main" and element.path.rstrip("/").endswith(_MAIN_CONFIG_SUFFIXES)
            for element in search_path.get_path()
        )
        if ours:
            search_path.append(provider="layoutsearch", path="layoutsearch://groups")
