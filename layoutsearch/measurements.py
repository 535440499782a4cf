"""The measurement schema (docs/measurements.md): read, validate and complete measurement files.

One row per measured run or predicted layout. Readers name the row (its line in the file
read, else its index label in the frame given) and the column of every bad value; optional
columns get their documented defaults; unknown columns are kept.

    runs = read_measurements("runs.csv")          # validated DataFrame
    runs = validate_measurements(frame, source="my frame")
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.catalog import clusters_by_gpu
from layoutsearch.errors import LayoutSearchError, closest_names, unknown_name_message
from layoutsearch.layout import (
    ATTENTION_KERNELS,
    DATA_PARALLEL_NO_OPS,
    LAYOUT_COLUMNS,
    RECOMPUTE_KINDS,
)
from layoutsearch.specs import LARGEST_SIZE, NORMALIZATIONS, ClusterSpec
from layoutsearch.table_files import (
    LINE_NUMBERS,
    is_parquet,
    keep_lines,
    parse_csv,
    record_lines,
    refuse_repeated_columns,
    row_lines,
    row_names,
    undecodable,
)

INTEGER_COLUMNS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "vocab_size", "seq_length", "num_gpus", "gpus_per_node", "tp", "pp", "dp",
    "micro_batch_size", "global_batch_size",
)
BOOLEAN_COLUMNS = ("swiglu", "untie_embeddings", "sequence_parallel", "rmsnorm_kernel")
TEXT_COLUMNS = ("model", "gpu", "attention", "recompute", "status")
FLOAT_COLUMNS = ("step_time_s", "mfu")
REQUIRED_COLUMNS = (
    "model", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
    "num_query_groups", "vocab_size", "seq_length", "swiglu", "untie_embeddings", "gpu",
    "num_gpus", "gpus_per_node", "tp", "pp", "dp", "micro_batch_size", "global_batch_size",
    "sequence_parallel", "attention", "rmsnorm_kernel", "recompute", "status", "step_time_s",
    "mfu",
)
OPTIONAL_DEFAULTS: dict[str, int | bool | str] = {
    "cp": 1, "vp": 1, "distributed_optimizer": False, "overlap_grad_reduce": False,
    "normalization": "RMSNorm",
}
OPTIONAL_INTEGERS = tuple(c for c, v in OPTIONAL_DEFAULTS.items() if type(v) is int)
OPTIONAL_BOOLEANS = tuple(c for c, v in OPTIONAL_DEFAULTS.items() if type(v) is bool)
STATUSES = ("ok", "oom", "unavailable", "error", "timeout")
PLANNED = "planned"
"""The status `validate_measurements(..., planned=True)` gives the rows of a frame without a
`status` column: layouts not run yet, whose step_time_s and mfu (a search's predictions,
say) are no measurements."""
JOB_KEY = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "vocab_size", "swiglu", "untie_embeddings", "normalization", "seq_length", "gpu",
    "num_gpus", "gpus_per_node", "global_batch_size",
)
"""The columns that make two rows the same job (the free-text `model` name is left out:
a user's model may be named otherwise)."""
MEASUREMENT_KEY = (*JOB_KEY, *LAYOUT_COLUMNS)
"""The columns that make two rows the same measurement: the job and the layout (with the
knobs that change nothing for it `as_searched`)."""


def as_searched(values: Mapping[str, Any] | pd.DataFrame) -> dict[str, Any]:
    """The knobs that change nothing for a layout, as a search keeps them, of one run (a
    row's values) or of a table (its columns): sequence parallelism off at tp = 1 (Megatron-LM
    turns it off there), and at dp·cp = 1 the values of layout.DATA_PARALLEL_NO_OPS. A run
    recorded with either value is a measurement of the layout searched."""
    alone = np.asarray(values["dp"]) * np.asarray(values["cp"]) == 1
    out = {"sequence_parallel": np.asarray(values["sequence_parallel"], dtype=bool)
           & (np.asarray(values["tp"]) > 1)}
    for knob, kept in DATA_PARALLEL_NO_OPS.items():
        out[knob] = np.where(alone, kept, np.asarray(values[knob], dtype=bool))
    return out

_TRUE = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _shown(value: object) -> str:
    """A cell as the user wrote it: 2.5, not np.float64(2.5); an empty cell says so."""
    if value is None or (isinstance(value, float | np.floating) and np.isnan(value)):
        return "an empty cell"
    return repr(value.item() if isinstance(value, np.generic) else value)


def _as_float(frame: pd.DataFrame, column: str, source: str, rows: Sequence[str]) -> pd.Series:
    """A float column; empty cells become NaN, text that is not a number is named."""
    numbers = pd.to_numeric(frame[column], errors="coerce")
    bad = numbers.isna() & frame[column].notna() & (frame[column].astype(str).str.strip() != "")
    if bad.any():
        i = _first(bad)
        raise _fail(source, rows[i], column, f"{_shown(frame[column].iloc[i])} is not a number")
    return numbers


def _lookalikes(frame: pd.DataFrame, wanted: Collection[str]) -> dict[str, list[str]]:
    """The frame's columns outside the schema that nearly name a `wanted` one: column ->
    the names it looks like."""
    schema = {*REQUIRED_COLUMNS, *OPTIONAL_DEFAULTS}
    return {column: close for column in map(str, frame.columns) if column not in schema
            for close in [closest_names(column, wanted)] if close}


def with_default(column: pd.Series, default: int | bool | str) -> pd.Series:
    """An optional column with its blank cells taken as `default`. A column whose cells
    are all blank was read as float64, and a flag's written yes/no as pandas 3's str: a
    flag's or a name's default goes into any but an object column as an object, which
    pandas 3 warns of and pandas 4 refuses to fill into floats or a str column."""
    if type(default) is not int and column.dtype != object:
        column = column.astype(object)
    return column.fillna(default)


def _fail(source: str, row: str, column: str, message: str) -> LayoutSearchError:
    return LayoutSearchError(f"{source}: {row}, column {column!r}: {message}")


def as_bool(frame: pd.DataFrame, column: str, source: str,
            rows: Sequence[str] | None = None) -> pd.Series:
    """A boolean column from True/False, true/false, 1/0, yes/no; names a bad cell by
    `rows` (row_names(frame) when not given)."""
    values = frame[column]
    if values.dtype == bool:
        return values
    out = values.map(_as_bool_cell)
    bad = out.isna()
    if bad.any():
        i = _first(bad)
        shown = _shown(values.iloc[i])
        named = row_names(frame) if rows is None else rows
        raise _fail(source, named[i], column, f"{shown} is not a boolean (True/False/1/0)")
    return out.astype(bool)


def _as_bool_cell(value: object) -> bool | None:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, float | np.floating) and float(value).is_integer():
        value = int(value)  # a 0/1 column with a blank cell reads as 0.0/1.0/NaN
    return _TRUE.get(str(value).strip().lower())


def _as_int(frame: pd.DataFrame, column: str, source: str, rows: Sequence[str]) -> pd.Series:
    numbers = pd.to_numeric(frame[column], errors="coerce")
    # pandas takes True as 1: a flag in a size column (tp=True) is a column mix-up, not tp 1.
    values = frame[column]
    flags = (values.map(lambda value: isinstance(value, bool | np.bool_)).astype(bool)
             if values.dtype in (bool, object) else False)  # numeric columns hold no flag
    bad = (numbers.isna() | (numbers % 1 != 0) | (numbers <= 0) | (numbers > LARGEST_SIZE)
           | flags)
    if bad.any():
        i = _first(bad)
        raise _fail(source, rows[i], column, f"{_shown(frame[column].iloc[i])} is not a "
                                              f"positive integer of at most 2**53")
    return numbers.astype(np.int64)


def validate_measurements(
        frame: pd.DataFrame, source: str = "measurements",
        gpus: Collection[str] | Mapping[str, ClusterSpec] | None = None, *,
        planned: bool = False) -> pd.DataFrame:
    """A checked, typed copy of a measurement-schema frame with optional columns filled.

    `gpus`, when given, are the GPU kinds a row may name (those a cost model can price);
    one name alone is taken as one kind, not as its letters. The step time and MFU of each
    ok row must agree (`check_units`), by the peaks of `gpus` where it maps names to
    ClusterSpecs, else of the catalog's GPUs. With `planned`, a frame without a `status`
    column is taken as layouts not run yet: status PLANNED, no step time or MFU.
    """
    if isinstance(gpus, str):
        gpus = [gpus]
    refuse_repeated_columns(source, frame.columns)
    unrun = planned and "status" not in frame.columns
    if unrun:
        frame = frame.assign(status=PLANNED, step_time_s=np.nan, mfu=np.nan)
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        hints = "".join(f"; column {column!r} looks like {' or '.join(close)}"
                        for column, close in _lookalikes(frame, missing).items())
        raise LayoutSearchError(
            f"{source}: missing required column(s) {', '.join(missing)}{hints} "
            "(see the measurement schema, docs/measurements.md)"
        )
    absent = [c for c in OPTIONAL_DEFAULTS if c not in frame.columns]
    misnamed = _lookalikes(frame, absent)
    if misnamed:
        # Unknown columns are kept, but one that nearly names an absent optional column is
        # most likely that column: unchecked, every row would take its default instead.
        column, (meant, *_) = next(iter(misnamed.items()))
        raise LayoutSearchError(
            f"{source}: column {column!r} looks like the optional column {meant!r}, which "
            f"this file lacks, so every row would take its default "
            f"{meant}={OPTIONAL_DEFAULTS[meant]}; rename the column, or drop it")
    rows = row_names(frame)
    out = frame.copy().reset_index(drop=True)
    for column, default in OPTIONAL_DEFAULTS.items():
        out[column] = with_default(out[column], default) if column in out.columns else default
    for column in (*INTEGER_COLUMNS, *OPTIONAL_INTEGERS):
        out[column] = _as_int(out, column, source, rows)
    for column in (*BOOLEAN_COLUMNS, *OPTIONAL_BOOLEANS):
        out[column] = as_bool(out, column, source, rows)
    for column in (*TEXT_COLUMNS, "normalization"):
        blank = out[column].isna()
        if blank.any():
            raise _fail(source, rows[_first(blank)], column, "is empty")
        out[column] = out[column].astype(str).str.strip()
    for column in FLOAT_COLUMNS:
        out[column] = _as_float(out, column, source, rows)
    _check_values(out, source, rows, statuses=(PLANNED,) if unrun else STATUSES)
    _check_full_recompute(out, source, rows)
    if gpus is not None:
        unknown = ~out["gpu"].isin(list(gpus))
        if unknown.any():
            i = _first(unknown)
            name = str(out["gpu"].iloc[i])
            raise _fail(source, rows[i], "gpu", unknown_name_message("gpu", name, gpus))
    clusters = gpus if isinstance(gpus, Mapping) else clusters_by_gpu()
    check_units(out, clusters, source, names=rows)
    # The copy is numbered 0..n-1: each row keeps the line it came from under its new label,
    # so that a later check of a filtered frame (calibration) still names the file's line.
    lines = row_lines(frame)
    if lines is None:
        out.attrs.pop(LINE_NUMBERS, None)
    else:
        keep_lines(out, lines)
    return out


OPTIONAL_FIGURES = ("peak_memory_gib", "tflops_per_gpu", "tokens_per_s")
"""Optional measured figures (docs/measurements.md) that the replay and measured cost models
report for a layout, without a default: a row without one has none."""
FULL_RECOMPUTE: dict[str, str | int] = {"recompute_method": "uniform", "recompute_num_layers": 1}
"""The optional columns of Megatron-LM's settings of a full recompute (--recompute-method,
--recompute-num-layers), each with the one value layoutsearch's `full` runs with (every
layer its own checkpoint, megatron/args.py)."""
FULL_RECOMPUTE_OTHERS = {
    "recompute_method": "'block' recomputes only the first --recompute-num-layers layers of "
                        "each pipeline stage and keeps the others' activations",
    "recompute_num_layers": "another count recomputes chunks of that many layers (uniform) "
                            "or only that many layers of each pipeline stage (block)",
}
"""What a row under another value of each FULL_RECOMPUTE column ran, for its refusal."""
READ_COLUMNS = (*REQUIRED_COLUMNS, *OPTIONAL_DEFAULTS, *FULL_RECOMPUTE, *OPTIONAL_FIGURES)
"""The columns layoutsearch reads a value from; others are kept as they are."""


def _first(mask: pd.Series | np.ndarray) -> int:
    return int(np.flatnonzero(np.asarray(mask))[0])


MFU_CEILING = 2
"""The study's MFU counts 6N + 12·L·h·s FLOPs per token, the full s×s attention of which a
causal model computes half: at long context it passes 1 (for LLaMA 7B at 262,144 tokens it
reads 1.84 times the utilization by Megatron-LM's count), and it would reach 2 only if
attention were every FLOP counted and the GPUs ran at their peak."""
MFU_RANGE_WHY = ("the study's formula counts the masked half of causal attention, so it can "
                 "pass 1 at long context, never 2")


def _check_values(t: pd.DataFrame, source: str, rows: Sequence[str],
                  statuses: Sequence[str] = STATUSES) -> None:
    ran = t["status"] == "ok"
    step_in_range = (t["step_time_s"] > 0) & np.isfinite(t["step_time_s"])
    mfu_in_range = (t["mfu"] > 0) & (t["mfu"] < MFU_CEILING)
    checks: list[tuple[str, pd.Series, str]] = [
        ("attention", ~t["attention"].isin(ATTENTION_KERNELS),
         f"must be one of {', '.join(ATTENTION_KERNELS)}"),
        ("recompute", ~t["recompute"].isin(RECOMPUTE_KINDS),
         f"must be one of {', '.join(RECOMPUTE_KINDS)}"),
        ("status", ~t["status"].isin(statuses), f"must be one of {', '.join(statuses)}"),
        ("normalization", ~t["normalization"].isin(NORMALIZATIONS),
         f"must be one of {', '.join(NORMALIZATIONS)}"),
        # Whole nodes, as a job (specs.Job); a run on part of one node is fine.
        ("num_gpus",
         (t["num_gpus"] > t["gpus_per_node"]) & (t["num_gpus"] % t["gpus_per_node"] != 0),
         "must be a whole number of nodes of gpus_per_node ({gpus_per_node}) GPUs"),
        ("step_time_s", ran & ~step_in_range,
         "must be a positive number of seconds for a run with status ok"),
        ("mfu", ran & ~mfu_in_range,
         f"must be in (0, {MFU_CEILING}) for a run with status ok ({MFU_RANGE_WHY})"),
        # Other runs leave both empty; a figure given anyway still has to be one.
        ("step_time_s", ~ran & t["step_time_s"].notna() & ~step_in_range,
         "must be a positive number of seconds or empty (a run with status {status})"),
        ("mfu", ~ran & t["mfu"].notna() & ~mfu_in_range,
         f"must be in (0, {MFU_CEILING}) or empty (a run with status {{status}})"),
        # The shape rules of ModelSpec, so that a typo in a model column is caught here.
        ("hidden_size", t["hidden_size"] % t["num_attention_heads"] != 0,
         "must divide by num_attention_heads ({num_attention_heads})"),
        ("num_query_groups", t["num_attention_heads"] % t["num_query_groups"] != 0,
         "does not divide num_attention_heads ({num_attention_heads})"),
    ]
    for column, bad, rule in checks:
        if bad.any():
            i = _first(bad)
            # A rule may name another column of the row: "{num_attention_heads}".
            text = rule.format_map(t.iloc[i].to_dict())
            raise _fail(source, rows[i], column, f"{_shown(t[column].iloc[i])} {text}")
    world = t["tp"] * t["pp"] * t["cp"] * t["dp"]
    bad = world != t["num_gpus"]
    if bad.any():
        i = _first(bad)
        r = t.iloc[i]
        raise _fail(source, rows[i], "dp",
                    f"tp·pp·cp·dp = {r.tp}·{r.pp}·{r.cp}·{r.dp} = {world.iloc[i]} "
                    f"does not equal num_gpus={r.num_gpus}")


def _check_full_recompute(t: pd.DataFrame, source: str, rows: Sequence[str]) -> None:
    """The optional `recompute_method` and `recompute_num_layers` of a full recompute: empty
    or FULL_RECOMPUTE's value, layoutsearch's `full` (--recompute-method uniform
    --recompute-num-layers 1). Other settings (a partial recompute, or chunks of layers) are
    no layout layoutsearch prices: read as `full`, their step time and memory would price
    another layout. Without a full recompute Megatron-LM takes neither, so the cells are not
    read."""
    full = (t["recompute"] == "full").to_numpy()
    full_rows = [row for row, is_full in zip(rows, full, strict=True) if is_full]
    for column, taken in FULL_RECOMPUTE.items():
        if column not in t.columns:
            continue
        if isinstance(taken, str):
            cells = t.loc[full, column].astype(object)
            text = cells.where(cells.isna(), cells.astype(str).str.strip())
            values = text.where(text != "")  # a blank cell is an empty one
            bad = values.notna() & (values.str.lower() != taken)
            shown = values.map(repr)
        else:
            values = _as_float(t[full], column, source, full_rows)
            bad = values.notna() & (values != taken)
            shown = values.map("{:g}".format)
        if bad.any():
            i = _first(bad)
            raise _fail(source, full_rows[i], column,
                        f"{shown.iloc[i]} with recompute 'full' is no layout layoutsearch "
                        "prices: its 'full' recomputes every layer, one per checkpoint "
                        "(--recompute-method uniform --recompute-num-layers 1), and "
                        f"{FULL_RECOMPUTE_OTHERS[column]}; leave such runs out, or write "
                        f"{taken} (or leave the cell empty) for runs that did that")


UNIT_TOLERANCE = 2.0
"""How far a row's MFU may sit from the one its step time gives by the study's formula before
the two are taken to disagree: other FLOP counts (Megatron-LM's own, with attention's
causal half) differ by ~10-30 %; a step time in milliseconds is off by 1000x."""


def check_units(rows: pd.DataFrame, clusters: Mapping[str, ClusterSpec], source: str = "",
                names: Sequence[str] | None = None) -> None:
    """Refuse ok rows whose step_time_s and mfu disagree beyond UNIT_TOLERANCE (a unit
    mistake: milliseconds, percent), naming the first: a replay would rank by one and show
    the other, and a fit would chase it to its bounds. Rows of GPU kinds `clusters` lacks
    are left alone (their peak is unknown). `names` name the rows by position (default
    `row_names(rows)`)."""
    # The cost models read measurement files, so their shapes are imported when needed.
    from layoutsearch.costs.shapes import Shapes

    checked = ((rows["status"] == "ok") & rows["gpu"].isin(list(clusters))).to_numpy()
    if not checked.any():
        return
    ok = rows[checked]
    implied = Shapes.of(ok, clusters).mfu(ok["step_time_s"].to_numpy(dtype=float))
    ratio = ok["mfu"].to_numpy(dtype=float) / implied
    off = np.flatnonzero((ratio > UNIT_TOLERANCE) | (ratio < 1 / UNIT_TOLERANCE))
    if len(off):
        i = off[0]
        row = ok.iloc[i]
        name = (row_names(rows) if names is None else names)[np.flatnonzero(checked)[i]]
        raise LayoutSearchError(
            f"{f'{source}: ' if source else ''}{name} ({row['model']}, {row['gpu']}, tp "
            f"{row['tp']} pp {row['pp']}): step_time_s={row['step_time_s']:g} gives MFU "
            f"{implied[i]:.4g} by the study's formula (docs/measurements.md), but "
            f"mfu={row['mfu']:g} ({ratio[i]:.3g}x); {len(off)} of {len(ok)} ok rows disagree "
            "like this: is step_time_s in seconds per optimizer step and mfu a fraction of "
            "peak?")


def not_a_table(path: str | Path) -> str:
    """Why `path` names no measurement table, by its suffix: a settings file (YAML, JSON);
    "" where it may name one."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        return ""
    return (f"is a {suffix[1:].upper()} file, not a measurement table: name a CSV or Parquet "
            "file of runs (docs/measurements.md); cost-model constants go to cost_model=, "
            "Megatron-LM settings to megatron=")


def read_table(path: str | Path) -> pd.DataFrame:
    """A measurement file as it is, unvalidated (CSV, or Parquet by its suffix)."""
    if not isinstance(path, str | Path):
        raise LayoutSearchError(f"measurement file {path!r}: must be the path of a CSV or "
                                "Parquet file of runs (docs/measurements.md)")
    path = Path(path).expanduser()  # checked where pandas reads it: `~` is the home folder
    if path.is_dir():
        raise LayoutSearchError(f"measurement file {str(path)!r} is a folder; name the CSV or "
                                "Parquet file in it")
    if not path.is_file():
        # A pipe or a device would be read once, or block: a file is what can be read again.
        what = "is not a regular file" if path.exists() else "does not exist"
        raise LayoutSearchError(f"measurement file {str(path)!r} {what}")
    if not_a_table(path):
        # Read as CSV it would fail on some line's commas, which says nothing of the mistake.
        raise LayoutSearchError(f"measurement file {str(path)!r} {not_a_table(path)}")
    parquet = is_parquet(path)
    # Refuses a line longer than the header, or a column of the schema named twice.
    lines = [] if parquet else record_lines(path, READ_COLUMNS)
    try:
        # low_memory=False: types from the whole column, not per chunk of a long file.
        table = pd.read_parquet(path) if parquet else parse_csv(
            path, low_memory=False)
    except pd.errors.EmptyDataError:
        raise LayoutSearchError(
            f"measurement file {str(path)!r} is empty: it needs a header line with the "
            "columns of docs/measurements.md"
        ) from None
    except UnicodeDecodeError as error:
        # Its position counts from the chunk pandas was decoding, not from the file.
        raise LayoutSearchError(
            f"measurement file {str(path)!r} is not UTF-8 text: "
            f"{undecodable(path) or error.reason}; save it as UTF-8 (a spreadsheet's "
            "'CSV UTF-8' format)") from None
    except (pd.errors.ParserError, ValueError, OSError) as error:
        # pyarrow's ArrowInvalid is a ValueError; a truncated Parquet file is an OSError.
        kind = "Parquet" if parquet else "CSV"
        raise LayoutSearchError(
            f"measurement file {str(path)!r} cannot be read as {kind} "
            f"({type(error).__name__}: {error})"
        ) from None
    # A Parquet file keeps the attrs of the frame written into it: line numbers of the CSV
    # file it was read from, which are not this file's rows.
    table.attrs.pop(LINE_NUMBERS, None)
    if len(lines) == len(table):  # else (Parquet) the rows are named by position, as read
        keep_lines(table, lines)
    return table


def read_measurements(path: str | Path,
                      gpus: Collection[str] | Mapping[str, ClusterSpec] | None = None,
                      ) -> pd.DataFrame:
    """Read and validate a measurement file (CSV, or Parquet by its suffix)."""
    return validate_measurements(read_table(path), source=str(path), gpus=gpus)
