"""Packaging: every config group is found and every YAML in it loads; the wheel ships them.

Builds nothing: the wheel's layout is checked against pyproject's settings, and the
groups against `layoutsearch.paths.config_root()` (the checkout here, `_configs/` in a wheel).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from layoutsearch.catalog import cluster_names, load_cluster, load_model, model_names
from layoutsearch.cli import GROUP_DIRS, group_options
from layoutsearch.costs import COST_MODEL_TARGETS, build_cost_model
from layoutsearch.drivers import build_driver
from layoutsearch.errors import LayoutSearchError
from layoutsearch.paths import config_dir, config_root
from layoutsearch.space import SearchSpace

ROOT = Path(__file__).resolve().parents[1]


def test_config_root_holds_both_top_level_groups() -> None:
    for group in ("search_spaces", "cost_models"):
        assert (config_root() / group).is_dir()
        assert config_dir(group) == GROUP_DIRS[group]()
        assert group_options(group), f"{group}/ has no YAML file"


@pytest.mark.parametrize("name", group_options("search_spaces"))
def test_every_search_space_loads(name: str) -> None:
    assert SearchSpace.load(name).size() > 0


@pytest.mark.parametrize("name", group_options("cost_models"))
def test_every_cost_model_builds_or_says_what_is_missing(name: str) -> None:
    config = yaml.safe_load((config_dir("cost_models") / f"{name}.yaml").read_text())
    if "_target_" not in config:  # settings shared by cost models (megatron.yaml): not one
        with pytest.raises(LayoutSearchError, match="not a cost model"):
            build_cost_model(name)
        return
    assert config["_target_"] in COST_MODEL_TARGETS
    try:
        build_cost_model(name)
    except LayoutSearchError as error:
        # Only a setting the file leaves null may stop it (`cost_models.path=runs.csv`): named.
        unset = [key for key, value in config.items() if value is None]
        assert any(key in str(error) for key in unset), error


@pytest.mark.parametrize("name", model_names())
def test_every_catalog_model_loads_under_its_file_name(name: str) -> None:
    assert load_model(name).name == name


@pytest.mark.parametrize("name", cluster_names())
def test_every_catalog_cluster_loads_under_its_file_name(name: str) -> None:
    assert load_cluster(name).name == name


@pytest.mark.parametrize("name", group_options("driver"))
def test_every_driver_config_builds(name: str) -> None:
    config = yaml.safe_load((GROUP_DIRS["driver"]() / f"{name}.yaml").read_text())
    assert build_driver(config).name == name


def test_the_wheel_ships_the_groups_the_package_looks_for() -> None:
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"][
        "targets"]["wheel"]
    # config_root() looks for `layoutsearch/_configs/<group>` inside an installed package.
    assert wheel["force-include"] == {
        group: f"layoutsearch/_configs/{group}" for group in ("search_spaces", "cost_models")
    }
    # The catalog and the primary config are package data; the config source is a plugin.
    assert set(wheel["packages"]) == {"layoutsearch", "hydra_plugins"}
    assert (ROOT / "hydra_plugins" / "layoutsearch_configs" / "__init__.py").is_file()
    assert not (ROOT / "hydra_plugins" / "__init__.py").exists()  # a namespace package
