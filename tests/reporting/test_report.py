"""report(): report.md and its PNGs for a search result."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import layoutsearch
from layoutsearch.errors import LayoutSearchError
from layoutsearch.reporting import check_study_rules, write_report
from layoutsearch.reporting.explain import compare, label, why_rejected
from layoutsearch.reporting.markdown import top_table
from layoutsearch.reporting.plots import mfu_memory_figure, tp_pp_heatmap

JOB = dict(model="llama_13b", num_gpus=64, seq_length=2048, global_batch_size=2048,
           vocab_size=128000)


@pytest.fixture(scope="module")
def ranked() -> pd.DataFrame:
    return layoutsearch.search(**JOB)


def test_report_writes_markdown_and_figures(ranked: pd.DataFrame, tmp_path: Path) -> None:
    path = layoutsearch.report(ranked, tmp_path / "out")
    assert path == tmp_path / "out" / "report.md"
    text = path.read_text()
    for section in ("## The job", "## Top 10 layouts", "## The best layout",
                    "## Why the main alternatives lost", "## The study's rules"):
        assert section in text
    for png in ("breakdown.png", "mfu_vs_memory.png", "tp_pp_heatmap.png"):
        assert f"]({png})" in text
        assert (tmp_path / "out" / png).stat().st_size > 10_000  # a real picture, not a stub
    # The top table shows the best layout's MFU as the search ranked it.
    assert f"{100 * ranked['mfu'].iloc[0]:.1f}" in text
    assert "64 × a100_80gb" in text
    # Large figures are grouped, and the throughput is the whole job's, beside per-GPU ones.
    assert "| global batch | 2048 sequences = 4,194,304 tokens |" in text
    assert "vocabulary 128,000 |" in text
    best = ranked.iloc[0]
    assert (f"{best['step_time_s']:.2f} s per step, {round(best['tokens_per_s']):,} tokens/s "
            f"for the whole job (64 GPUs), ") in text
    assert "--micro-batch-size" in text  # the winner's Megatron-LM arguments
    # This job's best layout fills its GPUs to within 0.1 GiB: the report says so.
    assert "**Memory headroom.** The best layout leaves 0.0 GiB of GPU memory free" in text
    # And two launchable runners-up within 5 % of its predicted MFU (a flash1 one is not:
    # no current Megatron-LM command runs it): a close call, with the way out.
    assert "**A close call.** 2 other layouts are within 5 %" in text
    assert ("cost_models=measured cost_models.prescreen=analytic cost_models.top_k=3 "
            "cost_models.launcher=slurm.") in text
    # A note that opens with a setting keeps it spelt as typed.
    assert "**The fabric.** cost_models=analytic prices inter-node traffic" in text


def test_a_report_of_a_selection_leaves_out_notes_about_the_whole_ranking(
        ranked: pd.DataFrame, tmp_path: Path) -> None:
    tp2 = ranked[ranked["tp"] == 2]
    text = layoutsearch.report(tp2, tmp_path / "tp2").read_text()
    assert "**A close call.**" not in text and "**Memory headroom.**" not in text
    assert (f"The search's notes are left out: they are about its whole ranking of "
            f"{len(ranked)} layouts, best tp1 ") in text
    assert f"({len(tp2)} rows, first tp2 " in text
    # The whole ranking, re-indexed or copied, keeps its notes.
    text = layoutsearch.report(ranked.reset_index(drop=True), tmp_path / "all").read_text()
    assert "**A close call.**" in text


def test_a_re_sorted_ranking_is_reported_best_first(ranked: pd.DataFrame, tmp_path: Path
                                                    ) -> None:
    by_memory = ranked.sort_values("peak_memory_gib")
    assert by_memory.iloc[0]["mfu"] < ranked.iloc[0]["mfu"] - 0.2
    text = layoutsearch.report(by_memory, tmp_path / "memory").read_text()
    best = label(ranked.iloc[0])
    assert f"**{best}**: {100 * ranked.iloc[0]['mfu']:.1f} % MFU" in text
    # The same rows, ranked again: the notes are about them, and the alternatives lose.
    assert "**A close call.**" in text
    assert "points lower" in text and not re.search(r"\(-[0-9.]+ points lower\)", text)


def test_a_replayed_best_layout_without_a_memory_figure_says_so(
        tmp_path: Path, measurement_row) -> None:
    path = tmp_path / "runs.csv"  # peak_memory_gib is an optional column of the schema
    pd.DataFrame([{**measurement_row, "distributed_optimizer": True}]).to_csv(path, index=False)
    ranked = layoutsearch.search(**{**JOB, "vocab_size": 32000}, tp=[2], pp=[1], cost_model={
        "_target_": "layoutsearch.costs.replay.ReplayCostModel", "path": str(path)})
    assert ranked["fits"].iloc[0] and pd.isna(ranked["peak_memory_gib"].iloc[0])
    text = layoutsearch.report(ranked, tmp_path / "report").read_text()
    assert "tokens/s for the whole job (64 GPUs), peak memory per GPU not measured." in text
    assert "nan" not in text
    # The file ran one of the space's layouts: the rest were never priced.
    assert (f"**What the measurements cover.** {path} measured 1 of the " in text
            and "pin micro_batch_size=[1]" in text)


def test_report_of_a_paper_driver_result(tmp_path: Path) -> None:
    paper = layoutsearch.search(driver="paper", **JOB)
    text = layoutsearch.report(paper, tmp_path).read_text()
    assert "The study's rules pick the best layout" in text
    # It priced two layouts: what it says of "no layout" is said of those.
    assert "no layout this driver priced with another value fits" in text
    assert "no layout with another value fits" not in text


def test_a_layout_without_figures_was_not_priced_rather_than_too_big(ranked) -> None:
    unpriced = ranked[ranked["mfu"].isna()].iloc[0]
    assert compare(ranked.iloc[0], unpriced) == (
        f"{label(unpriced)} was not priced: {unpriced['reason']}")
    too_big = ranked[ranked["mfu"].notna() & ~ranked["fits"]].iloc[0]
    assert compare(ranked.iloc[0], too_big).startswith(f"{label(too_big)} does not fit: needs ")


def test_a_ranking_of_one_layout_says_there_is_no_alternative(tmp_path: Path) -> None:
    one = layoutsearch.search(**JOB, tp=[1], pp=[1], micro_batch_size=[1], attention=["flash2"],
                              rmsnorm_kernel=[True], recompute=["none"])
    assert len(one) == 1
    text = layoutsearch.report(one, tmp_path).read_text()
    assert ("## Why the main alternatives lost\n\n- every axis of the search space has one "
            "value: there is no alternative to compare") in text


def test_report_without_a_job_is_a_user_error(ranked: pd.DataFrame, tmp_path: Path) -> None:
    bare = ranked.copy()
    bare.attrs = {}
    with pytest.raises(LayoutSearchError, match="attrs\\['job'\\]"):
        layoutsearch.report(bare, tmp_path)


@pytest.mark.parametrize(("arguments", "message"), [
    ((5,), r"report\(result=5\): must be the DataFrame layoutsearch.search returned, not an int"),
    (("ranked.csv",), r"report\(result='ranked.csv'\): .* not a str"),
])
def test_report_of_something_else_is_a_user_error(arguments, message, tmp_path: Path) -> None:
    with pytest.raises(LayoutSearchError, match=message):
        layoutsearch.report(*arguments, tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("top_k", [0, -3, 2.5, True])
def test_report_top_k_must_be_a_positive_integer(ranked: pd.DataFrame, top_k, tmp_path: Path
                                                 ) -> None:
    with pytest.raises(LayoutSearchError, match=rf"report\(top_k={top_k!r}\): must be an "
                       "integer >= 1"):
        layoutsearch.report(ranked, tmp_path, top_k=top_k)


@pytest.mark.parametrize("out_dir", [5, True, ["report"]])
def test_report_out_dir_must_be_a_path(ranked: pd.DataFrame, out_dir, tmp_path: Path) -> None:
    # pathlib's TypeError ("expected str, bytes or os.PathLike object, not int") before.
    with pytest.raises(LayoutSearchError, match=re.escape(
            f"report(out_dir={out_dir!r}): must be the path of a folder, or None for "
            "./layoutsearch-report")):
        layoutsearch.report(ranked, out_dir)


def test_report_into_a_file_is_a_user_error(ranked: pd.DataFrame, tmp_path: Path) -> None:
    taken = tmp_path / "ranked.csv"
    taken.write_text("kept\n")
    with pytest.raises(LayoutSearchError, match=r"out_dir='.*ranked\.csv'\): is a file"):
        layoutsearch.report(ranked, taken)
    # A folder under a file cannot be made either (pathlib: NotADirectoryError).
    with pytest.raises(LayoutSearchError, match=re.escape(
            f"report(result, out_dir='{taken}/report'): lies under {taken}, a file; the "
            "outputs go into a folder (name a new or existing folder)")):
        layoutsearch.report(ranked, taken / "report")
    assert taken.read_text() == "kept\n"


def test_report_when_nothing_fits(tmp_path: Path) -> None:
    with pytest.warns(layoutsearch.NoLayoutFitsWarning):
        ranked = layoutsearch.search(model="llama_65b", num_gpus=8, seq_length=2048,
                                     global_batch_size=64)
    text = layoutsearch.report(ranked, tmp_path).read_text()
    assert "**Nothing fits.**" in text
    assert not (tmp_path / "breakdown.png").exists()


def test_every_report_part_refuses_a_predict_frame_by_name(measurement_row) -> None:
    # predict() puts a model's figures beside measured rows: it is no ranking to explain.
    predicted = layoutsearch.predict(pd.DataFrame([measurement_row, measurement_row]))
    job = layoutsearch.Job(model=layoutsearch.load_model("llama_13b"),
                           cluster=layoutsearch.load_cluster("a100_80gb"), num_gpus=64,
                           seq_length=2048, global_batch_size=2048)
    calls = {
        "check_study_rules(ranked)": lambda: check_study_rules(predicted, job),
        "why_rejected(ranked)": lambda: why_rejected(predicted),
        "tp_pp_heatmap(ranked)": lambda: tp_pp_heatmap(predicted),
        "mfu_memory_figure(ranked)": lambda: mfu_memory_figure(predicted, gpu_memory_gib=80),
        "top_table(ranked)": lambda: top_table(predicted),
        "report(result)": lambda: write_report(predicted, Path("unused")),
        "compare(other)": lambda: compare(predicted.iloc[0], predicted.iloc[1]),
    }
    calls["layoutsearch.report"] = lambda: layoutsearch.report(predicted, Path("unused"))
    for name, call in calls.items():
        who = "report(result)" if name == "layoutsearch.report" else name
        with pytest.raises(LayoutSearchError, match=re.escape(
                f"{who}: the ") + r"(frame|row) lacks the ranking's column\(s\) .*fits, "
                r"reason \(a predict\(\) frame holds .*predicted_fits, predicted_reason"):
            call()


def test_an_empty_ranking_has_nothing_to_explain_and_no_report(ranked, tmp_path) -> None:
    empty = ranked.iloc[0:0]
    assert why_rejected(empty) == []
    with pytest.raises(LayoutSearchError, match=r"report\(result\): the result has no rows"):
        write_report(empty, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_job_table_gives_the_gpu_memory_the_fit_calls_use(tmp_path: Path) -> None:
    # An H100 holds 79.6 GiB; rows that do not fit say "> 79.6 GiB": the job table agrees.
    h100 = layoutsearch.search(model="llama3_8b", cluster="h100_sxm", num_gpus=8,
                               seq_length=2048, global_batch_size=256)
    text = layoutsearch.report(h100, tmp_path / "h100").read_text()
    assert "| GPUs | 8 × h100_sxm (8 per node, 79.6 GiB each) |" in text


def _replay_of_three_runs(tmp_path: Path, row: dict[str, Any], *extra: dict[str, Any],
                          ) -> pd.DataFrame:
    """A replay of tp2 mb1, tp2 mb2 and tp1 mb1 (and `extra` runs) on a space that also has
    sequence parallelism, which those runs never used."""
    runs = [{**row, "distributed_optimizer": True},
            {**row, "distributed_optimizer": True, "micro_batch_size": 2, "mfu": 0.55,
             "step_time_s": 32.7},
            {**row, "distributed_optimizer": True, "tp": 1, "dp": 64, "mfu": 0.5,
             "step_time_s": 36.0}, *extra]
    path = tmp_path / "runs.csv"
    pd.DataFrame(runs).to_csv(path, index=False)
    return layoutsearch.search(
        **{**JOB, "vocab_size": 32000}, tp=[1, 2], pp=[1], micro_batch_size=[1, 2],
        attention=["flash2"], rmsnorm_kernel=[True], recompute=["none"],
        sequence_parallel=[False, True],
        cost_model={"_target_": "layoutsearch.costs.replay.ReplayCostModel", "path": str(path)})


def test_a_replay_report_says_once_that_it_cannot_say_why(tmp_path: Path,
                                                           measurement_row) -> None:
    text = layoutsearch.report(_replay_of_three_runs(tmp_path, measurement_row),
                               tmp_path / "report").read_text()
    # Three comparisons (tp, micro-batch, the rules' least model parallelism), one note.
    assert text.count("reaches") >= 3
    assert text.count("cost model gives no time breakdown") == 1
    # Outside a report, a comparison still says it.
    assert why_rejected(_replay_of_three_runs(tmp_path, measurement_row))[0].endswith(
        "(10.0 points lower) (this cost model gives no time breakdown to say why)")


def test_layouts_a_replay_never_measured_are_not_said_not_to_fit(tmp_path: Path,
                                                                  measurement_row) -> None:
    lines = why_rejected(_replay_of_three_runs(tmp_path, measurement_row))
    assert "; no layout with another value was measured — unmeasured: " in lines[-1]
    assert "fits" not in lines[-1]
    # A measured run out of memory beside an unmeasured one: that one does not fit.
    oom = {**measurement_row, "distributed_optimizer": True, "sequence_parallel": True,
           "status": "oom", "mfu": None, "step_time_s": None}
    lines = why_rejected(_replay_of_three_runs(tmp_path, measurement_row, oom))
    assert lines[-1].endswith("; no layout with another value fits — measured: out of "
                              "memory (1 layout); 1 more was not measured")


def test_the_best_layouts_arguments_come_with_the_environment_its_run_needs(
        tmp_path: Path) -> None:
    # At tp 2 Megatron-LM's validate_args refuses to start without
    # CUDA_DEVICE_MAX_CONNECTIONS=1 (pre-Blackwell): arguments copied from the report alone
    # would not run. At tp 1 the environment holds only Transformer Engine's switches.
    tp2 = layoutsearch.search(model="llama_13b", num_gpus=8, seq_length=2048,
                              global_batch_size=64, tp=[2], pp=[1])
    text = layoutsearch.report(tp2, tmp_path / "tp2").read_text()
    assert ("Environment the run needs (emit=megatron's scripts set it):\n\n```\n"
            "CUDA_DEVICE_MAX_CONNECTIONS=1 NVTE_FLASH_ATTN=1 NVTE_FUSED_ATTN=0 "
            "NVTE_UNFUSED_ATTN=0\n```") in text
    tp1 = layoutsearch.search(model="llama_13b", num_gpus=8, seq_length=2048,
                              global_batch_size=64, tp=[1], pp=[8], attention="torch",
                              rmsnorm_kernel=False, sequence_parallel=False)
    text = layoutsearch.report(tp1, tmp_path / "tp1").read_text()
    assert ("Environment the run needs (emit=megatron's scripts set it):\n\n```\n"
            "NVTE_FLASH_ATTN=1 NVTE_FUSED_ATTN=1 NVTE_UNFUSED_ATTN=1\n```") in text
