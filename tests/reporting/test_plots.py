"""The report's figures hold data: bars that add up, points, a filled heatmap."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from matplotlib.image import AxesImage

import layoutsearch
from layoutsearch.reporting.explain import memory_columns, time_columns
from layoutsearch.reporting.plots import breakdown_figure, mfu_memory_figure, tp_pp_heatmap


@pytest.fixture(scope="module")
def ranked() -> pd.DataFrame:
    return layoutsearch.search(model="llama_13b", num_gpus=64, seq_length=8192,
                               global_batch_size=512, vocab_size=128000)


def test_breakdown_bars_add_up_to_step_time_and_memory(ranked: pd.DataFrame) -> None:
    best = ranked.iloc[0]
    fig = breakdown_figure([("best", best)], gpu_memory_gib=80.0)
    time_ax, memory_ax = fig.axes
    widths = sum(p.get_width() for p in time_ax.patches)
    assert widths == pytest.approx(sum(best[c] for c in time_columns(ranked)))
    memory = sum(p.get_width() for p in memory_ax.patches)
    assert memory == pytest.approx(sum(best[c] for c in memory_columns(ranked)))
    assert time_ax.get_xlabel().endswith("(s)") and memory_ax.get_xlabel().endswith("(GiB)")
    assert time_ax.get_legend() is not None and memory_ax.get_legend() is not None


def test_mfu_memory_plot_has_every_priced_layout(ranked: pd.DataFrame) -> None:
    fig = mfu_memory_figure(ranked, gpu_memory_gib=80.0, marks=[("best", ranked.iloc[0])])
    ax = fig.axes[0]
    points = sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection))
    priced = int((ranked["mfu"].notna() & ranked["peak_memory_gib"].notna()).sum())
    assert points == priced + 1  # every priced layout plus the best marked once more
    assert any(line.get_xdata()[0] == 80.0 for line in ax.get_lines())  # the memory limit
    assert ax.get_ylabel() == "MFU (%)"


def test_heatmap_cells_are_the_best_mfu_per_tp_pp(ranked: pd.DataFrame) -> None:
    fig = tp_pp_heatmap(ranked)
    image = next(a for a in fig.axes[0].get_children() if isinstance(a, AxesImage))
    values = np.ma.filled(image.get_array(), np.nan)
    assert np.nanmax(values) == pytest.approx(100 * ranked["mfu"].iloc[0])
    # Rows pp, columns tp, ascending; each cell the best MFU (%) of the layouts that fit
    # there, blank where none does.
    tps, pps = sorted(set(ranked["tp"])), sorted(set(ranked["pp"]))
    assert values.shape == (len(pps), len(tps))
    for i, pp in enumerate(pps):
        for j, tp in enumerate(tps):
            cell = ranked[(ranked["tp"] == tp) & (ranked["pp"] == pp) & ranked["fits"]]
            if cell.empty:
                assert np.isnan(values[i, j]), (tp, pp)
            else:
                assert values[i, j] == pytest.approx(100 * cell["mfu"].max()), (tp, pp)
    assert np.isfinite(values).sum() >= 2 and np.isnan(values).any()


def test_the_memory_limit_is_labelled_with_the_capacity_it_is_drawn_at(
        ranked: pd.DataFrame) -> None:
    # An H100 holds 79.6 GiB: the rows' "needs 81.8 GiB > 79.6 GiB" and their headroom are
    # against that, so the line's label must not round it to 80.
    best = ranked.iloc[0]
    labels = [t.get_text() for ax in breakdown_figure([("best", best)], gpu_memory_gib=79.6).axes
              for t in ax.get_legend().get_texts()]
    assert "GPU memory (79.6 GiB)" in labels
    ax = mfu_memory_figure(ranked, gpu_memory_gib=79.6).axes[0]
    assert "GPU memory limit (79.6 GiB)" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_heatmap_where_nothing_fits_has_no_mfu_scale(ranked: pd.DataFrame) -> None:
    # Every cell is grey and says why: a colour bar would show an MFU scale of -0.1 to 0.1 %.
    fig = tp_pp_heatmap(ranked.assign(fits=False))
    assert len(fig.axes) == 1
    assert len(tp_pp_heatmap(ranked).axes) == 2  # the heatmap and its colour bar


def test_an_mfu_memory_plot_where_every_layout_is_over_the_limit_shows_their_footprints(
) -> None:
    # 405B on 8 A100s: every footprint is 782 GiB or more. An axis of 2.5 × 80 GiB drew all
    # of them at its 200 GiB edge; it reaches 2.5 × the smallest footprint instead.
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        stuck = layoutsearch.search(model="llama3_405b", cluster="a100_80gb", num_gpus=8,
                                    seq_length=8192, global_batch_size=64)
    ax = mfu_memory_figure(stuck, gpu_memory_gib=80.0).axes[0]
    smallest = float(stuck["peak_memory_gib"].min())
    assert ax.get_xlim()[1] == pytest.approx(2.5 * smallest * 1.03)
    drawn = np.concatenate([c.get_offsets()[:, 0] for c in ax.collections
                            if isinstance(c, PathCollection) and len(c.get_offsets())])
    assert drawn.min() == pytest.approx(smallest)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    within = int((stuck["peak_memory_gib"] <= 2.5 * smallest).sum())
    assert f"does not fit ({within} layouts)" in labels
