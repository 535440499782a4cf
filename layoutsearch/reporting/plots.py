"""The report's figures, drawn on `matplotlib.figure.Figure` objects (no pyplot, no display).

Each function returns a Figure a notebook can show and `save_figures` writes as PNG:
the time and memory breakdowns of a few layouts as stacked bars, MFU against peak memory for
every priced candidate, and the best MFU of each tp × pp cell as a heatmap.

    fig = mfu_memory_figure(ranked, gpu_memory_gib=80.0)
    paths = save_figures(ranked, out_dir, gpu_memory_gib=80.0)
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from layoutsearch.reporting.explain import (
    component_name,
    label,
    memory_columns,
    require_ranking,
    time_columns,
)

DPI = 110
X_RANGE_OF_LIMIT = 2.5
"""The MFU-memory plot shows memory up to this multiple of the GPU's capacity, or of the
smallest footprint when every layout needs more than the GPU holds."""
CMAP = "tab20"  # 20 distinct colours: enough for every breakdown component


def _stacked(ax: Axes, bars: Sequence[tuple[str, pd.Series]], columns: list[str]) -> None:
    colours = [colormaps[CMAP](i % 20) for i in range(len(columns))]
    names = [name for name, _ in bars]
    left = np.zeros(len(bars))
    for column, colour in zip(columns, colours, strict=True):
        values = np.array([float(row.get(column, 0.0) or 0.0) for _, row in bars])
        if not values.any():
            continue  # a component that is zero everywhere only clutters the legend
        ax.barh(names, values, left=left, color=colour, label=component_name(column),
                edgecolor="white", linewidth=0.5)
        left += values


def breakdown_figure(bars: Sequence[tuple[str, pd.Series]], *, gpu_memory_gib: float) -> Figure:
    """Stacked bars: where each layout's step time and per-GPU memory go."""
    height = 1.2 + 0.6 * len(bars)
    fig = Figure(figsize=(12, 2 * height + 0.6), dpi=DPI, layout="constrained")
    time_ax, memory_ax = fig.subplots(2, 1)
    frame = pd.DataFrame([row for _, row in bars])
    bars = [(f"{name}\n{label(row)}", row) for name, row in bars]
    _stacked(time_ax, bars, time_columns(frame))
    time_ax.set_xlabel("time per optimizer step (s)")
    time_ax.set_title("Step time breakdown")
    _stacked(memory_ax, bars, memory_columns(frame))
    memory_ax.axvline(gpu_memory_gib, color="black", linestyle="--", linewidth=1.2,
                      label=f"GPU memory ({gpu_memory_gib:g} GiB)")
    memory_ax.set_xlabel("peak memory per GPU (GiB)")
    memory_ax.set_title("Memory breakdown (the GPU with the highest peak)")
    for ax in (time_ax, memory_ax):
        ax.invert_yaxis()  # the first bar (the best layout) on top
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Where the time and memory of each layout go")
    return fig


def mfu_memory_figure(ranked: pd.DataFrame, *, gpu_memory_gib: float,
                      marks: Sequence[tuple[str, pd.Series]] = ()) -> Figure:
    """MFU against peak memory per GPU for every priced candidate, fitting or not."""
    require_ranking(ranked, "mfu_memory_figure(ranked)")
    fig = Figure(figsize=(8, 5.5), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    priced = ranked[ranked["mfu"].notna() & ranked["peak_memory_gib"].notna()]
    fits = priced["fits"].astype(bool)
    # Layouts that need many times the GPU's memory would squash the interesting part of
    # the axis; they are drawn at its right edge instead. Where every layout is over the
    # limit (a model state alone over it), the interesting part starts at the smallest
    # footprint: an axis of the GPU's capacity would draw every layout at its edge.
    anchor = max(gpu_memory_gib, float(priced["peak_memory_gib"].min()) if len(priced) else 0.0)
    x_max = max(X_RANGE_OF_LIMIT * anchor, float(priced.loc[fits, "peak_memory_gib"]
                                                 .max() if fits.any() else 0.0) * 1.05)
    memory = priced["peak_memory_gib"].clip(upper=x_max)
    beyond = priced["peak_memory_gib"] > x_max
    ax.scatter(memory[fits], 100 * priced.loc[fits, "mfu"], s=14, alpha=0.6, color="tab:blue",
               label=f"fits ({int(fits.sum())} layouts)")
    ax.scatter(memory[~fits & ~beyond], 100 * priced.loc[~fits & ~beyond, "mfu"], s=14,
               marker="x", alpha=0.5, color="tab:red",
               label=f"does not fit ({int((~fits & ~beyond).sum())} layouts)")
    if beyond.any():
        ax.scatter(memory[beyond], 100 * priced.loc[beyond, "mfu"], s=18, marker=">",
                   alpha=0.5, color="tab:red",
                   label=f"needs > {x_max:.0f} GiB ({int(beyond.sum())} layouts, at the edge)")
    ax.axvline(gpu_memory_gib, color="black", linestyle="--", linewidth=1.2,
               label=f"GPU memory limit ({gpu_memory_gib:g} GiB)")
    for (name, row), marker in zip(marks, ("*", "D", "s", "^"), strict=False):
        ax.scatter([row["peak_memory_gib"]], [100 * row["mfu"]], s=180 if marker == "*" else 70,
                   marker=marker, color="gold", edgecolor="black", zorder=5,
                   label=f"{name}: {label(row)}")
    ax.set_xlim(0, x_max * 1.03)
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("MFU (%)")
    unpriced = len(ranked) - len(priced)
    ax.set_title("MFU vs peak memory of every priced layout"
                 + (f"\n({unpriced} layouts break a rule and are not priced)" if unpriced else ""))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8, frameon=False)
    return fig


def tp_pp_heatmap(ranked: pd.DataFrame) -> Figure:
    """The best MFU that fits in each tp × pp cell (blank where nothing fits)."""
    require_ranking(ranked, "tp_pp_heatmap(ranked)")
    feasible = ranked[ranked["fits"].astype(bool)]
    tps = sorted(set(ranked["tp"]))
    pps = sorted(set(ranked["pp"]))
    grid = (feasible.groupby(["pp", "tp"])["mfu"].max().unstack("tp")
            .reindex(index=pps, columns=tps) * 100)
    fig = Figure(figsize=(1.6 * len(tps) + 3, 0.7 * len(pps) + 2.2), dpi=DPI,
                 layout="constrained")
    ax = fig.subplots()
    values = grid.to_numpy(dtype=float)
    image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", aspect="auto")
    ax.set_facecolor("#dddddd")
    priced = ranked[ranked["mfu"].notna()].groupby(["pp", "tp"]).size()
    # A cell that was never priced broke a rule everywhere; name its most common one.
    rule = ranked.groupby(["pp", "tp"])["reason"].agg(lambda r: r.str.split("; ").str[0].mode()[0])
    for (i, j), value in np.ndenumerate(values):
        cell = (pps[i], tps[j])
        empty = "does not fit" if cell in priced.index else textwrap.fill(
            str(rule.get(cell, "no layout")), 24)
        text = empty if np.isnan(value) else f"{value:.1f}"
        colour = "black" if np.isnan(value) or value > np.nanmean(values) else "white"
        ax.text(j, i, text, ha="center", va="center", fontsize=9 if "\n" not in text else 7,
                color=colour)
    ax.set_xticks(range(len(tps)), [str(t) for t in tps])
    ax.set_yticks(range(len(pps)), [str(p) for p in pps])
    ax.set_xlabel("tensor parallel size tp")
    ax.set_ylabel("pipeline parallel size pp")
    ax.set_title("Best MFU (%) per tp × pp (other knobs at their best)")
    if np.isfinite(values).any():  # nothing fits: no MFU for a colour scale to show
        fig.colorbar(image, ax=ax, label="best MFU (%)")
    return fig


FIGURE_NAMES = ("mfu_vs_memory", "tp_pp_heatmap", "breakdown")
"""The report's figures, each saved as `<name>.png` beside report.md."""
MFU_VS_MEMORY, TP_PP_HEATMAP, BREAKDOWN = FIGURE_NAMES


def save_figures(ranked: pd.DataFrame, out_dir: Path, *, gpu_memory_gib: float,
                 bars: Sequence[tuple[str, pd.Series]],
                 marks: Sequence[tuple[str, pd.Series]]) -> dict[str, Path]:
    """Write the report's PNGs into `out_dir` (`<name>.png`, names from FIGURE_NAMES);
    returns figure name -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {MFU_VS_MEMORY: mfu_memory_figure(ranked, gpu_memory_gib=gpu_memory_gib,
                                                marks=marks),
               TP_PP_HEATMAP: tp_pp_heatmap(ranked)}
    if bars:  # a cost model without breakdown columns, or nothing fits: no bars to stack
        figures[BREAKDOWN] = breakdown_figure(bars, gpu_memory_gib=gpu_memory_gib)
    paths = {}
    for name, figure in figures.items():
        paths[name] = out_dir / f"{name}.png"
        figure.savefig(paths[name])
    return paths
