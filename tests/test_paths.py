"""Where options are looked up by name: the shipped folders, then the user's."""

from __future__ import annotations

from pathlib import Path

from layoutsearch.paths import config_dir, config_folders, option_files, option_mapping


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
