"""The notebooks run clean on a CPU, show their figures, and are stored without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
FIGURES = {"01_quickstart.ipynb": 3, "02_reproduce_the_study.ipynb": 5, "03_what_if.ipynb": 4}
"""Each notebook's figures; every one must reach the output as a PNG."""
SHOWN = {
    # The winner's command comes with the environment its run needs, as the CLI prints it.
    "01_quickstart.ipynb": ("emit=megatron writes the sbatch script", "NVTE_FLASH_ATTN=1",
                            "--tensor-model-parallel-size 1"),
    # The GPU comparison says the A100 constants price a slower fabric than the H100 and H200
    # ones, that those two kinds' constants were fitted to no runs, and that the H100's best
    # layout leaves little memory free.
    "03_what_if.ipynb": ("close call, slow fabric", "a-priori constants", "tight memory"),
}
"""Text each notebook's outputs must show."""


def _text(book: nbformat.NotebookNode) -> str:
    """The printed and displayed text of every code cell's outputs, one string."""
    parts = []
    for cell in book.cells:
        for output in cell.outputs if cell.cell_type == "code" else ():
            parts.append(output.get("text", "") + output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def _images(book: nbformat.NotebookNode) -> int:
    return sum("image/png" in output.get("data", {})
               for cell in book.cells if cell.cell_type == "code" for output in cell.outputs)


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_runs_and_shows_its_figures(name: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # 02 reads the study's runs when present; point it at nothing so the test does not
    # depend on /work/shared (the notebook must run on predictions alone).
    monkeypatch.setenv("LAYOUTSEARCH_RUNS", str(tmp_path / "no_runs.csv"))
    monkeypatch.setenv("LAYOUTSEARCH_PROGRESS", "0")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(book, timeout=60, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    # The last cell of each notebook asserts that every figure's axes hold data.
    assert _images(book) >= FIGURES[name]
    text = _text(book)
    assert [shown for shown in SHOWN.get(name, ()) if shown not in text] == []


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_is_stored_without_outputs(name: str) -> None:
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(book)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
