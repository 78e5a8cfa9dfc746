"""The command behaves as command-line users expect: ``--version``, ``--debug``, one table of
distinct exit codes (a crash is not a stale schedule), a budget without a unit warned and
one under the step's arguments refused before anything compiles, one duration syntax,
``--help`` in groups, the study folder's default stated."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest

from autoremat import cli
from autoremat._cli.exits import EXIT_CODES, EXIT_CRASH
from autoremat._cli.settings import TUNE_GROUPS, TUNE_SETTINGS, UsageError, check_settings
from autoremat._errors import BudgetError, TuneError
from autoremat._units import has_unit, parse_whole_seconds
from autoremat.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = f"{ROOT / 'tests' / 'tiny_problem.py'}:tiny"
BAD_PROBLEM = "def helper():\n    raise ValueError('a bug in my problem')\n\n\n" \
              "def problem():\n    return helper()\n"


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_version_is_the_installed_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"autoremat {version('autoremat')}"


def test_exit_codes_are_distinct_and_one_table_in_help_and_docs(
        capsys: pytest.CaptureFixture[str]) -> None:
    codes = [code for code, _ in EXIT_CODES]
    assert len(set(codes)) == len(codes) and {0, 1, 2, 3, 4, 130} <= set(codes)
    epilog = _help(capsys).split("exit codes:", 1)[1]
    assert [int(c) for c in re.findall(r"^\s+(\d+)  ", epilog, re.M)] == codes
    # docs/tuning.md's table: the same codes, in the same order
    page = (ROOT / "docs" / "tuning.md").read_text()
    rows = re.findall(r"^\| (\d+) \|", page, re.M)
    assert [int(r) for r in rows] == codes, rows


def test_a_crash_prints_its_traceback_and_is_not_exit_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(args: object) -> int:
        raise RuntimeError("an unexpected state")

    monkeypatch.setattr(cli, "_pareto", broken)
    assert main(["pareto"]) == EXIT_CRASH != 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith(
        "autoremat: crashed: RuntimeError: an unexpected state; an unexpected error")


def test_an_error_in_the_users_problem_names_its_line_and_debug_prints_its_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(BAD_PROBLEM)
    argv = ["tune", "--problem", "mine.py:problem", "--budget", "1GB"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("autoremat: error: --problem: calling mine.py:problem() failed: "
                          "ValueError: a bug in my problem (raised at ")
    assert "mine.py:2 in helper; --debug prints its traceback)" in err
    for debug in (["--debug", *argv], [*argv, "--debug"]):  # before or after the command
        assert main(debug) == 2
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and "in helper\n" in err
        assert "raise ValueError('a bug in my problem')" in err
        assert err.strip().splitlines()[-1].endswith("mine.py:2 in helper)")
    assert not (tmp_path / "runs").exists()


def test_a_budget_without_a_unit_is_warned_and_one_under_the_arguments_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert not has_unit("16") and not has_unit(16) and has_unit("16GB") and has_unit("16 B")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOREMAT_STORAGE", raising=False)
    assert main(["tune", "--problem", TINY, "--budget", "16", "--no-progress"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == ("autoremat: warning: --budget 16 has no unit: read as 16 bytes; write "
                      "16GB or 16GiB (or 16B for bytes)")
    assert err[-1].startswith("autoremat: --budget: nothing fits in 16 B (16 bytes): the "
                              "step's arguments alone take 576 B per device (")
    assert not (tmp_path / "runs").exists()  # no study opened, nothing compiled


def test_tune_takes_the_budget_as_the_command_line_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoremat import tune
    from tests.tiny_problem import tiny

    monkeypatch.chdir(tmp_path)
    with pytest.raises(BudgetError, match=r"^budget: cannot read '4XB'; accepted"):
        tune(tiny(), "4XB")
    with pytest.raises(BudgetError, match=r"^budget: nothing fits in 10 B .* arguments alone"):
        tune(tiny(), "10B")
    assert not (tmp_path / "runs").exists()
    result = tune(tiny(), "1MB", n_trials=1, time_budget="0.02s", heartbeat="1m",
                  study_name="s")
    assert result.measured == 1 and result.best is not None


def test_one_duration_syntax_for_every_duration(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("time_limit", "time_budget"):
        for good in ("90", "90s", "5m", "1h", "1.5h", 30, 0.05):
            check_settings({name: good})
    for good, seconds in (("60", 60), ("90s", 90), ("5m", 300), ("1h", 3600), (60, 60)):
        check_settings({"heartbeat": good})
        assert parse_whole_seconds(good) == seconds
    for bad in ("1.5", "0.5s", 1.5, "0", "1x", True):
        with pytest.raises(UsageError, match=r"^--heartbeat: expected whole seconds >= 1"):
            check_settings({"heartbeat": bad})
        with pytest.raises(TuneError, match=r"^heartbeat: expected whole seconds"):
            parse_whole_seconds(bad)  # type: ignore[arg-type]
    assert main(["tune", "--budget", "4GB", "--time-budget", "5 seconds"]) == 2
    assert "--time-budget: expected a duration > 0 such as 90, 90s, 5m or 1.5h" in (
        capsys.readouterr().err)


def test_tune_help_is_in_groups_and_states_where_studies_go(
        capsys: pytest.CaptureFixture[str]) -> None:
    names = [n for _, group in TUNE_GROUPS for n in group]
    assert sorted(names) == sorted(s.name for s in TUNE_SETTINGS)  # each in exactly one
    text = _help(capsys, "tune")
    titles = [title for title, _ in TUNE_GROUPS]
    at = [text.index(f"\n{title}:\n") for title in titles]
    assert at == sorted(at)
    by_flag = {s.name: s.flag for s in TUNE_SETTINGS}
    for (title, group), start, end in zip(TUNE_GROUPS, at, [*at[1:], len(text)], strict=True):
        for name in group:
            assert by_flag[name] in text[start:end], (title, name)
    assert "--no-progress" in text[at[-1]:]
    assert "sqlite:///runs/autoremat.db, a runs/ folder made in the current folder" in (
        " ".join(text.split()))
    for command in ("pareto", "export"):
        assert "a runs/ folder made in the current folder" in " ".join(
            _help(capsys, command).split())
