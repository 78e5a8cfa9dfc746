"""studies/compare.py runs end to end at a tiny size and its rows agree with plain."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import autoremat

SCRIPT = Path(__file__).resolve().parents[1] / "studies" / "compare.py"
HAS_EQUINOX = importlib.util.find_spec("equinox") is not None


def _load(name: str = "compare"):  # type: ignore[no-untyped-def]
    """``studies/<name>.py`` imported as run (a script: its folder first on ``sys.path``)."""
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    return importlib.import_module(name)


@pytest.mark.slow  # the benchmark's plumbing end to end (17 s)
def test_compare_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    import jax

    monkeypatch.chdir(tmp_path)  # anything relative the run writes lands in tmp_path
    # The tuner's first trials (plain, per-cell, sqrt(T)) compile the same HLO as rows measured
    # before them; a persistent cache makes those repeats cheap (compile times are not checked here).
    settings = {"jax_compilation_cache_dir": str(tmp_path / "xla_cache"),
                "jax_persistent_cache_min_compile_time_secs": 0.0}
    saved = {name: getattr(jax.config, name) for name in settings}
    try:
        for name, value in settings.items():
            jax.config.update(name, value)
        compare = _load("compare")
        out = tmp_path / "results"
        # T=512, H=32: 25% of plain's total is reachable in 3 trials (at T=64 the arguments alone exceed it)
        rows = compare.main([
            "--seq-lens", "512", "--batch", "2", "--hidden", "32", "--trials", "3", "--repeats", "1",
            "--seq2seq", "last", "--max-depth", "2", "--out", str(out),
        ])
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
    printed = capsys.readouterr().out
    methods = [r.method for r in rows]
    expected = ["plain", "per-cell remat", "flax nn.scan(nn.remat)", "hand sqrt(T) nested",
                "autoremat min-memory", "autoremat tuned <=25%"]
    if HAS_EQUINOX:
        expected.insert(3, "equinox checkpointed")
    else:
        assert "equinox: not installed" in printed
    assert methods == expected
    for r in rows:
        assert not r.error, (r.method, r.error)
        assert r.step_seconds is not None and r.step_seconds > 0, r.method
        assert r.loss_matches, (r.method, r.loss)
        assert r.grads_match, (r.method, r.grad_error)
        assert r.total_bytes and r.total_bytes > 0 and r.temp_bytes is not None
        assert r.ratio is not None and r.ratio > 0
    by = {r.method: r for r in rows}
    plain = by["plain"]
    assert plain.ratio == 1.0 and plain.grad_error == 0.0
    assert by["autoremat min-memory"].total_bytes < plain.total_bytes
    assert by["autoremat tuned <=25%"].total_bytes <= plain.total_bytes // 4

    text = (out / "compare.md").read_text()
    assert "| plain |" in text and "autoremat min-memory" in text
    assert "## Memory vs T: log-log slopes" in text and "## Wall time" in text
    assert "Measured on: cpu" in text and "--seq-lens 512" in text
    # per-competitor ratios: one line per competitor, min-memory and tuned columns
    assert "min-memory: memory total / temp" in text and "tuned <=25%: step time" in text
    for comp in expected[:-2]:
        assert f"| 512 | last | {comp} |" in text
    assert (out / "memory_vs_T.png").is_file()
    data = json.loads((out / "compare.json").read_text())
    assert len(data["rows"]) == len(rows)
    ratios = data["ratios"]
    assert len(ratios) == (len(expected) - 2) * 2
    mine = next(r for r in ratios if r["competitor"] == "plain" and r["ours"] == "autoremat min-memory")
    assert mine["total_ratio"] == pytest.approx(by["autoremat min-memory"].total_bytes / plain.total_bytes)
    assert mine["time_ratio"] == pytest.approx(by["autoremat min-memory"].ratio)

    # re-rendering from the saved rows gives the same report; the docs page's generated section is
    # replaced in place (the hand-written text around it kept), or the page is written when missing
    report = _load("compare_report")
    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    page.write_text(f"# x\n\nintro\n\n{report.PAGE_BEGIN}\nold\n{report.PAGE_END}\n\nafter\n")
    again = tmp_path / "again"
    compare.main(["--render", str(out / "compare.json"), "--out", str(again), "--readme", str(page)])
    assert (again / "compare.md").read_text() == text
    section = page.read_text()
    assert section.startswith("# x\n\nintro\n\n") and section.endswith("after\n")
    assert "old" not in section and "| plain |" in section
    assert "python studies/compare.py --seq-lens 512" in section and "Measured on: cpu" in section
    page.unlink()
    compare.main(["--render", str(out / "compare.json"), "--out", str(again), "--readme"])  # the default
    written = (tmp_path / report.PAGE).read_text()  # relative to the working directory, tmp_path here
    assert written.startswith("# Benchmarks") and "Measured on: cpu" in written and "| plain |" in written


def test_slopes_and_ratios_from_rows() -> None:
    report = _load("compare_report")
    rows = []
    for t in (1_000, 10_000, 100_000):
        rows.append(report.Row(t, False, "plain", total_bytes=2 * t + 10 * t, temp_bytes=10 * t,
                               step_seconds=1e-3 * t))
        rows.append(report.Row(t, False, "autoremat min-memory", total_bytes=2 * t + int(50 * t**0.5),
                               temp_bytes=int(50 * t**0.5), step_seconds=1.2e-3 * t))
        rows.append(report.Row(t, True, "plain", temp_bytes=t * 2 * 3 * 4 + 7 * t))
        rows.append(report.Row(t, True, "autoremat min-memory", temp_bytes=t * 2 * 3 * 4 + int(9 * t**0.5)))
    fitted = {(s.method, s.seq2seq, s.measure): s for s in report.slopes(rows)}
    assert fitted[("plain", False, "temp")].slope == pytest.approx(1.0)
    assert fitted[("plain", False, "total")].slope == pytest.approx(1.0)
    assert fitted[("autoremat min-memory", False, "temp")].slope == pytest.approx(0.5, abs=1e-3)
    assert fitted[("autoremat min-memory", False, "temp")].seq_lens == (1_000, 10_000, 100_000)
    assert fitted[("autoremat min-memory", True, "temp")].slope == pytest.approx(1.0, abs=0.02)
    assert fitted[("plain", True, "total")].slope is None  # no totals given
    table = report.slope_table(list(fitted.values()))
    assert "| autoremat min-memory | last | 1,000, 10,000, 100,000 |" in table

    ratios = report.competitor_ratios([r for r in rows if not r.seq2seq])
    at_1e4 = next(r for r in ratios if r["seq_len"] == 10_000)
    assert (at_1e4["competitor"], at_1e4["ours"]) == ("plain", "autoremat min-memory")
    assert at_1e4["temp_ratio"] == pytest.approx(5_000 / 100_000)
    assert at_1e4["time_ratio"] == pytest.approx(1.2)
    assert "| 10,000 | last | plain | 0.21x / 0.050x | 1.20x |" in report.ratio_table(ratios)


@pytest.mark.slow
def test_isolated_row_matches_in_process_and_records_peak() -> None:
    """The GPU path (a fresh process per row, device peak) works on CPU: peak is n/a, figures agree."""
    import jax


    compare = _load("compare")

    group = compare.Group(seq_len=16, seq2seq=True, batch=2, hidden=8)
    spec = compare.schedule_spec("plain", autoremat.plain(16))
    here = compare.run_spec(group, spec, repeats=1, gpu=True)
    there = compare.run_isolated(group, spec, repeats=1, gpu=True, timeout=300)
    assert not there.row.error, there.row.error
    assert there.row.loss == here.row.loss
    assert (there.row.total_bytes, there.row.temp_bytes) == (here.row.total_bytes, here.row.temp_bytes)
    assert _load("compare_report").grad_error(there.grads, here.grads) == 0.0
    if jax.default_backend() == "cpu":
        assert there.row.peak_bytes is None  # memory_stats() is None there: shown as n/a
        report = _load("compare_report")
        rows = report.check_against_plain([here])
        assert "| n/a |" in report.table(rows, gpu=True)
    else:
        assert there.row.peak_bytes is not None and there.row.peak_bytes > 0


def test_merge_keeps_other_groups_and_replaces_remeasured_ones() -> None:
    from dataclasses import asdict

    report = _load("compare_report")
    old_rows = [report.Row(t, False, m, total_bytes=1) for t in (1_000, 100_000) for m in ("plain", "x")]
    previous = {"commands": ["python studies/report.py --with-1e5"], "rows": [asdict(r) for r in old_rows],
                "walls": [{"seq_len": 1_000, "seq2seq": False, "seconds": 5.0},
                          {"seq_len": 100_000, "seq2seq": False, "seconds": 900.0}]}
    new_rows = [report.Row(1_000, False, m, total_bytes=2) for m in ("plain", "x")]
    rows, walls, commands = report.merged(previous, new_rows, [(1_000, False, 6.0)], "python new")
    assert [(r.seq_len, r.method, r.total_bytes) for r in rows] == [
        (1_000, "plain", 2), (1_000, "x", 2), (100_000, "plain", 1), (100_000, "x", 1)]
    assert walls == [(1_000, False, 6.0), (100_000, False, 900.0)]
    assert commands == ["python studies/report.py --with-1e5", "python new"]
    assert "Commands (" in "\n".join(report._commands_md(commands))


@pytest.mark.slow
def test_fused_readout_rows_match_plain_and_are_checked(tmp_path: Path) -> None:
    """``--fused-readout``: the fused rows follow the unfused ones, agree with the unfused plain
    scan (loss and gradients) and stack nothing, so their temp is far below plain's."""
    compare = _load("compare")
    report = _load("compare_report")
    fused = [report.FUSED_PLAIN, f"{report.FUSED} sqrt(T) nested", report.FUSED_MIN_MEMORY,
             report.FUSED_TUNED]
    rows = compare.main([
        "--seq-lens", "256", "--batch", "2", "--hidden", "16", "--trials", "1", "--repeats", "1",
        "--seq2seq", "all", "--max-depth", "2", "--fused-readout", "--out", str(tmp_path),
        "--only", ",".join(["autoremat min-memory", *fused]),
    ])
    assert [r.method for r in rows] == ["plain", "autoremat min-memory", *fused]
    by = {r.method: r for r in rows}
    tuned = by[report.FUSED_TUNED]
    for r in rows:
        assert not r.error, (r.method, r.error)
        if r is not tuned or tuned.detail != "nothing fits the budget":
            assert r.loss_matches and r.grads_match, (r.method, r.loss, r.grad_error)
    assert by[report.FUSED_MIN_MEMORY].temp_bytes < by["autoremat min-memory"].temp_bytes
    # 1% of plain's temp: out of reach at this tiny T (a schedule's own carries), in reach at 10^4
    assert tuned.detail == "nothing fits the budget" or \
        tuned.temp_bytes <= by["plain"].temp_bytes // 100
    text = (tmp_path / "compare.md").read_text()
    assert "## The readout inside the step" in text and "| 256 | autoremat fused" in text


def test_fused_check_picks_the_fastest_row_under_one_percent() -> None:
    report = _load("compare_report")
    mb = 10**6
    rows = [report.Row(10_000, True, "plain", temp_bytes=685 * mb, step_seconds=2.0),
            report.Row(10_000, True, report.FUSED_MIN_MEMORY, "binomial", temp_bytes=1 * mb,
                       step_seconds=3.0, loss_matches=True, grads_match=True),
            report.Row(10_000, True, report.FUSED_TUNED, "100x100", temp_bytes=5 * mb,
                       step_seconds=1.9, loss_matches=True, grads_match=True),
            report.Row(10_000, True, report.FUSED_PLAIN, "plain", temp_bytes=600 * mb,
                       step_seconds=1.0)]
    text = "\n".join(report.fused_check(rows))
    assert "| 10,000 | autoremat fused tuned <=1% temp | 100x100 | 5.00 MB | 685.00 MB | 0.73% | " \
        "0.95x | yes | yes |" in text
    assert report.fused_check(rows[:1]) == []


def test_gpu_rows_carry_runtime_peak_and_compile_scratch() -> None:
    """With ``gpu`` a row carries the step's runtime peak, compile scratch and process peak beside
    the estimate (a stand-in Measurement: no GPU here); on CPU none of them, and no columns."""
    from dataclasses import asdict

    from autoremat import Measurement

    compare = _load("compare")
    report = _load("compare_report")
    mb = 10**6
    m = Measurement("k", "ok", total_bytes=700 * mb, temp_bytes=600 * mb, peak_bytes=900 * mb,
                    runtime_peak_bytes=720 * mb, compile_scratch_bytes=150 * mb,
                    step_seconds=0.5, compile_seconds=2.0, loss=1.0)

    def row() -> Any:
        return report.Row(1_000, False, "plain", "plain")

    on_gpu = compare._fill(row(), m, gpu=True)
    assert (on_gpu.runtime_peak_bytes, on_gpu.compile_scratch_bytes, on_gpu.peak_bytes) == (
        720 * mb, 150 * mb, 900 * mb)
    on_cpu = compare._fill(row(), m, gpu=False)
    assert (on_cpu.runtime_peak_bytes, on_cpu.compile_scratch_bytes, on_cpu.peak_bytes) == (
        None, None, None)
    assert on_cpu.total_bytes == on_gpu.total_bytes == 700 * mb

    shown = report.table([on_gpu], gpu=True).splitlines()
    assert shown[0].startswith("| T | loss on | method | schedule | total | runtime peak | "
                               "compile scratch | process peak | temp |")
    assert "| 700.00 MB | 720.00 MB | 150.00 MB | 900.00 MB | 600.00 MB |" in shown[2]
    # a device that could not isolate the runtime figures: n/a, the process peak still shown
    partial = compare._fill(row(), Measurement("k", "ok", total_bytes=1, peak_bytes=5 * mb), gpu=True)
    assert "| n/a | n/a | 5.00 MB |" in report.table([partial], gpu=True)
    # CPU: the table has none of the device columns
    plain = report.table([on_cpu])
    assert not any(c in plain for c in (*report.GPU_COLUMNS, "n/a"))
    assert plain.splitlines()[0] == ("| T | loss on | method | schedule | total | temp | step | "
                                     "vs plain | compile | loss ok | grads ok |")
    # the figures survive compare.json (asdict / Row(**)); a saved row from before them still loads
    assert report.Row(**asdict(on_gpu)) == on_gpu
    old = {k: v for k, v in asdict(on_gpu).items()
           if k not in ("runtime_peak_bytes", "compile_scratch_bytes")}
    assert report.Row(**old).runtime_peak_bytes is None
