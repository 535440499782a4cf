"""Where options are looked up by name: the shipped folders, then the user's."""

from __future__ import annotations

from pathlib import Path

import pytest

import layoutsearch
from layoutsearch.errors import LayoutSearchError
from layoutsearch.paths import (
    config_dir,
    config_folders,
    option_files,
    option_mapping,
    read_yaml_mapping,
)


def test_a_users_folder_adds_options_and_a_shipped_name_wins_as_in_hydra(
        tmp_path: Path) -> None:
    (tmp_path / "cost_models").mkdir()
    (tmp_path / "cost_models" / "mine.yaml").write_text("{}\n")
    (tmp_path / "cost_models" / "analytic.yaml").write_text("{}\n")
    assert "mine" not in option_files("cost_models")
    with config_folders([tmp_path]):
        files = option_files("cost_models")
        assert files["mine"] == tmp_path / "cost_models" / "mine.yaml"
        assert files["analytic"] == config_dir("cost_models") / "analytic.yaml"
        assert list(files) == sorted(files)
    assert "mine" not in option_files("cost_models")  # only while the block runs


def test_a_file_that_cannot_be_read_is_no_option_mapping(tmp_path: Path) -> None:
    for name, text in (("broken", "a: [\n"), ("number", "5\n"), ("list", "- 1\n")):
        (tmp_path / f"{name}.yaml").write_text(text)
        assert option_mapping(tmp_path / f"{name}.yaml") is None
    assert option_mapping(tmp_path / "missing.yaml") is None
    (tmp_path / "ok.yaml").write_text("a: 1\n")
    assert option_mapping(tmp_path / "ok.yaml") == {"a": 1}


@pytest.mark.parametrize("text, message", [
    (": : :\n", "is not valid YAML: while parsing a block mapping"),
    ("- a\n", "must hold a mapping of settings (name: value), not a list"),
    ("3\n", "must hold a mapping of settings (name: value), not an int"),
])
def test_a_yaml_file_that_is_no_mapping_is_refused_by_name(tmp_path: Path, text: str,
                                                          message: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(LayoutSearchError) as error:
        read_yaml_mapping(path, "cost-model config")
    assert str(error.value).startswith(f"cost-model config {str(path)!r} ")
    assert message in str(error.value)
    # The same file named as a cost model says so, not a parser's traceback.
    with pytest.raises(LayoutSearchError, match="cost-model config"):
        layoutsearch.search(model="llama_7b", num_gpus=8, seq_length=2048,
                            global_batch_size=64, cost_model=str(path))


def test_an_empty_yaml_file_is_an_empty_mapping(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing yet\n")
    assert read_yaml_mapping(path, "search space") == {}
