"""The measurement schema reader: types, defaults, and errors that name row and column."""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from layoutsearch.api import predict
from layoutsearch.catalog import load_cluster
from layoutsearch.errors import LayoutSearchError
from layoutsearch.measurements import read_measurements, read_table, validate_measurements


def write(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def three_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Three valid runs: ok, oom (no time, no MFU), and ok at tp 4."""
    oom = {**row, "status": "oom", "step_time_s": None, "mfu": None, "micro_batch_size": 8}
    wide = {**row, "tp": 4, "dp": 16, "mfu": 0.55}
    return [dict(row), oom, wide]


def test_reads_a_valid_file_with_types_and_defaults(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    rows = three_rows(measurement_row)
    for row, note in zip(rows, ("first", "second", "third"), strict=True):
        row["note"] = note  # an unknown column
    runs = read_measurements(write(tmp_path, rows))
    assert len(runs) == 3
    assert list(runs["tp"]) == [2, 2, 4] and runs["tp"].dtype == "int64"
    assert runs["swiglu"].dtype == bool
    # Optional columns get the defaults of docs/measurements.md.
    assert list(runs["cp"]) == [1, 1, 1] and list(runs["vp"]) == [1, 1, 1]
    assert not runs["distributed_optimizer"].any() and not runs["overlap_grad_reduce"].any()
    assert (runs["normalization"] == "RMSNorm").all()
    assert list(runs["note"]) == ["first", "second", "third"]  # unknown columns are kept
    assert runs["mfu"].isna().tolist() == [False, True, False]


def test_booleans_accept_several_spellings(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    spellings = ["True", "true", "1", "False", "false", "0"]
    rows = [{**measurement_row, "sequence_parallel": s} for s in spellings]
    runs = read_measurements(write(tmp_path, rows))
    assert runs["sequence_parallel"].tolist() == [True, True, True, False, False, False]


def test_optional_columns_fill_their_gaps(measurement_row: dict[str, Any]) -> None:
    frame = pd.DataFrame([{**measurement_row, "cp": None}, {**measurement_row, "cp": 1}])
    assert validate_measurements(frame)["cp"].tolist() == [1, 1]


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_optional_columns_left_blank_in_every_row_take_their_defaults_without_a_warning(
        tmp_path: Path, measurement_row: dict[str, Any], suffix: str) -> None:
    # Read as float64 (every cell blank), a flag's or a name's default was filled into
    # floats: pandas 3 warns of it, and pandas 4 refuses.
    blank = {"distributed_optimizer": None, "overlap_grad_reduce": None,
             "normalization": None, "cp": None, "vp": None}
    frame = pd.DataFrame([{**row, **blank} for row in three_rows(measurement_row)])
    path = tmp_path / f"runs.{suffix}"
    if suffix == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runs = read_measurements(path)
    assert list(runs["distributed_optimizer"]) == [False] * 3
    assert list(runs["overlap_grad_reduce"]) == [False] * 3
    assert list(runs["normalization"]) == ["RMSNorm"] * 3
    assert list(runs["cp"]) == [1] * 3 and list(runs["vp"]) == [1] * 3


def test_a_flag_written_yes_or_no_with_a_blank_cell_takes_its_default_without_a_warning(
        tmp_path: Path, measurement_row: dict[str, Any]) -> None:
    # Read as pandas 3's str column (yes/no are no booleans to pandas): a bool is no str.
    rows = three_rows(measurement_row)
    flags = ["yes", "no", None]
    frame = pd.DataFrame([{**row, "distributed_optimizer": flag, "overlap_grad_reduce": flag}
                          for row, flag in zip(rows, flags, strict=True)])
    path = tmp_path / "runs.csv"
    frame.to_csv(path, index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runs = read_measurements(path)
    assert list(runs["distributed_optimizer"]) == [True, False, False]
    assert list(runs["overlap_grad_reduce"]) == [True, False, False]


def test_missing_column_is_named(tmp_path: Path, measurement_row: dict[str, Any]) -> None:
    row = {k: v for k, v in measurement_row.items() if k != "micro_batch_size"}
    with pytest.raises(LayoutSearchError, match=r"missing required column\(s\) micro_batch_size"):
        read_measurements(write(tmp_path, [row]))


def test_a_misspelt_required_column_is_pointed_out(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    row = {("micro_batch" if k == "micro_batch_size" else k): v
           for k, v in measurement_row.items()}
    with pytest.raises(LayoutSearchError, match=r"missing required column\(s\) micro_batch_size; "
                       "column 'micro_batch' looks like micro_batch_size"):
        read_measurements(write(tmp_path, [row]))


@pytest.mark.parametrize("name", ["use_distributed_optimizer", "distributed_optimiser"])
def test_a_misspelt_optional_column_is_refused_not_defaulted(
    tmp_path: Path, measurement_row: dict[str, Any], name: str
) -> None:
    # Read as an unknown column, every row would have run without the distributed optimizer.
    row = {**measurement_row, name: True}
    with pytest.raises(LayoutSearchError, match=rf"column '{name}' looks like the optional "
                       "column 'distributed_optimizer', which this file lacks, so every row "
                       "would take its default distributed_optimizer=False"):
        read_measurements(write(tmp_path, [row]))
    # Next to the real column it is just another unknown column, kept as it is.
    kept = read_measurements(write(tmp_path, [{**row, "distributed_optimizer": True}]))
    assert kept[name].tolist() == [True] and kept["distributed_optimizer"].tolist() == [True]


def test_a_blank_cell_of_a_0_1_column_is_named_at_its_row(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    # pandas reads a 0/1 column with a gap as 0.0/1.0/NaN: the gap is the error, not 0.0.
    rows = [{**measurement_row, "sequence_parallel": v} for v in (0, 1, None, 0)]
    with pytest.raises(LayoutSearchError, match=r"line 4, column 'sequence_parallel': an empty "
                       "cell is not a boolean"):
        read_measurements(write(tmp_path, rows))
    rows[2]["sequence_parallel"] = 1
    runs = read_measurements(write(tmp_path, rows))
    assert runs["sequence_parallel"].tolist() == [False, True, True, False]


def test_missing_file() -> None:
    with pytest.raises(LayoutSearchError, match=r"measurement file '/nonexistent.csv' does not"):
        read_measurements("/nonexistent.csv")


@pytest.mark.parametrize(("path", "shown"), [(None, "None"), (False, "False"),
                                            (["runs.csv"], r"\['runs.csv'\]")])
def test_a_path_that_is_no_path_is_named(path: Any, shown: str) -> None:
    # pathlib's TypeError ("expected str, bytes or os.PathLike object") before.
    with pytest.raises(LayoutSearchError, match=rf"^measurement file {shown}: must be the path "
                                                r"of a CSV or Parquet file of runs"):
        read_measurements(path)


def test_a_pipe_is_not_a_measurement_file(tmp_path: Path) -> None:
    pipe = tmp_path / "runs.csv"
    os.mkfifo(pipe)
    with pytest.raises(LayoutSearchError, match=r"runs.csv' is not a regular file$"):
        read_measurements(pipe)


def test_a_folder_is_not_a_measurement_file(tmp_path: Path) -> None:
    with pytest.raises(LayoutSearchError, match=r"measurement file '.*' is a folder; name the "
                       "CSV or Parquet file in it"):
        read_measurements(tmp_path)


def test_a_yaml_file_is_not_a_measurement_file(tmp_path: Path) -> None:
    path = tmp_path / "constants.yaml"
    path.write_text("gpus:\n  a100_80gb: {gemm_efficiency: 0.75, note: 'a, b'}\n")
    with pytest.raises(LayoutSearchError, match=r"constants.yaml' is a YAML file, not a "
                       r"measurement table: name a CSV or Parquet file of runs"):
        read_measurements(path)


# A bad value in the third data row: line 4 of the file (the header is line 1).
@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("sequence_parallel", "maybe", r"'maybe' is not a boolean"),
        ("tp", 2.5, r"2\.5 is not a positive integer"),
        ("micro_batch_size", "one", r"'one' is not a positive integer"),
        ("tp", None, r"an empty cell is not a positive integer"),
        ("step_time_s", "fast", r"'fast' is not a number"),
        ("seq_length", 0, r"0 is not a positive integer"),
        # Beyond int64 it would wrap around to a negative vocabulary, priced as fitting.
        ("vocab_size", "1e+20", r"1e\+20 is not a positive integer of at most 2\*\*53"),
        ("attention", "flash9", r"'flash9' must be one of torch, fused"),
        ("recompute", "half", r"'half' must be one of none"),
        ("status", "crashed", r"'crashed' must be one of ok, oom"),
        # A percentage: the study's MFU passes 1 at long context, never 2.
        ("mfu", 45.0, r"45\.0 must be in \(0, 2\) for a run with status ok \(the study's "
                      r"formula counts the masked half of causal attention"),
        ("step_time_s", -3.0, r"-3\.0 must be a positive number of seconds for a run with "
         "status ok"),
        ("step_time_s", "inf", r"inf must be a positive number of seconds for a run with "
         "status ok"),
        ("dp", 8, r"tp·pp·cp·dp = 4·1·1·8 = 32 does not equal num_gpus=64"),
        ("hidden_size", 5121, r"5121 must divide by num_attention_heads \(40\)"),
        ("num_query_groups", 3, r"3 does not divide num_attention_heads \(40\)"),
        ("normalization", "foo", r"'foo' must be one of RMSNorm, LayerNorm"),
        ("gpu", None, r"is empty"),
        ("num_gpus", 60, r"60 must be a whole number of nodes of gpus_per_node \(8\) GPUs"),
    ],
)
def test_bad_values_name_row_and_column(
    tmp_path: Path, measurement_row: dict[str, Any], column: str, value: Any, message: str
) -> None:
    rows = three_rows(measurement_row)
    rows[2][column] = value
    path = write(tmp_path, rows)
    with pytest.raises(LayoutSearchError, match=rf"line 4, column '{column}': {message}") as error:
        read_measurements(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("mfu", 45.0, r"45\.0 must be in \(0, 2\) or empty \(a run with status oom\)"),
        ("step_time_s", 0, r"0\.0 must be a positive number of seconds or empty \(a run with "
         r"status oom\)"),
    ],
)
def test_a_figure_on_a_run_that_did_not_finish_is_still_checked(
    tmp_path: Path, measurement_row: dict[str, Any], column: str, value: Any, message: str
) -> None:
    rows = three_rows(measurement_row)
    rows[1][column] = value  # the oom run: line 3 of the file
    with pytest.raises(LayoutSearchError, match=rf"line 3, column '{column}': {message}"):
        read_measurements(write(tmp_path, rows))
    # A figure in range is kept as given (a run that died after logging a few steps).
    rows[1][column] = 0.4
    assert read_measurements(write(tmp_path, rows))[column].iloc[1] == 0.4


def test_gpu_kinds_a_cost_model_cannot_price_are_named(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    rows = three_rows(measurement_row)
    rows[1]["gpu"] = "a100_80g"
    path = write(tmp_path, rows)
    read_measurements(path)  # any name is valid data; pricing it is what needs a known kind
    with pytest.raises(LayoutSearchError, match=r"line 3, column 'gpu': unknown gpu 'a100_80g'; "
                                                r"did you mean 'a100_80gb'\?"):
        read_measurements(path, gpus=["a100_80gb", "h100_sxm"])
    with pytest.raises(LayoutSearchError, match=r"line 3, column 'gpu': unknown gpu"):
        predict(path)


def test_an_empty_file_says_what_it_needs(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("")
    with pytest.raises(LayoutSearchError, match=r"is empty: it needs a header line"):
        read_measurements(path)


def test_a_parquet_file_reads_like_its_csv(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    path = tmp_path / "runs.parquet"
    pd.DataFrame(three_rows(measurement_row)).to_parquet(path)
    pd.testing.assert_frame_equal(read_measurements(path),
                                  read_measurements(write(tmp_path, three_rows(measurement_row))))


def test_a_csv_file_read_then_saved_as_parquet_names_its_own_rows(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    # DataFrame.to_parquet writes the frame's attrs as JSON, line numbers of the CSV
    # included; read back, they are not the Parquet file's rows.
    rows = three_rows(measurement_row)
    table = read_measurements(write(tmp_path, rows))
    table.loc[1, "micro_batch_size"] = 0
    table.to_parquet(tmp_path / "runs.parquet")
    with pytest.raises(LayoutSearchError,
                       match=r"runs.parquet: index 1, column 'micro_batch_size'"):
        read_measurements(tmp_path / "runs.parquet")


@pytest.mark.parametrize(("name", "content", "kind"), [
    ("runs.csv", b'model,tp\n"llama_13b,1\n', "CSV"),  # a quote never closed
    ("runs.parquet", b"model,tp\nllama_13b,1\n", "Parquet"),  # a CSV named .parquet
])
def test_an_unreadable_file_is_named_with_its_format(
    tmp_path: Path, name: str, content: bytes, kind: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(LayoutSearchError, match=rf"{name}' cannot be read as {kind} \("):
        read_measurements(path)


@pytest.mark.parametrize(("sep", "decimal", "named"), [
    (";", ",", "semicolons"), ("\t", ".", "tabs")])
def test_a_file_separated_otherwise_than_by_commas_says_so(
    tmp_path: Path, measurement_row: dict[str, Any], sep: str, decimal: str, named: str
) -> None:
    # Excel in locales with decimal commas saves "CSV" with semicolons: before, every
    # required column was reported missing.
    path = tmp_path / "runs.csv"
    pd.DataFrame(three_rows(measurement_row)).to_csv(path, sep=sep, decimal=decimal,
                                                     index=False)
    with pytest.raises(LayoutSearchError, match=rf"runs.csv' is separated by {named}, not "
                       r"commas \(its header reads 'model.*save it as comma-separated"):
        read_measurements(path)


def test_data_lines_ending_with_a_comma_keep_their_columns(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    # One empty cell more than the header on every line: pandas took the first column as
    # the index and shifted every value one column left ('model' held 40, the layers).
    path = write(tmp_path, three_rows(measurement_row))
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], *(line + "," for line in lines[1:])]) + "\n")
    runs = read_measurements(path)
    assert list(runs["model"]) == ["llama_13b"] * 3
    assert list(runs["tp"]) == [2, 2, 4]


def test_a_line_with_more_cells_than_the_header_is_named(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    path = write(tmp_path, three_rows(measurement_row))
    lines = path.read_text().splitlines()
    lines[1] += ",0.61"  # a value the header has no column for: dropped, or the rows shifted
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LayoutSearchError, match=r"line 2 has 26 cells, the header has 25 "
                                                r"\(after its last column 'mfu' the line holds "
                                                r"'0.61'\)"):
        read_measurements(path)


@pytest.mark.parametrize("value", [True, False])
def test_a_flag_in_a_size_column_is_not_taken_as_a_number(
    measurement_row: dict[str, Any], value: bool
) -> None:
    # pandas reads True as 1: tp=True would have been a layout of tp 1.
    frame = pd.DataFrame(three_rows(measurement_row)).astype({"tp": object})
    frame.loc[1, "tp"] = value
    with pytest.raises(LayoutSearchError, match=rf"index 1, column 'tp': {value} is not a "
                                                r"positive integer"):
        validate_measurements(frame, source="frame")


def test_one_gpu_name_is_one_kind_not_its_letters(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    path = write(tmp_path, three_rows(measurement_row))
    assert len(read_measurements(path, gpus="a100_80gb")) == 3
    with pytest.raises(LayoutSearchError, match=r"unknown gpu 'a100_80gb'; valid gpu names: "
                                                r"h100_sxm$"):
        read_measurements(path, gpus="h100_sxm")


def test_ok_run_needs_a_step_time(measurement_row: dict[str, Any]) -> None:
    frame = pd.DataFrame([{**measurement_row, "step_time_s": None}])
    with pytest.raises(LayoutSearchError, match=r"my runs: index 0, column 'step_time_s': an "
                                                r"empty cell must be a positive number"):
        validate_measurements(frame, source="my runs")


def test_a_csv_with_a_space_after_each_comma_reads(tmp_path: Path,
                                                  measurement_row: dict[str, Any]) -> None:
    path = tmp_path / "spaced.csv"
    path.write_text(", ".join(measurement_row) + "\n"
                    + ", ".join(str(v) for v in measurement_row.values()) + "\n")
    rows = read_measurements(path)
    assert rows["model"].iloc[0] == "llama_13b" and rows["tp"].iloc[0] == 2


def test_a_bad_value_is_named_by_its_line_past_blank_lines_and_multi_line_cells(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    rows = three_rows(measurement_row)
    for row in rows:
        row["note"] = "one line"
    rows[0]["note"] = "first line\nsecond line"  # a quoted cell spanning two lines
    rows[2]["tp"] = "four"
    path = write(tmp_path, rows)
    header, *records = path.read_text().split("\n")
    # Lines: header 1, a blank line 2, the first record 3-4, the second 5, the bad one 6.
    path.write_text("\n".join([header, "", *records]))
    assert path.read_text().splitlines()[5].startswith(str(rows[2]["model"]))
    with pytest.raises(LayoutSearchError, match=r"runs.csv: line 6, column 'tp': 'four' is not"):
        read_measurements(path)


def test_a_frame_is_named_by_its_index_label_also_after_a_sort(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    rows = three_rows(measurement_row)
    rows[1]["micro_batch_size"] = 0
    frame = pd.DataFrame(rows, index=[10, 20, 30])
    with pytest.raises(LayoutSearchError, match=r"my runs: index 20, column 'micro_batch_size'"):
        validate_measurements(frame, source="my runs")
    # A file read and then reordered still names the line the bad row came from.
    table = read_table(write(tmp_path, rows)).iloc[::-1]
    with pytest.raises(LayoutSearchError, match=r"runs.csv: line 3, column 'micro_batch_size'"):
        validate_measurements(table, source="runs.csv")


@pytest.mark.parametrize(("column", "value", "ratio"), [
    ("step_time_s", 30_000.0, r"1\.03e\+03x"),  # milliseconds
    ("mfu", 0.06, r"0\.103x"),  # a factor of 10 off
])
def test_a_step_time_and_mfu_that_disagree_are_named(
    tmp_path: Path, measurement_row: dict[str, Any], column: str, value: float, ratio: str
) -> None:
    # A replay would rank by the MFU and show the step time; read_measurements, predict and
    # the cost models that read files refuse the row, as calibration does.
    rows = three_rows(measurement_row)
    rows[0][column] = value
    path = write(tmp_path, rows)
    message = (rf"runs.csv: line 2 \(llama_13b, a100_80gb, tp 2 pp 1\): step_time_s=\S+ "
               rf"gives MFU \S+ by the study's formula \(docs/measurements.md\), but mfu=\S+ "
               rf"\({ratio}\); 1 of 2 ok rows disagree like this")
    with pytest.raises(LayoutSearchError, match=message):
        read_measurements(path)
    with pytest.raises(LayoutSearchError, match=message):
        predict(path, cost_model={"_target_": "layoutsearch.costs.ReplayCostModel",
                                  "path": str(path)})


def test_a_step_time_is_checked_against_the_peak_of_the_clusters_given(
    measurement_row: dict[str, Any]
) -> None:
    # The same run on a GPU of twice the peak is half the MFU: by the catalog's A100 peak it
    # agrees, by the given one it does not.
    frame = pd.DataFrame([measurement_row])
    validate_measurements(frame)
    a100 = load_cluster("a100_80gb")
    faster = a100.replace(gpu=dataclasses.replace(a100.gpu, peak_tflops=4 * a100.gpu.peak_tflops))
    with pytest.raises(LayoutSearchError, match=r"frame: index 0 .* \(4\.12x\)"):
        validate_measurements(frame, source="frame", gpus={"a100_80gb": faster})


def test_an_mfu_past_1_at_long_context_is_read_back(tmp_path: Path,
                                                     measurement_row: dict[str, Any],
                                                     step_time_for) -> None:
    # What a measured search records for a long-context run must resume it, not stop it.
    row = {**measurement_row, "seq_length": 262144, "global_batch_size": 64, "mfu": 1.011}
    row["step_time_s"] = step_time_for(row, 1.011)
    path = tmp_path / "runs.csv"
    pd.DataFrame([row]).to_csv(path, index=False)
    assert read_measurements(path)["mfu"].tolist() == [1.011]


def test_a_repeated_column_is_named(measurement_row: dict[str, Any]) -> None:
    frame = pd.DataFrame([measurement_row])
    doubled = pd.concat([frame, frame[["tp"]]], axis=1)
    with pytest.raises(LayoutSearchError, match=r"frame: column\(s\) 'tp' appear more than "
                                                r"once; keep one of each"):
        predict(doubled)


def test_a_column_repeated_in_a_csv_header_is_named(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    # pandas would read the second 'tp' as 'tp.1', an unknown column kept, and the row as tp 2.
    header = ",".join(measurement_row) + ",tp,"
    line = ",".join(map(str, measurement_row.values())) + ",4,"
    path = tmp_path / "runs.csv"
    path.write_text(f"{header}\n{line}\n")
    with pytest.raises(LayoutSearchError, match=r"runs.csv: column\(s\) 'tp' appear more than "
                                                r"once; keep one of each"):
        read_measurements(path)
    # A header's unnamed trailing columns (a spreadsheet's empty ones) are no repeat.
    path.write_text(f"{header[:-4]},,\n{line[:-3]},,\n")
    assert read_measurements(path)["tp"].tolist() == [2]
    # Nor is a column of the user's own that layoutsearch does not read: both are kept.
    path.write_text(f"{header[:-4]},note,note\n{line[:-3]},a,b\n")
    read = read_measurements(path)
    assert (read["tp"].tolist(), read["note"].tolist(), read["note.1"].tolist()) == (
        [2], ["a"], ["b"])
    # An optional figure a cost model reports is read too: which peak memory is the run's?
    path.write_text(f"{header[:-4]},peak_memory_gib,peak_memory_gib\n{line[:-3]},70,90\n")
    with pytest.raises(LayoutSearchError, match=r"runs.csv: column\(s\) 'peak_memory_gib' "
                                                r"appear more than once; keep one of each"):
        read_measurements(path)


def test_a_partial_full_recompute_is_refused_not_priced_as_full(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    full = {**measurement_row, "recompute": "full", "step_time_s": 40.0, "mfu": 0.45}
    rows = [{**full, "recompute_num_layers": 1}, {**full, "tp": 4, "dp": 16},
            {**measurement_row, "recompute_num_layers": 2},  # not read without full
            {**measurement_row, "tp": 4, "dp": 16, "recompute_num_layers": "-"}]
    assert len(read_measurements(write(tmp_path, rows))) == 4
    rows.append({**full, "tp": 8, "dp": 8, "recompute_num_layers": 4})
    with pytest.raises(LayoutSearchError, match=r"line 6, column 'recompute_num_layers': 4 with "
                                                r"recompute 'full' is no layout layoutsearch "
                                                r"prices"):
        read_measurements(write(tmp_path, rows))
    rows[-1]["recompute_num_layers"] = "all"
    with pytest.raises(LayoutSearchError, match=r"line 6, column 'recompute_num_layers': 'all' "
                                                r"is not a number"):
        read_measurements(write(tmp_path, rows))


def test_a_block_full_recompute_is_refused_not_priced_as_full(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    # Megatron-LM's --recompute-method block recomputes only the first
    # --recompute-num-layers layers of each pipeline stage: read as `full`, its step time
    # and memory would price every layer recomputed.
    full = {**measurement_row, "recompute": "full", "step_time_s": 40.0, "mfu": 0.45}
    rows = [{**full, "recompute_method": "uniform"}, {**full, "tp": 4, "dp": 16},
            {**full, "tp": 8, "dp": 8, "recompute_method": " Uniform "},
            {**measurement_row, "recompute_method": "block"},  # not read without full
            {**measurement_row, "tp": 4, "dp": 16, "recompute_method": "-"}]
    assert len(read_measurements(write(tmp_path, rows))) == 5
    rows.append({**full, "tp": 1, "dp": 64, "recompute_method": "block",
                 "recompute_num_layers": 1})
    with pytest.raises(LayoutSearchError, match=r"line 7, column 'recompute_method': 'block' "
                                                r"with recompute 'full' is no layout "
                                                r"layoutsearch prices: .*'block' recomputes "
                                                r"only the first --recompute-num-layers "
                                                r"layers of each pipeline stage.*; leave such "
                                                r"runs out, or write uniform \(or leave the "
                                                r"cell empty\)"):
        read_measurements(write(tmp_path, rows))
    # A frame names the row by its index label, and reads the column too.
    with pytest.raises(LayoutSearchError, match=r"index 5, column 'recompute_method': 'block'"):
        validate_measurements(pd.DataFrame(rows))
    # A file with the column twice cannot say which method its runs took.
    header, line = write(tmp_path, rows[:1]).read_text().splitlines()
    (tmp_path / "runs.csv").write_text(f"{header},recompute_method\n{line},block\n")
    with pytest.raises(LayoutSearchError, match=r"column\(s\) 'recompute_method' appear more "
                                                r"than once"):
        read_measurements(tmp_path / "runs.csv")


def test_a_file_not_in_utf8_names_its_first_such_line(
    tmp_path: Path, measurement_row: dict[str, Any]
) -> None:
    # A spreadsheet's "CSV" in a Western locale is Windows-1252: é is one byte, 0xe9.
    path = tmp_path / "runs.csv"
    frame = pd.DataFrame([measurement_row, {**measurement_row, "source": "mesuré"}])
    frame.to_csv(path, index=False, encoding="cp1252")
    with pytest.raises(LayoutSearchError, match=r"is not UTF-8 text: line 3 has b'\\xe9', "
                                                r".*save it as UTF-8"):
        read_measurements(path)
