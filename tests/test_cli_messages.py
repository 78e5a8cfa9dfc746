"""The command's messages for a mistyped input: each one line, naming the option, what
was wrong and the fix (a close valid name where there is one); nothing runs."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from autoremat.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = f"{ROOT / 'tests' / 'tiny_problem.py'}:tiny"


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of a usage error (exit 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autoremat: error: "), err
    return err


@pytest.mark.parametrize("argv", [["--budget", "-1GB"], ["--budget=-1GB"]])
def test_a_negative_budget_is_named_not_read_as_an_option(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["tune", *argv], capsys)
    assert "--budget: '-1GB' is negative" in err and "expected one argument" not in err


def test_a_negative_count_is_checked_as_a_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--trials: expected an integer from 0" in _error(["tune", "--trials", "-3"], capsys)


@pytest.mark.parametrize(("budget", "fix"), [("4Gb", "4GB"), ("512Mb", "512MB")])
def test_a_budget_in_bits_is_refused_naming_the_unit(
        budget: str, fix: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["tune", "--budget", budget], capsys)
    assert f"--budget: '{budget}' reads as" in err and "bits" in err and f"write {fix}" in err


def test_bits_are_refused_by_the_library_too() -> None:
    from autoremat._errors import BudgetError
    from autoremat._units import parse_bytes

    with pytest.raises(BudgetError, match="gigabits"):
        parse_bytes("4Gb")
    assert parse_bytes("4GB") == parse_bytes("4gb") == 4 * 10**9  # bytes, as before


def test_an_unknown_problem_lists_the_built_in_ones(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["tune", "--problem", "nosuch"], capsys)
    assert "(seed_lstm, layer_stack)" in err and "package.module:name" in err
    assert "did you mean" not in err
    err = _error(["tune", "--problem", "layer_stak"], capsys)
    assert err.rstrip().endswith("did you mean 'layer_stack'?")


@pytest.mark.parametrize(("argv", "close"), [
    (["tune", "--budgt", "4GB"], "--budget"),
    (["tune", "--trails", "3"], "--trials"),
    (["pareto", "--jsn"], "--json"),
    (["tun"], "tune"),
    (["export", "--format", "maxtxt"], "maxtext"),
])
def test_a_mistyped_option_command_or_format_gets_the_closest(
        argv: list[str], close: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert f"did you mean '{close}'?" in _error(argv, capsys)


def test_a_mistyped_policy_gets_the_closest() -> None:
    import autoremat
    from autoremat import ScheduleError

    with pytest.raises(ScheduleError, match="did you mean 'nothing_saveable'"):
        autoremat.Policy("nothing_savable")
    with pytest.raises(ScheduleError, match="did you mean 'save_only_these_names'"):
        autoremat.Policy.from_data({"save_only_these_name": ["gates"]})


def test_a_layer_stack_size_with_a_users_problem_says_it_sets_its_own(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["tune", "--problem", TINY, "--layers", "4"], capsys)
    assert "--layers: only resizes the built-in problems" in err
    assert "your --problem sets its own sizes" in err and "add --problem" not in err
    # with the default problem, the layer stack is the one it sizes
    err = _error(["tune", "--layers", "4"], capsys)
    assert "--layers: sizes the built-in layer_stack only; add --problem layer_stack" in err


def test_tune_settings_are_one_typed_record_of_the_table() -> None:
    from autoremat._cli.settings import (
        PROBLEM_SETTINGS,
        TUNE_SETTINGS,
        ProblemSettings,
        TuneSettings,
    )

    own = {s.name for s in TUNE_SETTINGS if s not in PROBLEM_SETTINGS}
    assert {f.name for f in fields(TuneSettings)} == own
    settings = TuneSettings.of({"total_trials": 5, "problem": "layer_stack", "layers": 4,
                                "seq2seq": True, "unfused_readout": True})
    assert settings.trials == 5 and settings.out == "schedule.yaml"
    assert settings.problem == ProblemSettings("layer_stack", (("fused_readout", False),
                                                               ("layers", 4)))
    assert settings.problem.flag("fused_readout") == "--unfused-readout"


def test_every_built_in_models_sizes_are_options() -> None:
    from autoremat._cli.settings import PROBLEM_SETTINGS
    from autoremat._models import MODELS

    options = {s.name for s in PROBLEM_SETTINGS}
    for model in MODELS.values():
        assert {size.name for size in model.sizes} <= options
        assert set(model.settings) <= options


def test_a_conflict_of_the_seeds_settings_names_both_flags(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["tune", "--last-only", "--fused-readout"], capsys)
    assert err.startswith("autoremat: error: --fused-readout: the loss on the last state "
                          "(--last-only) stacks no outputs")
