"""The real ``autoremat`` command, in a subprocess (plus fast in-process checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autoremat.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = f"{ROOT / 'tests' / 'tiny_problem.py'}:tiny"

BAD_BUDGETS = [
    "", "abc", "-1", "0", "0B", "4XB", "GB", "4GBs", "4.5.6GB", "1e9", "nan", "inf",
    "4 G B", "4GB!", "0x100", "4,000", "--4GB", "4KB/s", "1/2GB", "4 GiBB", "0.0001",
]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autoremat.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def test_help_lists_the_commands() -> None:
    out = subprocess.run(["autoremat", "--help"], capture_output=True, text=True, check=False)
    assert out.returncode == 0
    for command in ("tune", "pareto", "export", "show"):
        assert command in out.stdout


def test_cli_module_imports_no_jax_for_help() -> None:
    # cli.py itself is lazy: loaded on its own (without the package __init__),
    # --help imports neither jax nor optuna nor matplotlib.
    cli_path = str(ROOT / "autoremat" / "cli.py")
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('cli', {cli_path!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "try:\n    m.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(k for k in ('jax', 'optuna', 'matplotlib') if k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_autoremat_help_does_not_import_jax() -> None:
    code = ("import sys\nfrom autoremat.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\nprint('jax' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_tune_from_study_file_then_pareto_export_show(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The tunes run as the command (a process of their own: its exit code and output);
    pareto, export and show, which read what they wrote, run in this process."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOREMAT_STORAGE", raising=False)

    def here(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    study = tmp_path / "tiny.yaml"
    study.write_text(yaml.safe_dump({
        "problem": TINY, "budget": "2.4KB", "trials": 99, "time_budget": 0.02,
        "study_name": "cli", "out": "best.yaml",
    }))
    r = run("tune", str(study), "--trials", "3", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "budget: 2.4 KB (2400 bytes)" in r.stdout
    assert "best (trial" in r.stdout and "plain (trial 0)" in r.stdout
    assert "study: 'cli'" in r.stdout and (
        "(3 schedules measured in the study, 3 measured now; 2 queued, not measured (first "
        "candidates a later run measures first))") in r.stdout
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["meta"]["study_name"] == "cli" and best["meta"]["total_bytes"] <= 2400

    r = here("pareto", "--json")  # defaults: the last study run here
    assert r.returncode == 0, r.stderr
    front = json.loads(r.stdout)["front"]
    assert front and sum(p["chosen"] for p in front) == 1
    assert all(p["total_bytes"] <= 2400 for p in front)
    chosen = next(p for p in front if p["chosen"])
    assert chosen["number"] == best["meta"]["trial"]

    r = here("export", str(chosen["number"]), "--out", "exported.yaml")
    assert r.returncode == 0, r.stderr
    exported = yaml.safe_load((tmp_path / "exported.yaml").read_text())
    assert exported["levels"] == best["levels"] and exported["unroll"] == best["unroll"]

    r = here("show", "exported.yaml", "--problem", TINY)
    assert r.returncode == 0, r.stderr
    assert "tuned for: tiny(T=32,H=4)" in r.stdout and "matches tiny(T=32,H=4)" in r.stdout

    # above the arguments (576 B), under every total: measured, then nothing fits
    r = run("tune", "--problem", TINY, "--budget", "600B", "--trials", "1", "--time-budget",
            "0.02", "--study-name", "tight", "--no-progress", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("autoremat: nothing fits in 600 B (600 bytes): the smallest total "
                           "measured is ")
    assert "trial " in last and "warning" not in r.stderr

    # the study's front read at a larger budget: the same timed trials, a chosen among them
    r = here("pareto", "--json", "--budget", "1MB", "--study-name", "cli")
    assert r.returncode == 0, r.stderr
    wider = json.loads(r.stdout)
    assert wider["budget_bytes"] == 10**6 and sum(p["chosen"] for p in wider["front"]) == 1
    r = here("pareto", "--budget", "1MB", "--study-name", "cli")
    assert r.returncode == 0 and "read at --budget 1 MB, not the study's 2.4 KB" in r.stdout


def test_bad_budget_in_a_subprocess(tmp_path: Path) -> None:
    r = run("tune", "--budget", "4XB", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1
    assert "--budget: cannot read '4XB'; accepted:" in r.stderr and "4GiB" in r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("budget", BAD_BUDGETS)
def test_every_bad_budget_form_is_a_one_line_usage_error(
    budget: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", f"--budget={budget}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autoremat: error: --budget: ")
    assert "accepted: a byte count" in err


def test_usage_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--trials", "x"]) == 2
    assert main(["frobnicate"]) == 2
    assert main(["export", "3"]) == 2  # --out missing
    bad = tmp_path / "study.yaml"
    bad.write_text("budgett: 4GB\n")
    assert main(["tune", str(bad)]) == 2
    assert main(["tune", "--problem", "no_such_module_xyz:thing"]) == 2
    assert main(["tune", "--problem", TINY, "--seq-len", "5"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 6 and all(line.startswith("autoremat: error: ") for line in lines)
    assert "unknown setting 'budgett'" in lines[3]
    assert "cannot import 'no_such_module_xyz'" in lines[4]
    assert "--seq-len: only resizes the built-in problem" in lines[5]


def test_show_malformed_file_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nlevels: [{length: 0}]\n")
    r = run("show", str(bad), cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1
    assert f"{bad}: levels[0].length: must be >= 1, got 0" in r.stderr


def test_shipped_study_files_are_valid(capsys: pytest.CaptureFixture[str]) -> None:
    from autoremat._cli.settings import read_study_file
    from autoremat._units import parse_bytes
    from autoremat.cli import STUDY_FILE_KEYS

    for name, budget in (("seed_lstm.yaml", 175 * 10**6), ("seed_lstm_100k.yaml", 4 * 10**9)):
        settings = read_study_file(str(ROOT / "studies" / name))
        assert set(settings) <= set(STUDY_FILE_KEYS)
        assert parse_bytes(settings["budget"]) == budget


def test_library_errors_get_their_flag_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOREMAT_STORAGE", raising=False)
    assert main(["pareto", "--storage", "zzz", "--study-name", "s"]) == 2
    assert main(["pareto", "--storage", f"sqlite:///{tmp_path / 'x.db'}", "--study-name",
                 "nope"]) == 2
    assert main(["pareto"]) == 2  # no study given and none tuned here
    assert main(["tune", "--problem", "no_colon"]) == 2
    assert main(["show", str(tmp_path / "missing.yaml"), "--seq-len", "0"]) == 2
    (tmp_path / "s.yaml").write_text("version: 1\nlevels: [{length: 8}]\n")
    assert main(["show", "s.yaml", "--problem", "seed_lstm", "--seq-len", "0"]) == 2
    assert main(["show", "s.yaml", "--problem", TINY, "--hidden", "3"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("autoremat: error: --storage: cannot open zzz")
    assert lines[1].startswith("autoremat: error: --study-name: no study 'nope' in sqlite:///")
    assert lines[2].startswith("autoremat: error: --study-name: none given and no "
                               "runs/last_study.json")
    assert lines[3].startswith("autoremat: error: --problem: 'no_colon' is neither a built-in "
                               "problem (seed_lstm, layer_stack) nor your own as "
                               "'package.module:name'")
    assert "missing.yaml" in lines[4]  # the file is read first; its path is not a flag
    assert lines[5].startswith("autoremat: error: --seq-len: expected a positive integer")
    assert lines[6].startswith("autoremat: error: --hidden: only resizes the built-in")
    assert not (tmp_path / "runs" / "last_study.json").exists()


def test_export_names_the_trial_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    import optuna

    monkeypatch.delenv("AUTOREMAT_STORAGE", raising=False)
    storage = f"sqlite:///{tmp_path / 'e.db'}"
    # quiet: Optuna's handler may hold an earlier test's (closed) captured stderr
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="e", storage=storage)
    capsys.readouterr()  # Optuna's own INFO line about the new study, when run alone
    assert main(["export", "7", "--out", str(tmp_path / "x.yaml"), "--storage", storage,
                 "--study-name", "e"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autoremat: error: TRIAL: no trial 7 in study 'e'"), err


def test_one_settings_table_makes_the_options_and_the_study_file_keys(
    capsys: pytest.CaptureFixture[str]
) -> None:
    from autoremat._cli.settings import PROBLEM_SETTINGS, TUNE_SETTINGS
    from autoremat.cli import STUDY_FILE_KEYS

    assert tuple(s.name for s in TUNE_SETTINGS) == STUDY_FILE_KEYS
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    tune_help = capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["show", "--help"])
    show_help = capsys.readouterr().out
    for s in TUNE_SETTINGS:
        assert s.flag in tune_help, s.flag
    for s in PROBLEM_SETTINGS:
        assert s.flag in show_help, s.flag
    assert "--trials" not in show_help


def test_time_limit_takes_seconds_minutes_hours(capsys: pytest.CaptureFixture[str]) -> None:
    from autoremat._cli.settings import check_settings

    for good in ("90", "90s", "5m", "1.5h", 30, 2.5):
        check_settings({"time_limit": good})
    for bad in ("5 minutes", "0", "-1m", "1e9", "nan", "m"):
        assert main(["tune", "--budget", "4GB", f"--time-limit={bad}"]) == 2
        err = capsys.readouterr().err
        assert "--time-limit: expected a duration > 0 such as 90, 90s, 5m or 1.5h" in err, err


def test_redirected_tune_prints_one_plain_line_per_trial_and_names_the_objectives(
        tmp_path: Path) -> None:
    """A log (stderr not a terminal) gets no carriage-return bar frames; Optuna's own
    tools read the objectives' names from the study."""
    r = run("tune", "--problem", TINY, "--budget", "2.4KB", "--trials", "2",
            "--time-budget", "0.02", "--study-name", "log", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("tune: trial ")]
    assert len(lines) == 2 and "\r" not in r.stderr, r.stderr
    assert all("total " in line and "step " in line for line in lines)
    import optuna

    study = optuna.load_study(study_name="log", storage=f"sqlite:///{tmp_path}/runs/autoremat.db")
    assert study.metric_names == ["total_bytes", "step_seconds"]
