"""The measured cost model: run each candidate through Megatron-LM and read its log.

Every finished trial is appended at once to a measurement file in the project's schema
(docs/measurements.md), so a search that is killed resumes where it stopped: a layout already
in the file is never launched again, and searches sharing the file claim each layout before
they launch it (claims.py), so that none is launched twice and they split the launches.
With a `prescreen` model (the analytic one) only its `top_k` best candidates are launched;
the others say why they were not measured.

    model = build_cost_model("measured", prescreen="analytic", top_k=8)
    scored = model.score(candidates, clusters)   # launches, parses logs, appends rows
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from layoutsearch.costs.base import MEASURED_FAILURE, CostModel, cost_model_fingerprint
from layoutsearch.costs.claims import Claimant, claimed
from layoutsearch.costs.measurement_file import (
    MeasurementFile,
    by_key,
    measurement_key,
    plain_value,
)
from layoutsearch.costs.trial_rows import (
    beyond_the_gpu,
    outcome_line,
    result_row,
    trial_name,
)
from layoutsearch.errors import LayoutSearchError
from layoutsearch.interrupts import (
    deferring_interrupts_once_started,
    noticing_interrupts,
    raise_if_interrupted,
    start_deferring_interrupts,
)
from layoutsearch.layout import Layout
from layoutsearch.measurements import (
    MEASUREMENT_KEY,
    not_a_table,
)
from layoutsearch.megatron.args import (
    FLASH2_ON_HOPPER,
    FLASH_KERNELS,
    MegatronCommand,
    command_of_row,
    flash3_attention_option,
    job_of_row,
)
from layoutsearch.megatron.checkout_check import WRITTEN_FOR, CheckoutCheck
from layoutsearch.megatron.checks import every_command_rejected, rejection
from layoutsearch.megatron.inverse import row_of_argv
from layoutsearch.megatron.launchers import Launcher, Trial, build_launcher
from layoutsearch.megatron.logs import parse_log
from layoutsearch.megatron.scripts import trial_time_limit_s
from layoutsearch.megatron.settings import MegatronSettings, resolve_settings
from layoutsearch.paths import unwritable_folder
from layoutsearch.progress import say
from layoutsearch.specs import ClusterSpec

RETRIABLE = ("error", "timeout", "oom", "unavailable")
"""Statuses a measured search may be told to launch again (`retry`)."""
RETRY_HINTED = ("error", "timeout")
"""Failures that may be passing (a crashed node, an NCCL flake, too short a time limit): their
reason says how to launch them again."""


DEFAULT_PRESCREEN = "analytic"
"""The prescreen of a config that sets top_k and names none (from_config)."""


def _tell(line: str) -> None:
    """One line per trial on stderr: a measured search runs for hours, one trial at a time,
    and a dry run's scripts are otherwise found only in the result's reasons."""
    say(line)


class MeasuredCostModel:
    """Prices layouts by running them; remembers every run in a measurement file."""

    name = "measured"

    def __init__(self, *, settings: MegatronSettings, measurements: str | Path,
                 launcher: Launcher | None = None, prescreen: CostModel | None = None,
                 top_k: int | None = None, retry: Collection[str] = (),
                 prescreen_by_default: bool = False) -> None:
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                                  or top_k <= 0):
            raise LayoutSearchError(f"measured.top_k={top_k!r}: must be a positive integer")
        # A scalar (true, 3) is no list, and a mapping would pass as its keys.
        if isinstance(retry, str | Mapping) or not isinstance(retry, Collection) or not all(
                isinstance(status, str) and status in RETRIABLE for status in retry):
            raise LayoutSearchError(
                f"measured.retry={retry!r}: must be a list of the statuses to launch again, "
                f"of {', '.join(RETRIABLE)} (e.g. [error, timeout])")
        if not isinstance(measurements, str | Path) or not str(measurements).strip():
            # null is no way to measure without a file: a killed search would start over.
            raise LayoutSearchError(
                f"measured.measurements={measurements!r}: must be the path of the measurement "
                "file each run is appended to (CSV, or Parquet by its suffix; the default "
                "is measurements.csv)")
        if not_a_table(measurements):
            # Found out on reading it back, after the first launch had been written to it.
            raise LayoutSearchError(
                f"measured.measurements={str(measurements)!r}: {not_a_table(measurements)}")
        self.prescreen_by_default = prescreen_by_default
        """Whether the prescreen is DEFAULT_PRESCREEN, taken because top_k named none."""
        self.retry = tuple(retry)
        """Statuses whose recorded layouts are launched again (a fixed flake, a longer
        time limit); the new row is appended and, being the last, is the one read."""
        self.settings = settings
        self.file = MeasurementFile(measurements)
        self.launcher = launcher or build_launcher(settings)
        self.checkout_check = CheckoutCheck(settings)
        """The checkout's own validate_args, asked of each command before it is launched."""
        self.prescreen = prescreen
        self.top_k = top_k
        self.launched = 0
        """Trials this instance launched (for reports and tests)."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str = "") -> MeasuredCostModel:
        """From `cost_models/measured.yaml`: megatron, launcher, measurements, prescreen,
        top_k, timeout_s, retry (a status name or a list of them).

        `top_k` without a `prescreen` takes the analytic one (DEFAULT_PRESCREEN): top_k
        means the best k, and unranked they would be the first k the space lists;
        `prescreen: false` asks for those.
        """
        known = {"megatron", "launcher", "measurements", "prescreen", "top_k", "timeout_s",
                 "retry"}
        unknown = set(config) - known
        if unknown:
            raise LayoutSearchError(
                f"{source}: unknown setting(s) {', '.join(sorted(unknown))} for the measured "
                f"cost model; it takes {', '.join(sorted(known))}"
            )
        settings = resolve_settings(config.get("megatron"))
        changes = {k: config[k] for k in ("launcher", "timeout_s") if config.get(k) is not None}
        if changes:
            try:
                settings = settings.replace(**changes)
            except LayoutSearchError as error:
                given = ", ".join(f"{k}={v!r}" for k, v in changes.items())
                raise LayoutSearchError(
                    f"{source}: {given} (the measured cost model's own setting, which "
                    f"overrides the Megatron-LM settings'): {error}") from None
        prescreen = None
        named = config.get("prescreen")
        by_default = named is None and bool(config.get("top_k"))
        chosen = DEFAULT_PRESCREEN if by_default else named
        # null and false alone mean none: 0, "" or [] are no cost model, and are refused.
        if chosen is not None and chosen is not False:
            from layoutsearch.costs import build_cost_model  # the registry imports this module

            prescreen = build_cost_model(chosen, name="measured.prescreen",
                                         setting="measured.prescreen")
            if isinstance(prescreen, MeasuredCostModel):
                # A prescreen prices every candidate to pick top_k: as training runs, that
                # is the whole grid.
                raise LayoutSearchError(
                    f"{source}: prescreen={chosen!r} is a measured cost model, "
                    "which would launch every candidate to choose the top_k to launch; use "
                    "analytic, a calibrated analytic file or a replay of measurements")
        retry = config.get("retry")
        return cls(settings=settings,
                   measurements=config.get("measurements", "measurements.csv"),
                   prescreen=prescreen, top_k=config.get("top_k"),
                   # null and false retry nothing; anything else the constructor checks.
                   retry=[retry] if isinstance(retry, str) else
                   () if retry is None or retry is False else retry,
                   prescreen_by_default=by_default)

    def _prescreened(self, candidates: pd.DataFrame, clusters: Mapping[str, ClusterSpec],
                     reasons: pd.Series) -> tuple[list[Any], pd.DataFrame | None]:
        """The rows worth launching, best first, and the prescreen's scores (None without
        one); the rows the prescreen predicts do not fit get that as their reason."""
        if self.prescreen is None:
            return list(candidates.index), None
        try:
            prior = self.prescreen.score(candidates, clusters)
        except LayoutSearchError as error:
            if not self.prescreen_by_default:
                raise
            raise LayoutSearchError(
                f"measured.top_k={self.top_k} launches the best {self.top_k} layouts by a "
                f"prescreen, the {self.prescreen.name} model as none was named, which cannot "
                f"price them: {error}. Name one that can (cost_models.prescreen=<a "
                f"calibrated file or a replay>), or set cost_models.prescreen=false to launch "
                f"the first {self.top_k} in the space's order; nothing was launched") from None
        fits = prior["fits"].fillna(False).astype(bool)
        reasons.loc[~fits] = (f"not measured: the {self.prescreen.name} model predicts it "
                              "does not fit: " + prior.loc[~fits, "cost_reason"].astype(str))
        return list(prior[fits].sort_values("mfu", ascending=False, kind="stable").index), prior

    def _recorded(self, known: Mapping[tuple[Any, ...], Mapping[str, Any]],
                  row: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The file's row for this layout, unless its status is one to launch again."""
        measured = known.get(measurement_key(row))
        return None if measured is None or measured["status"] in self.retry else measured

    def _refusal(self, row: Mapping[str, Any], clusters: Mapping[str, ClusterSpec]) -> str:
        """Why this layout is not launched ("" when it is): no Megatron-LM command runs it
        as asked (flash1, say), or Megatron-LM's argument checks would reject the command."""
        command = command_of_row(row, clusters, self.settings)
        if command.notes:
            return "not measured: " + command.notes[0]
        error = rejection(command, self.launcher.environment(command))
        cause = every_command_rejected(
            error, lambda settings: command_of_row(row, clusters, settings), self.settings,
            self.launcher.environment) if error else ""
        if cause:
            raise LayoutSearchError(
                f"cost_models=measured cannot launch: {cause}; nothing was launched, and the "
                f"measurements in {self.file.path} are kept")
        if error:
            return f"not measured: Megatron-LM would reject the command: {error}"
        # The settings cannot change the layout a command runs (MegatronSettings refuses
        # that), but the launcher's environment (the user's shell) can.
        otherwise = self._runs_otherwise(command, row)
        if otherwise:
            return f"not measured: the command would run {otherwise[0]}"
        verdict = self.checkout_check.verdict(command, self.launcher.environment(command))
        if verdict is None or verdict.outcome != "rejected":
            return ""
        where = self.checkout_check.where
        if verdict.refuses_the_flags:
            raise LayoutSearchError(
                f"cost_models=measured cannot launch: {where} does not take the command's "
                f"flags ({verdict.message}); layoutsearch writes {WRITTEN_FOR}. Use such a "
                f"checkout, or set validate_args: false in the "
                f"Megatron-LM settings to launch anyway. Nothing was launched; "
                f"{self._what_the_file_keeps()}")
        return f"not measured: {where} rejects the command: {verdict}"

    def _runs_otherwise(self, command: MegatronCommand, row: Mapping[str, Any]) -> list[str]:
        """What the command runs other than the row asks ("micro_batch_size 2, not 1"), read
        back from its argv as Megatron-LM parses it; [] when it runs the row."""
        attention = str(row["attention"])
        ran = row_of_argv(command.argv, env=self.launcher.environment(command),
                          world_size=command.num_gpus, gpu=str(row["gpu"]),
                          gpus_per_node=command.gpus_per_node,
                          flash_kernel=attention if attention in FLASH_KERNELS else "flash2")
        asked = {**row, "sequence_parallel": bool(row["sequence_parallel"]) and row["tp"] > 1}
        differ = [column for column in MEASUREMENT_KEY
                  if plain_value(ran[column]) != plain_value(asked[column])]
        return [f"{column} {plain_value(ran[column])!r}, not {plain_value(asked[column])!r}"
                for column in differ]

    def _selection(self, candidates: pd.DataFrame, clusters: Mapping[str, ClusterSpec],
                   reasons: pd.Series, known: Mapping[tuple[Any, ...], Mapping[str, Any]],
                   top_k: int | None) -> tuple[list[Any], pd.DataFrame | None]:
        """The rows to price, best first — recorded in the file, or launched — and the
        prescreen's scores (None without one). Layouts that are not launched are passed over
        with their reason, so that the `top_k` rows all measure what was asked; a layout
        the file records is priced from it wherever it ranks, launching nothing."""
        ordered, prior = self._prescreened(candidates, clusters, reasons)
        beyond = (f"not measured: beyond top_k={top_k}" if self.prescreen is None
                  else f"not measured: outside the {self.prescreen.name} top-{top_k}")
        chosen: list[Any] = []
        taken = 0  # rows of the top_k window: the best `top_k` that can be priced
        for i in ordered:
            row = {str(k): v for k, v in candidates.loc[i].items()}
            recorded = self._recorded(known, row)
            if top_k is not None and taken >= top_k:
                # Beyond the window only what the file records is priced (from its row).
                if recorded:
                    chosen.append(i)
                else:
                    reasons.loc[i] = beyond
                continue
            refusal = "" if recorded else self._refusal(row, clusters)
            if refusal:
                reasons.loc[i] = refusal
            else:
                chosen.append(i)
                taken += 1
        if known and prior is not None:
            # A layout the file holds is priced from its row even when the prescreen
            # predicts it does not fit: the run it records says what happened.
            for i in candidates.index.difference(ordered, sort=False):
                if self._recorded(known, {str(k): v for k, v in candidates.loc[i].items()}):
                    chosen.append(i)
                    reasons.loc[i] = ""
        return chosen, prior

    def coverage_note(self, candidates: pd.DataFrame,
                      clusters: Mapping[str, ClusterSpec]) -> str:
        """When the prescreen's best layouts (`candidates`: a search's layouts that pass the
        rules) are ones no command runs as asked, so that none of them is measured: how
        many, the best of them and why, and, where that is FlashAttention 2 on Hopper in a
        space without flash3, how to measure FlashAttention there. "" without a prescreen,
        or when its best layout that fits is measured (or recorded)."""
        if self.prescreen is None or candidates.empty:
            return ""
        reasons = pd.Series("", index=candidates.index, dtype=object)
        ordered, prior = self._prescreened(candidates, clusters, reasons)
        known = self.file.load()
        passed: dict[Any, str] = {}
        measured = None
        with self.checkout_check:
            for i in ordered:
                row = {str(k): v for k, v in candidates.loc[i].items()}
                refusal = "" if self._recorded(known, row) else self._refusal(row, clusters)
                if not refusal:
                    measured = i
                    break
                passed[i] = refusal.removeprefix("not measured: ")
        if not passed or prior is None:
            return ""
        best = next(iter(passed))
        name = self.prescreen.name
        against = ("" if measured is None else
                   f"; the best it measures is predicted {float(prior.loc[measured, 'mfu']):.3f}")
        note = (f"the {name} model's {len(passed)} best layout"
                f"{'s are' if len(passed) > 1 else ' is'} not measured, as no command runs "
                f"{'them' if len(passed) > 1 else 'it'} as asked: the best, "
                f"{Layout.from_row(candidates.loc[best]).describe()} (predicted MFU "
                f"{float(prior.loc[best, 'mfu']):.3f}{against}): {passed[best]}.")
        option = flash3_attention_option({str(k) for k in candidates["attention"].unique()})
        if FLASH2_ON_HOPPER in passed.values() and option:
            note += (" On this GPU FlashAttention is measured as flash3, which the space "
                     f"leaves out: add it ({option}, or attention=[..., 'flash3'] in Python).")
        return note

    def unpriced(self, candidates: pd.DataFrame,
                 clusters: Mapping[str, ClusterSpec]) -> pd.Series:
        """Why each layout would get no figures, launching nothing: the prescreen predicts
        it does not fit, or it is not recorded and would not be launched ("" otherwise).
        `top_k` is left out: it ranks the rows of one call, and a driver that asks one
        layout at a time gets each one priced."""
        reasons = pd.Series("", index=candidates.index, dtype=object)
        with self.checkout_check:
            self._selection(candidates, clusters, reasons, self.file.load(), top_k=None)
        return reasons

    def recorded(self, candidates: pd.DataFrame,
                 clusters: Mapping[str, ClusterSpec]) -> pd.Series:
        """Whether the measurement file holds a run of each layout that prices it, launching
        nothing (a run of a status in `retry` is launched again: not such a run)."""
        known = self.file.load()
        held = np.zeros(len(candidates), dtype=bool)
        # Only a row whose parallel sizes some run has can match one: key those alone. A
        # key is ~20 µs of Python, and a sampling search asks this of every layout of the
        # space it did not try (a million, in a large one).
        sizes = ["tp", "pp", "cp", "dp", "micro_batch_size"]
        ran = {tuple(int(run[c]) for c in sizes) for run in known.values()}
        if ran:
            maybe = pd.MultiIndex.from_frame(candidates[sizes]).isin(list(ran))
            held[maybe] = [self._recorded(known, {str(k): v for k, v in row.items()}) is not None
                           for row in candidates[maybe].to_dict("records")]
        return pd.Series(held, index=candidates.index)

    def _measure(self, row: Mapping[str, Any], clusters: Mapping[str, ClusterSpec],
                 predicted_step_s: float | None, position: str, rows_read: int,
                 wait: bool) -> dict[str, Any] | str | Claimant:
        """A new measurement row (or the row another search sharing the file recorded
        meanwhile: costs/claims.py), or why the layout could not be launched; with
        `wait=False`, the Claimant of another live search measuring it, which is not waited
        for. The prescreen's predicted step time (s), when there is one, sizes the trial's
        time limit; `position` ("launch 3 of 8: ", or "") goes before the trial's name in
        its lines; `rows_read` is how many rows the file had when this search read it."""
        command = command_of_row(row, clusters, self.settings)
        name = trial_name(row)
        unwritable = self.file.unwritable()
        if unwritable:
            # Checked before each launch, not after: a finished run must have a place to go.
            raise LayoutSearchError(
                f"cost_models=measured cannot record a run: the measurement file "
                f"{str(self.file.path)!r} {unwritable}. Nothing was launched for {name}; "
                "set cost_models.measurements to a CSV or Parquet file that can be written")
        log_dir = self.settings.log_dir
        unwritable = unwritable_folder(log_dir)
        if unwritable:
            # Every launcher writes the trial's log (and script) there: a launch would end
            # in NotADirectoryError or PermissionError, for this layout and every other.
            raise LayoutSearchError(
                f"cost_models=measured cannot keep a trial's log: megatron.log_dir={log_dir}: "
                f"{unwritable}. Nothing was launched for {name}")
        problem = self.launcher.preflight(command)
        if problem:
            # A setup problem holds for every layout of the search: stop, record nothing.
            raise LayoutSearchError(
                f"cost_models=measured cannot launch with launcher={self.launcher.name}: "
                f"{problem}. Nothing was launched for {name}; {self._what_the_file_keeps()}")
        # `~` expanded as the check above expands it: a path is taken literally by open().
        log_path = Path(log_dir).expanduser() / f"{name}.log"
        trial = f"{self.launcher.name}: {position}{name}"
        # A dry run trains nothing: only a launch is claimed, and waited for.
        claim = (claimed(self.file, row, trial, since=rows_read, retry=self.retry, wait=wait)
                 if self.launcher.trains else contextlib.nullcontext(None))
        with claim as recorded:
            if isinstance(recorded, Claimant):
                _tell(f"{trial}: being measured by {recorded}; launching the others first, "
                      f"then reading its row from {self.file.path}")
                return recorded
            if recorded is not None:
                _tell(outcome_line(trial, recorded, "measured by another search, read from "
                                   f"{self.file.path}"))
                return recorded

            def say_started() -> None:
                # A trial trains for minutes to hours before its result line: say it runs.
                limit_s = trial_time_limit_s(self.settings, predicted_step_s)
                limit = f"{limit_s:.0f} s" if limit_s < 600 else f"{limit_s / 60:.0f} min"
                _tell(f"{trial}: started, time limit {limit} (log {log_path})")

            return self._launch_and_record(row, clusters, Trial(
                name=name, command=command, log_path=log_path, step_time_s=predicted_step_s,
                on_start=say_started, said_as=trial), trial)

    def _launch_and_record(self, row: Mapping[str, Any], clusters: Mapping[str, ClusterSpec],
                           launch: Trial, trial: str) -> dict[str, Any] | str:
        """Run `launch` and append its row to the file (the row), or say why it did not run
        (a str); `trial` names it in the lines said."""
        # A Ctrl-C from the trial's end on (the launcher says when: its log is still to be
        # read) waits for the run to be in the file: it may have trained for an hour, and
        # the same command would launch it again.
        with deferring_interrupts_once_started() as deferral:
            try:
                outcome = self.launcher.run(launch)
            except KeyboardInterrupt:
                if deferral.started:  # a second press, as its log was read
                    _tell(f"{trial}: finished, but a second Ctrl-C stopped the search before "
                          "it was recorded, so the same command launches it again")
                else:  # the launcher stopped the trial (a local one's processes, a Slurm job)
                    _tell(f"{trial}: stopped by Ctrl-C before it finished; nothing was "
                          "recorded, so the same command launches it again")
                raise
            start_deferring_interrupts()  # where the launcher did not say so itself
            if not outcome.ran:
                _tell(f"{trial}: {outcome.text}")
                return f"not measured: {outcome.text}"
            self.launched += 1
            result = parse_log(outcome.text, warmup_iters=self.settings.warmup_iters,
                               returncode=outcome.returncode, timed_out=outcome.timed_out)
            if result.setup_problem:
                raise LayoutSearchError(
                    f"cost_models=measured stopped: {launch.name} failed before training, as "
                    f"every layout would: {result.message} (log {launch.log_path}). Check "
                    f"python, torchrun, megatron_path and extra_args "
                    f"(cost_models/megatron.yaml); nothing was recorded for it; "
                    f"{self._what_the_file_keeps()}")
            job = job_of_row(row, clusters)
            measured = result_row(row, result, job, self.launcher.name, launch.log_path)
            impossible = beyond_the_gpu(measured, job)
            if impossible:
                raise self._ran_elsewhere(launch, job.cluster.gpu.name, impossible)
            self.file.append(measured)
            _tell(outcome_line(trial, measured))
            return measured

    def _ran_elsewhere(self, launch: Trial, gpu: str, why: str) -> LayoutSearchError:
        """The stop of a search whose run cannot have been on the job's `gpu` (`why`):
        naming the runs it recorded before, which may be of those other GPUs too."""
        earlier = self.launched - 1  # runs this search recorded before this one
        kept = (f"the {earlier} run{'s' if earlier > 1 else ''} this search recorded before "
                f"it in {self.file.path} may have run on those GPUs too: check them, and "
                "remove them from the file if so") if earlier else self._what_the_file_keeps()
        return LayoutSearchError(
            f"cost_models=measured stopped: {launch.name} cannot have run on {gpu} GPUs, as "
            f"the job says: {why} (log {launch.log_path}). Search with the cluster of the "
            f"GPUs the launcher runs on (cluster=NAME on the command line, cluster= in "
            f"Python); nothing was recorded for it, as it would be filed under {gpu}; {kept}")

    def _what_the_file_keeps(self) -> str:
        """How a setup problem's message ends: the file's runs are kept for the same command
        to resume from, or, before the first run, there are none to keep."""
        if self.file.is_empty():
            return f"no run is recorded in {self.file.path} yet"
        return (f"the measurements already in {self.file.path} are kept, and the same command "
                "resumes from them")

    def reprices(self, costs: Mapping[str, Any]) -> bool:
        """Whether a layout priced in an earlier search is asked again (its file row read, or
        launched): one that recorded nothing (a dry run, a refused launch, an exception) is
        no price, and a status in `retry` is to be launched again."""
        status = str(costs.get("measured_status") or "")
        return status == "" or status in self.retry

    def fingerprint(self) -> str:
        """The measurement file and what is launched: its rows grow while a study runs.
        The Megatron-LM settings and `retry` are left out, as the file's rows leave them out:
        a study resumes under a longer time limit, and `reprices` says what is launched
        again."""
        prescreen = cost_model_fingerprint(self.prescreen) if self.prescreen else None
        return f"{self.file.path.resolve()}|prescreen={prescreen}|top_k={self.top_k}"

    def fingerprint_covers(self) -> str:
        return (f"its measurement file ({self.file.path}), prescreen and top_k: one of them "
                "changed")

    def _price_row(self, i: Any, row: Mapping[str, Any],
                   known: dict[tuple[Any, ...], dict[str, Any]],
                   clusters: Mapping[str, ClusterSpec], predicted: float | None,
                   out: pd.DataFrame, reasons: pd.Series, position: str,
                   rows_read: int, wait: bool) -> bool:
        """Row `i` of `out` (and its reason) from the file's run of it, or launched (its
        lines begin with `position`): the launch is appended to the file and to `known`.
        False, leaving the row as it is, where `wait` is False and another live search
        measures the layout."""
        measured = self._recorded(known, row)
        if measured is None:
            outcome = self._measure(row, clusters, predicted, position, rows_read, wait)
            if isinstance(outcome, Claimant):
                return False
            if isinstance(outcome, str):
                reasons.loc[i] = outcome
                return True
            measured = outcome
            known[measurement_key(row)] = measured
        status = str(measured["status"])
        out.loc[i, "measured_status"] = status
        out.loc[i, "tflops_per_gpu"] = measured.get("tflops_per_gpu", np.nan)
        out.loc[i, "peak_memory_gib"] = measured.get("peak_memory_gib", np.nan)
        if status == "ok":
            out.loc[i, ["step_time_s", "mfu", "tokens_per_s"]] = [
                float(measured["step_time_s"]), float(measured["mfu"]),
                float(measured.get("tokens_per_s") or np.nan)]
            out.loc[i, "fits"] = True
        else:
            detail = str(measured.get("message") or "")
            detail = "" if detail == "nan" else detail
            again = (f" (cost_models.retry=[{status}] launches it again)"
                     if status in RETRY_HINTED else "")
            reasons.loc[i] = (f"{MEASURED_FAILURE}{status}" + (f": {detail}" if detail else "")
                              + again)
        return True

    def _launch_positions(self, chosen: list[Any], records: Mapping[Any, Mapping[str, Any]],
                          known: Mapping[tuple[Any, ...], Mapping[str, Any]]) -> dict[Any, str]:
        """The "launch 3 of 8: " of each row of `chosen` that this call launches, out of the
        layouts the file does not hold: the launches it makes at most (fewer when one stops
        the search). None when it launches one: a driver that prices a layout a call
        (optuna's trials, the paper rules' steps) counts them on its own progress line."""
        first: dict[tuple[Any, ...], Any] = {}  # a layout asked twice is launched once
        for i in chosen:
            if self._recorded(known, records[i]) is None:
                first.setdefault(measurement_key(records[i]), i)
        if len(first) < 2:
            return {}
        return {i: f"launch {k} of {len(first)}: " for k, i in enumerate(first.values(), 1)}

    def score(self, candidates: pd.DataFrame, clusters: Mapping[str, ClusterSpec],
              ) -> pd.DataFrame:
        index = candidates.index
        out = pd.DataFrame({
            "step_time_s": np.nan, "mfu": np.nan, "tokens_per_s": np.nan,
            "peak_memory_gib": np.nan, "fits": False, "cost_reason": "",
            "measured_status": "", "tflops_per_gpu": np.nan,
        }, index=index)
        with self.checkout_check:  # its process ends here; its answers are kept
            return self._score(candidates, clusters, out)

    def _score(self, candidates: pd.DataFrame, clusters: Mapping[str, ClusterSpec],
               out: pd.DataFrame) -> pd.DataFrame:
        reasons = pd.Series("", index=candidates.index, dtype=object)
        runs = self.file.runs()
        known = by_key(runs)
        chosen, prior = self._selection(candidates, clusters, reasons, known, self.top_k)
        if prior is not None and self.prescreen is not None:
            out[f"{self.prescreen.name}_mfu"] = prior["mfu"]
        records = {i: {str(k): v for k, v in r.items()}
                   for i, r in candidates.loc[chosen].to_dict("index").items()}
        positions = self._launch_positions(chosen, records, known)

        def price(i: Any, wait: bool) -> bool:
            predicted = None if prior is None else float(prior.loc[i, "step_time_s"])
            return self._price_row(i, records[i], known, clusters, predicted, out, reasons,
                                   positions.get(i, ""), len(runs), wait)

        try:
            # A Ctrl-C that a finalizer swallowed (interrupts.py) is raised before the next
            # launch, not after it: each may train for an hour.
            with noticing_interrupts():
                # A layout another search measures is waited for last: launching the rest
                # first, searches sharing the file split the launches instead of queueing
                # behind one another's. The last layout to launch ("launch 8 of 8", or one
                # alone, which has no position) is waited for at once: none is left to
                # launch first.
                last = max((n for n, i in enumerate(chosen) if i in positions), default=0)
                later = []
                for n, i in enumerate(chosen):
                    raise_if_interrupted()
                    if not price(i, wait=n >= last):
                        later.append(i)
                for i in later:
                    raise_if_interrupted()
                    price(i, wait=True)
                raise_if_interrupted()
        except KeyboardInterrupt:
            _tell(f"measured: interrupted; {self.file.path} keeps every finished run, and the "
                  "same command resumes without launching them again")
            raise
        out["cost_reason"] = reasons.astype(str)
        out["fits"] = out["fits"].astype(bool)
        tokens = candidates["global_batch_size"] * candidates["seq_length"]
        out["tokens_per_s"] = out["tokens_per_s"].fillna(tokens / out["step_time_s"])
        return out
