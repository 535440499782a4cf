"""`layoutsearch ... emit=megatron` writes launch scripts of the best layouts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

import layoutsearch
from layoutsearch.megatron import parse_argv
from layoutsearch.megatron.emit import emit_megatron, write_launch_scripts
from layoutsearch.results import job_of
from tests.commands import Command


def test_emit_megatron_writes_scripts_into_the_run_directory(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    run_dir = tmp_path / "run"
    done = run_layoutsearch(
        "model=llama_13b", "model.vocab_size=128000", "num_gpus=8", "global_batch_size=64",
        "search_spaces.tp=[1,2]", "search_spaces.pp=[1,2]", "emit=megatron", "top_k=5",
        f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    scripts = sorted((run_dir / "megatron").glob("*.sh"))
    assert len(scripts) == 5 and scripts[0].name.startswith("01_")
    argv = shlex.split(scripts[0].read_text().strip().splitlines()[-1])
    script = next(i for i, a in enumerate(argv) if a.endswith("pretrain_gpt.py"))
    args = parse_argv(argv[script + 1:])
    assert args.num_layers == 40 and args.vocab_size + 1 == 128000  # + NullTokenizer EOD
    assert "Megatron-LM launch scripts" in done.stdout
    # The default checkout (./Megatron-LM) is not there: the command says where scripts look.
    assert f"{tmp_path / 'Megatron-LM' / 'pretrain_gpt.py'}, which is not on this machine" \
        in done.stdout


def test_emit_megatron_takes_the_settings_file_named_by_megatron(
        tmp_path: Path, run_layoutsearch: Command) -> None:
    checkout = tmp_path / "opt" / "Megatron-LM"
    checkout.mkdir(parents=True)
    (checkout / "pretrain_gpt.py").write_text("")
    settings = tmp_path / "site_megatron.yaml"
    settings.write_text(f"megatron_path: {checkout}\n"
                        "extra_args: [--no-gradient-accumulation-fusion]\n")
    run_dir = tmp_path / "run"
    done = run_layoutsearch("num_gpus=8", "global_batch_size=64", "search_spaces.tp=[1]",
                            "search_spaces.pp=[1]", "emit=megatron", "top_k=1",
                            f"megatron={settings}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (script,) = (run_dir / "megatron").glob("*.sh")
    argv = shlex.split(script.read_text().strip().splitlines()[-1])
    assert str(checkout / "pretrain_gpt.py") in argv
    assert argv[-1] == "--no-gradient-accumulation-fusion"
    assert "not on this machine" not in done.stdout
    # ranked.csv and report.md carry the same command as the script.
    ranked = pd.read_csv(run_dir / "ranked.csv", keep_default_na=False)
    assert ranked.loc[0, "megatron_args"].endswith(" --no-gradient-accumulation-fusion")
    assert ranked.loc[0, "megatron_args"] in (run_dir / "report.md").read_text()


def test_emit_megatron_counts_its_scripts_and_the_layouts_they_share(tmp_path, capsys) -> None:
    ranked = layoutsearch.search(model="llama_13b", num_gpus=64, seq_length=2048,
                                 global_batch_size=2048, vocab_size=128000)
    emit_megatron(ranked, tmp_path / "one", top_k=1)
    assert "wrote 1 Megatron-LM launch script to" in capsys.readouterr().out
    # Rank 2 is a flash1 twin of rank 1 (one --attention-backend flash command).
    emit_megatron(ranked, tmp_path / "two", top_k=2)
    wrote = capsys.readouterr().out.splitlines()[0]
    assert wrote.startswith("wrote 2 Megatron-LM launch scripts to ")
    assert wrote.endswith("; 1 layout ranked among them runs the same command as a better one "
                          "and got no script of its own")


@pytest.mark.parametrize("top_k", [True, 1.5, float("nan"), None, "3"])
def test_launch_scripts_top_k_must_be_a_positive_integer(tmp_path, top_k) -> None:
    # 1.5 and True wrote scripts, NaN failed on max() of nothing, None and "3" on a comparison.
    ranked = layoutsearch.search(driver="paper", model="llama_7b", num_gpus=8,
                                 seq_length=2048, global_batch_size=256)
    with pytest.raises(layoutsearch.LayoutSearchError,
                       match=rf"^top_k={re.escape(repr(top_k))}: must be a positive integer$"):
        write_launch_scripts(ranked, job_of(ranked), tmp_path, top_k=top_k)
    assert not any(tmp_path.iterdir())


def test_a_script_of_a_layout_the_studys_rules_passed_over_says_so(tmp_path) -> None:
    # The rules price micro-batch 1, then raise it to 2: both fit, both get a script.
    ranked = layoutsearch.search(driver="paper", model="llama_7b", num_gpus=8,
                                 seq_length=2048, global_batch_size=256)
    paths = write_launch_scripts(ranked, job_of(ranked), tmp_path, top_k=2)
    pick, passed = (path.read_text() for path in paths)
    assert "passed over by the rules" not in pick
    assert "passed over by the rules: fits, no faster than the pick" in passed
