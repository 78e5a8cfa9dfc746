"""studies/compare.py runs end to end at a tiny size and its rows agree with plain."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "studies" / "compare.py"


def _load_compare():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("_studies_compare", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_compare_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jax

    monkeypatch.chdir(tmp_path)  # tune() writes runs/last_study.json in the working folder
    # The tuner's first trials (plain, per-cell, sqrt(T)) compile the same HLO as rows measured
    # before them; a persistent cache makes those repeats cheap (compile times are not checked here).
    settings = {"jax_compilation_cache_dir": str(tmp_path / "xla_cache"),
                "jax_persistent_cache_min_compile_time_secs": 0.0}
    saved = {name: getattr(jax.config, name) for name in settings}
    try:
        for name, value in settings.items():
            jax.config.update(name, value)
        compare = _load_compare()
        out = tmp_path / "results"
        rows = compare.main([
            "--seq-lens", "64", "--batch", "2", "--hidden", "8", "--trials", "3", "--repeats", "1",
            "--seq2seq", "last", "--max-depth", "2", "--out", str(out),
        ])
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
    methods = {r.method for r in rows}
    expected = {"plain", "per-cell remat", "flax nn.scan(nn.remat)", "hand sqrt(T) nested",
                "autoremat min-memory", "autoremat tuned <=25%"}
    assert expected <= methods
    measured = [r for r in rows if r.step_seconds is not None]
    assert len(measured) >= 5
    for r in measured:
        assert not r.error, (r.method, r.error)
        assert r.loss_matches, (r.method, r.loss)
        assert r.total_bytes and r.total_bytes > 0
    plain = next(r for r in rows if r.method == "plain")
    assert plain.ratio == 1.0
    minimum = next(r for r in rows if r.method == "autoremat min-memory")
    assert minimum.total_bytes is not None and plain.total_bytes is not None
    assert minimum.total_bytes < plain.total_bytes
    text = (out / "compare.md").read_text()
    assert "| plain |" in text and "autoremat min-memory" in text
    assert (out / "memory_vs_T.png").is_file()
