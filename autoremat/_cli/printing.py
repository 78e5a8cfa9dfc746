"""What ``autoremat tune`` prints: the progress bar while it measures, the result table.

Printing only; the figures come from the study (``autoremat._search.study``). tqdm is
imported when a bar is made, so ``autoremat --help`` stays instant.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autoremat._cli.breakdown_text import breakdown_lines
from autoremat._measure.measurement import ERROR, Measurement
from autoremat._measure.mesh import device_note
from autoremat._search.attrs import COMPILE_FAILED
from autoremat._search.reports import (
    FullLengthTiming,
    ProbeChecked,
    ProofOfFit,
    ProofOutcome,
    TuneEvent,
)
from autoremat._search.storage import redact
from autoremat._search.study import MeasuredTrial, TuneResult
from autoremat._units import format_bytes, format_seconds

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


class Progress:
    """A tqdm bar over the trials on a terminal -- one plain line per trial when stderr
    is redirected -- with the fastest that fits so far (of this worker's trials) and
    the last one; a failed trial is reported on stderr, and the search goes on.
    ``on_study`` is called with the study's name after each trial."""

    def __init__(self, total: int | None, budget: int, disable: bool,
                 on_study: Callable[[str], None]) -> None:
        from tqdm import tqdm

        self.tqdm = tqdm
        # A bar redraws itself with carriage returns: on a terminal only. Redirected
        # (a file, a CI log) each trial is one plain line instead.
        self.lines = not disable and not sys.stderr.isatty()
        self.bar = tqdm(total=total, desc="tune", unit="schedule",
                        disable=disable or self.lines, file=sys.stderr, dynamic_ncols=True)
        self.budget, self.on_study = budget, on_study
        self.best: MeasuredTrial | None = None
        self.done = 0

    def on_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """``tune``'s ``on_trial``."""
        self.on_study(study.study_name)
        done = MeasuredTrial.of(trial)
        if done is None:
            return
        m, describe = done.measurement, done.schedule.describe()
        if m.status == ERROR:
            self.tqdm.write(f"autoremat: trial {trial.number} failed ({describe}): {m.reason}; "
                            "going on", file=sys.stderr)
        best = self.best
        if m.fits(self.budget) and (best is None or (m.step_seconds or 0)
                                    < (best.measurement.step_seconds or 0)):
            best = self.best = done
        if not trial.user_attrs.get(COMPILE_FAILED):  # not one of --trials (tune)
            self.bar.update(1)
            self.done += 1
        shown = (f"best #{best.number} {best.schedule.describe()} "
                 f"{best.measurement.step_seconds:.3g} s/step" if best else "none fits yet")
        state = "cut" if m.cut else ("fits" if m.feasible else m.status)
        if self.lines:
            total = f"/{self.bar.total}" if self.bar.total else ""
            print(f"tune: trial {trial.number} ({self.done}{total}) {describe}: {state}, "
                  f"total {format_bytes(m.total_bytes)}{_device(m)}, "
                  f"step {format_seconds(m.step_seconds)}{_predicted(m)}"
                  f" | {shown}", file=sys.stderr, flush=True)
        else:
            self.bar.set_postfix_str(f"{shown} | last #{trial.number} {describe} {state}")

    def note(self, event: TuneEvent) -> None:
        """What the search is doing, one line on stderr above the bar (``tune``'s
        ``on_confirm``)."""
        self.tqdm.write(f"tune: {event_line(event)}", file=sys.stderr)

    def say(self, line: str) -> None:
        """One line of the tune's on stderr, above the bar."""
        self.tqdm.write(f"tune: {line}", file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def _predicted(m: Measurement) -> str:
    """`` (predicted from T'=...)`` for a step time timed on a short run."""
    return f" (predicted from T'={m.short_seq_len})" if m.timed_seq_len == m.short_seq_len \
        and m.short_seq_len is not None else ""


def _device(m: Measurement) -> str:
    """``, runtime peak X, compile scratch Y`` where the device measured them ("" on a CPU)."""
    return "".join(f", {name} {format_bytes(v)}" for name, v in (
        ("runtime peak", m.runtime_peak_bytes), ("compile scratch", m.compile_scratch_bytes))
        if v is not None)


def study_line(result: TuneResult) -> str:
    """The study and what it holds: schedules measured (in the study, by this call), trials
    queued and not measured (first candidates this call did not reach), failed compiles."""
    queued = (f"; {result.queued} queued, not measured (first candidates a later run measures "
              "first)" if result.queued else "")
    failed = (f"; {result.compile_failed} failed to compile (not counted)"
              if result.compile_failed else "")
    return (f"study: {result.study_name!r} in {redact(result.storage)} "
            f"({result.study_measured} schedules measured in the study, {result.measured} "
            f"measured now{queued}{failed})" + cache_words(result))


def cache_words(result: TuneResult) -> str:
    """``; compile cache: N of M schedule compiles read back (X%)`` ("" without one)."""
    use = result.compile_cache
    if use is None or not use.folder:
        return ""
    rate = use.rate
    whose = "" if use.own else " (yours)"
    if rate is None:
        return f"; compile cache{whose}: no schedule compile looked in it"
    return (f"; compile cache{whose}: {use.hits} of {use.hits + use.misses} schedule compiles "
            f"read back ({rate * 100:.0f}%)")


def result_table(result: TuneResult) -> str:
    """The study, the best trial and the plain scan (memory, time, vs plain), and where
    the best's (else the smallest's) memory goes."""
    plain = result.plain_trial
    plain_step = plain.measurement.step_seconds if plain else None

    def row(label: str, t: MeasuredTrial | None) -> str:
        if t is None:
            return f"  {label:<18} (not measured)"
        m = t.measurement
        ratio = f"{m.step_seconds / plain_step:.2f}x" if m.step_seconds and plain_step else "-"
        note = "" if m.feasible else f"  [{m.reason}]"
        measured = (f"{format_bytes(m.runtime_peak_bytes):>13} "
                    f"{format_bytes(m.compile_scratch_bytes):>13} {m.bound:>13} ") if device else ""
        return (f"  {label:<18} {format_bytes(m.total_bytes):>10} {measured}"
                f"{format_bytes(m.temp_bytes):>10} {format_seconds(m.step_seconds):>10} "
                f"{ratio:>9}  {t.schedule.describe()}{note}")

    best = result.best_trial
    shown = best or result.smallest_trial
    device = any(t is not None and (t.measurement.runtime_peak_bytes is not None
                                    or t.measurement.compile_scratch_bytes is not None)
                 for t in (best, plain, shown))
    confirmed = [
        f"  trial {t.number} timed at T'={t.measurement.short_seq_len}: "
        f"predicted {format_seconds(t.measurement.extrapolated_seconds)}, measured at full "
        f"length {format_seconds(t.measurement.step_seconds)}  {t.schedule.describe()}"
        for t in result.confirmed]
    return "\n".join([
        study_line(result),
        f"  memory figures: {device_note(result.devices, result.mesh)}",
        f"  {'':<18} {'total':>10} "
        + (f"{'runtime peak':>13} {'compile scr.':>13} {'bound':>13} " if device else "")
        + f"{'temp':>10} {'step':>10} {'vs plain':>9}  schedule",
        *(["  total: the estimate; runtime peak: measured, the step alone; compile scratch: "
           "transient while compiling; bound: which decided the fit (the runtime peak where "
           "measured)"]
          if device else []),
        row(f"best (trial {best.number})" if best else "best", best),
        *tie_lines(result),
        row(f"plain (trial {plain.number})" if plain else "plain scan", plain),
        *([f"  vs plain: against the plain scan with the readout and loss moved into its "
           f"step (trial {plain.number}); the plain scan as written, the readout after it, "
           "was not measured"] if plain is not None and plain.schedule.fuse else []),
        *(["short runs predicted the step times; confirmed at full length:", *confirmed]
          if confirmed else []),
        *([f"  note: {result.unconfirmed}"] if result.unconfirmed else []),
        *too_late_lines(result),
        *([f"  {proof_line(result.proof)}"] if result.proof is not None else []),
        *([f"{'best' if best else 'smallest'} (trial {shown.number}):",
           *breakdown_lines(shown.measurement)] if shown else []),
        *([f"  time limit {format_seconds(result.overrun.limit_seconds)} ran out inside "
           + ("the bound's two compiles" if result.overrun.trial is None
              else f"trial {result.overrun.trial}'s compile")
           + f" ({format_seconds(result.overrun.compile_seconds)}); "
           f"the tune took {format_seconds(result.overrun.elapsed_seconds)}"
           + (f" and {result.queued} queued trial(s) did not start" if result.queued else "")
           ] if result.overrun is not None else []),
        *([f"  least a schedule reaches: {format_bytes(result.bound.least_bytes)} "
           f"({result.bound.least}, compiled before the search); scheduling can save at most "
           f"{format_bytes(result.bound.saving)} ({100 * result.bound.share:.1f}%) of the "
           "step as written"] if result.bound is not None else []),
    ])


def too_late_lines(result: TuneResult) -> list[str]:
    """The candidates not started as their compile would end past the time limit."""
    late = result.too_late
    if not late:
        return []
    shown = ", ".join(f"{t.schedule} (~{t.seconds:.0f} s)" for t in late[:3])
    more = f" and {len(late) - 3} more" if len(late) > 3 else ""
    return [f"  not started: {len(late)} candidate(s) whose compile would end past the time "
            f"limit: {shown}{more}; a longer --time-limit would try them"]


def tie_lines(result: TuneResult) -> list[str]:
    """Why the best is not the fastest that fits: it tied with it within the measured
    noise and is smaller ("within noise of plain, 28x less memory")."""
    tie = result.tie
    if tie is None:
        return []
    fastest, mine = tie.fastest.measurement.step_seconds, tie.pick.measurement.step_seconds
    slower = f"{((mine or 0) / fastest - 1) * 100:+.1f}%" if fastest else "?"
    who = "the plain scan" if tie.fastest_is_plain else tie.fastest.schedule.describe()
    ratio = tie.memory_ratio
    smaller = f", {ratio:.3g}x less memory" if ratio is not None else ", less memory"
    return [f"  {'':<18} within noise of {who} (trial {tie.fastest.number}: "
            f"{format_seconds(fastest)}; {slower}, runs spread {tie.noise * 100:.1f}%)"
            f"{smaller}"]
def event_line(event: TuneEvent) -> str:
    """What the search is doing, in words (``tune``'s ``on_confirm``)."""
    if isinstance(event, FullLengthTiming):
        return (f"timing trial {event.trial} ({event.schedule.describe()}) at "
                f"T={event.seq_len}: predicted {event.predicted_seconds:.3g} s from "
                f"T'={event.short_seq_len}")
    if isinstance(event, ProbeChecked):
        return f"probe: {event.label}: {event.verdict.text()}"
    return (f"proof of fit: trial {event.trial} ({event.schedule.describe()}) ran out of "
            f"memory with only {format_bytes(event.budget_bytes)} on the device; proving "
            "the next fastest")


def proof_line(proof: ProofOfFit) -> str:
    """The proof of fit's outcome, in words."""
    if proof.outcome is ProofOutcome.PASSED:
        return (f"proof of fit: trial {proof.trial} ran once with only "
                f"{format_bytes(proof.budget_bytes)} on the device (its arguments live, the "
                "rest free)")
    if proof.outcome is ProofOutcome.NOT_RUN:
        return f"proof of fit: not run ({proof.why})"
    if proof.outcome is ProofOutcome.ALL_FAILED:
        return f"proof of fit: the {proof.tries} fastest picks failed it; nothing is written"
    return {ProofOutcome.SKIPPED: "proof of fit: skipped (a CPU has no device memory to fill)",
            ProofOutcome.NONE_FITS: "proof of fit: no pick left that fits"}[proof.outcome]


def name_cost_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What each ``checkpoint_name`` tag of a layer stack costs (``presets.LayerCosts.table``,
    a study's ``NAME_COSTS``): keeping it, per layer and over all layers; not keeping it,
    the matmul FLOPs a layer's backward pass redoes. Empty without tags."""
    if not rows:
        return []
    out = ["what each checkpoint name costs (from the step's trace; kept = bytes stored, "
           "recompute = matmul FLOPs redone when not kept):",
           f"  {'name':<22} {'kept per layer':>15} {'kept, all layers':>17} "
           f"{'recompute per layer':>20}"]
    for r in rows:
        out.append(f"  {r['name']:<22} {format_bytes(r['bytes_per_layer']):>15} "
                   f"{format_bytes(r['bytes']):>17} {r['flops_per_layer'] / 1e9:>14.3f} GFLOP")
    return out
