"""Hostile input: malformed schedule files, study files and command lines.

Every case must end in a ``ScheduleError`` (in-process) or a usage error
(exit 2) with one line, quickly and in little memory: no traceback, no hang,
no blow-up. The generated cases (hypothesis, derandomized so CI runs the same
ones) go through the parser and ``autoremat.cli.main`` in-process; a sampled
set runs the real command in a subprocess under a time and address-space limit.
"""

from __future__ import annotations

import ast
import contextlib
import io
import math
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoremat._errors import BudgetError, ScheduleError, TuneError
from autoremat._schedules import parse_schedule, read_schedule, top_keys
from autoremat._schedules.nested import LEVEL_KEYS as _LEVEL_KEYS
from autoremat._schedules.nested import MAX_LEVELS
from autoremat._schedules.policy import ALL_POLICY_NAMES, FACTORY_POLICIES, MAX_LENGTH, ZERO_ARG_POLICIES
from autoremat._schedules.safe_yaml import _MAX_FILE_BYTES, _SafeLoaderNoAliases, load_yaml_text
from autoremat._units import parse_bytes, parse_duration
from autoremat.cli import STUDY_FILE_KEYS, main

ROOT = Path(__file__).resolve().parents[1]
TINY = f"{ROOT / 'tests' / 'tiny_problem.py'}:tiny"
VALID: dict[str, Any] = {
    "version": 1, "kind": "nested", "unroll": 1,
    "levels": [{"length": 4, "policy": "nothing_saveable"}, {"length": 8, "policy": "dots_saveable"}],
}
FUZZ = settings(max_examples=260, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- generators ---------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**31)
           | st.floats() | st.text(max_size=12))
junk = st.recursive(scalars, lambda c: st.lists(c, max_size=3)
                    | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=8)


def _refuses(parse: Any, error: type[Exception]) -> Any:
    """``v -> True`` when ``parse(v)`` raises ``error``."""
    def refused(v: Any) -> bool:
        try:
            parse(v)
        except error:
            return True
        return False
    return refused


_not_utf8 = _refuses(bytes.decode, UnicodeDecodeError)


def _not_one(v: Any) -> bool:
    return not (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1)


bad_length = (st.integers(max_value=0) | st.integers(min_value=MAX_LENGTH + 1)
              | st.floats() | st.text(max_size=8) | st.booleans() | st.none() | st.lists(junk, max_size=2))
bad_unroll = bad_length
bad_policy = (
    st.text(max_size=30).filter(lambda s: s not in ALL_POLICY_NAMES)
    | st.sampled_from(FACTORY_POLICIES)  # a factory without its arguments
    | st.sampled_from(ZERO_ARG_POLICIES).map(lambda p: {p: ["gates"]})  # not a factory
    | st.dictionaries(st.text(max_size=6), junk, max_size=3)
    .filter(lambda d: not (len(d) == 1 and next(iter(d)) in FACTORY_POLICIES))
    | st.sampled_from(FACTORY_POLICIES).flatmap(
        lambda f: (st.integers() | st.lists(st.integers(), min_size=1) | st.booleans()).map(
            lambda v: {f: v}))
    | st.integers() | st.booleans() | st.lists(junk, max_size=3)
)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """The valid schedule with one thing broken."""
    doc: dict[str, Any] = {k: (list(v) if k == "levels" else v) for k, v in VALID.items()}
    doc["levels"] = [dict(lv) for lv in VALID["levels"]]
    what = draw(st.sampled_from([
        "version", "kind", "levels", "level", "length", "policy", "unroll", "meta", "top_key",
        "level_key", "missing", "missing_length", "too_many_levels", "snapshots",
        "binomial_levels",
    ]))
    if what == "version":
        doc["version"] = draw(junk.filter(_not_one))
    elif what == "kind":
        doc["kind"] = draw(junk.filter(lambda v: v != "nested"))
    elif what == "levels":
        doc["levels"] = draw(junk)
    elif what == "level":
        doc["levels"][draw(st.integers(0, 1))] = draw(junk)
    elif what == "length":
        doc["levels"][draw(st.integers(0, 1))]["length"] = draw(bad_length)
    elif what == "policy":
        doc["levels"][draw(st.integers(0, 1))]["policy"] = draw(bad_policy)
    elif what == "unroll":
        doc["unroll"] = draw(bad_unroll)
    elif what == "meta":
        doc["meta"] = draw(junk.filter(lambda v: v is not None and not isinstance(v, dict)))
    elif what == "top_key":
        doc[draw(st.text(max_size=10).filter(lambda k: k not in top_keys()))] = draw(junk)
    elif what == "level_key":
        key = draw(st.text(max_size=10).filter(lambda k: k not in _LEVEL_KEYS))
        doc["levels"][0][key] = draw(junk)
    elif what == "missing":
        del doc[draw(st.sampled_from(["version", "levels"]))]
    elif what == "missing_length":
        del doc["levels"][draw(st.integers(0, 1))]["length"]
    elif what == "too_many_levels":
        doc["levels"] = [{"length": 2}] * draw(st.integers(MAX_LEVELS + 1, 3 * MAX_LEVELS))
    elif what == "snapshots":  # binomial: bad snapshot counts, or snapshots on a nested one
        doc = {"version": 1, "kind": "binomial", "snapshots": draw(bad_length)}
        if draw(st.booleans()):
            doc = {**VALID, "snapshots": draw(st.integers(1, 64))}
    else:  # a binomial schedule with levels
        doc = {**VALID, "kind": "binomial", "snapshots": draw(st.integers(1, 64))}
    return doc


def _bomb(depth: int, width: int) -> bytes:
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, depth):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return ("version: 1\n" + "\n".join(lines) + f"\nlevels: *a{depth - 1}\n").encode()


bad_tags = st.sampled_from([
    "!!int abc", "!!int ''", "!!int 0x", "!!int 0b2", "!!int 1:2:x", "!!float abc",
    "!!float ''", "!!bool maybe", "!!timestamp xyz", "2020-02-30", "2021-13-01",
    "!!binary '!!!'", "!!set [1]", "!!omap 1", "!!python/object/apply:os.system ['true']",
    "!!python/name:os.system", "!<tag:yaml.org,2002:python/tuple> [1]", "!custom 1",
    "!!null 5", "!!str", "*undefined", "&anchor",
])

documents = st.one_of(
    mutated().map(lambda d: yaml.safe_dump(d).encode()),
    mutated().map(lambda d: yaml.safe_dump(d, default_flow_style=True).encode()),
    # non-mapping documents, several documents
    junk.filter(lambda v: not isinstance(v, dict)).map(lambda v: yaml.safe_dump(v).encode()),
    st.lists(mutated(), min_size=2, max_size=3).map(
        lambda ds: yaml.safe_dump_all(ds).encode()),
    # a value no constructor can read, in any field
    st.tuples(st.sampled_from(["version", "unroll", "kind", "meta"]), bad_tags).map(
        lambda kt: f"version: 1\nlevels: [{{length: 4}}]\n{kt[0]}: {kt[1]}\n".encode()),
    bad_tags.map(lambda t: f"version: 1\nlevels: [{{length: {t}}}]\n".encode()),
    # not UTF-8 (anywhere in the file)
    st.tuples(st.binary(max_size=40), st.binary(min_size=1, max_size=8)).map(
        lambda p: b"version: 1\n" + p[0] + b"\xff\xfe" + p[1]),
    st.binary(min_size=1, max_size=200).filter(_not_utf8),
    # huge numbers, huge files
    st.integers(11, 6000).map(lambda n: f"version: 1\nlevels: [{{length: {'9' * n}}}]\n".encode()),
    st.integers(1, 64).map(lambda n: b"#" * (_MAX_FILE_BYTES + n)),
    # deep nesting, as flow collections and as block sequences
    st.integers(1, 20_000).map(lambda n: b"version: 1\nlevels: " + b"[" * n + b"]" * n),
    st.integers(1, 10_000).map(lambda n: b"version: 1\nmeta: " + b"{a: " * n + b"1" + b"}" * n),
    st.integers(1, 400).map(lambda n: b"version: 1\nlevels:\n" + b"".join(
        b" " * i + b"- \n" for i in range(n))),
    # big but under the size limit: many keys, long strings (bounded time)
    st.integers(1, 6_000).map(lambda n: b"version: 1\nlevels: [{length: 2}]\nmeta: [" + b"1," * n
                             + b"]\nunroll: 0\n"),
    # anchors and aliases, up to a billion laughs
    st.tuples(st.integers(1, 12), st.integers(1, 12)).map(lambda dw: _bomb(*dw)),
    # random text and bytes
    st.text(max_size=200).map(str.encode),
    st.binary(max_size=200),
)


_not_schedule = _refuses(parse_schedule, ScheduleError)


def _is_valid(raw: bytes) -> bool:
    """The rare random text or bytes that happen to be a schedule are not hostile."""
    return not _not_schedule(raw)


# -- schedule files -----------------------------------------------------------------

def test_hostile_schedule_files_are_one_line_schedule_errors(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = tmp_path_factory.mktemp("hostile")
    seen: list[int] = []

    @FUZZ
    @given(raw=documents, from_file=st.booleans())
    def check(raw: bytes, from_file: bool) -> None:
        if len(raw) < 200 and _is_valid(raw):
            return
        seen.append(len(raw))
        path = folder / f"case{len(seen) % 7}.yaml"
        if from_file:
            path.write_bytes(raw)
        # Memory is traced on every 4th case and on every big one (tracing is slow).
        trace = len(seen) % 4 == 0 or len(raw) > 10_000
        if trace:
            tracemalloc.start()
        start = time.process_time()  # this process's CPU: other jobs' load does not count
        try:
            with pytest.raises(ScheduleError) as info:
                if from_file:
                    read_schedule(path)
                else:
                    parse_schedule(raw, str(path))
        finally:
            elapsed = time.process_time() - start
            peak = tracemalloc.get_traced_memory()[1] if trace else 0
            if trace:
                tracemalloc.stop()
        message = str(info.value)
        assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 1000
        assert "Traceback" not in message
        assert elapsed < 5, f"{elapsed:.1f} CPU s for {raw[:80]!r}"
        assert peak < 200 * 2**20, f"{peak / 2**20:.0f} MiB for {raw[:80]!r}"

    check()
    assert len(seen) >= 200, len(seen)


def test_yaml_is_only_read_with_the_safe_loader() -> None:
    """No yaml.load/full_load/unsafe_load with another loader anywhere in the package."""
    for path in sorted((ROOT / "autoremat").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "yaml"):
                continue
            name = node.func.attr
            assert name not in ("full_load", "full_load_all", "unsafe_load", "unsafe_load_all",
                                "load_all"), f"{path.name}: yaml.{name}"
            if name == "load":
                loader = next((k.value for k in node.keywords if k.arg == "Loader"), None)
                assert isinstance(loader, ast.Name) and loader.id == "_SafeLoaderNoAliases", (
                    f"{path.name}:{node.lineno}: yaml.load without the safe loader")
    assert issubclass(_SafeLoaderNoAliases, yaml.SafeLoader)


# -- command lines ------------------------------------------------------------------

_not_int = _refuses(int, ValueError)
_bad_budget = _refuses(parse_bytes, BudgetError)


ints_below = lambda low: st.integers(max_value=low - 1).map(str)  # noqa: E731
option_text = st.text(max_size=30).filter(lambda s: "\x00" not in s)
bad_seconds = (st.sampled_from(["nan", "inf", "-inf", "0", "-0.0", "1e999", "x", ""])
               | st.floats(max_value=0).map(repr) | option_text.filter(lambda s: _not_float(s)))


_bad_duration = _refuses(parse_duration, TuneError)


def _not_float(text: str) -> bool:
    try:
        return not math.isfinite(float(text)) or float(text) <= 0
    except ValueError:
        return True


bad_options = st.one_of(
    option_text.filter(_bad_budget).map(lambda v: [f"--budget={v}"]),
    (ints_below(0) | st.integers(min_value=2**31).map(str)
     | option_text.filter(_not_int)).map(lambda v: [f"--trials={v}"]),
    (ints_below(1) | option_text.filter(_not_int)).map(lambda v: [f"--total-trials={v}"]),
    (ints_below(1) | st.sampled_from(["1.5", "0.5", "one"])).map(lambda v: [f"--heartbeat={v}"]),
    (ints_below(0) | st.integers(min_value=2**32).map(str)).map(lambda v: [f"--seed={v}"]),
    (bad_seconds | option_text).filter(_bad_duration).map(lambda v: [f"--time-limit={v}"]),
    bad_seconds.filter(_bad_duration).map(lambda v: [f"--time-budget={v}"]),
    st.text(alphabet="abcxyz-", min_size=1, max_size=10).map(lambda v: [f"--zz{v}"]),
    st.sampled_from(["", " ", "no_colon", ":x", "x:", "no_such_module_q1:thing",
                     "no/such/file.py:problem"]).map(lambda v: [f"--problem={v}"]),
    st.sampled_from(["", "zzz", "zzz://", "sqlite:////proc/nope/x.db", "postgresql://127.0.0.1:1/x"])
    .map(lambda v: [f"--storage={v}"]),
    st.sampled_from(["", "x" * 600, "a\x00b"]).map(lambda v: [f"--study-name={v}"]),
)
# with the built-in problem (no --problem): sizes out of range
bad_sizes = st.tuples(st.sampled_from(["--seq-len", "--batch", "--hidden"]),
                      ints_below(1) | st.integers(min_value=2**31).map(str) | option_text.filter(_not_int))
# study files: every key right except one
STUDY_VALUES: dict[str, Any] = {
    "problem": TINY, "budget": "1MB", "trials": 0, "time_budget": 0.01, "study_name": "fz",
}
bad_study_values = {
    "budget": junk.filter(lambda v: v is not None and (
        not isinstance(v, (str, int)) or isinstance(v, bool) or _bad_budget(v))),
    "problem": junk.filter(lambda v: v is not None and not isinstance(v, str)),
    "seq2seq": junk.filter(lambda v: v is not None and not isinstance(v, bool)),
    "trials": junk.filter(lambda v: v is not None and not (
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31)),
    "total_trials": st.integers(max_value=0) | st.text(max_size=5) | st.floats(),
    "heartbeat": st.integers(max_value=0) | st.floats() | st.lists(st.integers()),
    "seed": st.integers(max_value=-1) | st.integers(min_value=2**32) | st.floats(),
    "time_limit": junk.filter(lambda v: v is not None and _bad_duration(v)),
    "time_budget": st.floats(max_value=0) | st.just(float("nan"))
    | st.text(max_size=5).filter(_bad_duration),
    "storage": junk.filter(lambda v: v is not None and not isinstance(v, str)) | st.just(""),
    "study_name": junk.filter(lambda v: v is not None and not isinstance(v, str)) | st.just(" "),
    "out": junk.filter(lambda v: v is not None and not isinstance(v, str)) | st.just("."),
}


@st.composite
def bad_study_files(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["value", "unknown_key", "document"]))
    if kind == "document":  # not a mapping, not YAML, not UTF-8, aliases, ...
        raw = draw(documents)
        try:
            data = load_yaml_text(raw)
        except ScheduleError:
            return raw
        if data is None or (isinstance(data, dict) and all(
                str(k).replace("-", "_") in STUDY_FILE_KEYS for k in data)):
            return b"- " + raw[:100].replace(b"\n", b" ")  # could be valid settings: a list
        return raw
    settings_ = dict(STUDY_VALUES)
    if kind == "value":
        key = draw(st.sampled_from(sorted(bad_study_values)))
        settings_[key] = draw(bad_study_values[key])
    else:
        settings_[draw(st.text(max_size=12).filter(
            lambda k: k.replace("-", "_") not in STUDY_FILE_KEYS))] = draw(junk)
    return yaml.safe_dump(settings_).encode()


def _run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own exits would land here
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _hang_guard(argv: list[str], seconds: int = 60) -> Any:
    """Fail (naming ``argv``) instead of hanging: a hang guard, not a speed check --
    a usage error takes milliseconds, the limit is minutes' worth on any machine."""
    def hung(signum: int, frame: Any) -> None:
        raise AssertionError(f"no answer after {seconds} s: {argv}")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _assert_usage_error(code: int, out: str, err: str, argv: list[str]) -> None:
    assert code == 2, (argv, code, out, err)
    assert err.count("\n") == 1 and err.startswith("autoremat: error: "), (argv, err)
    assert "Traceback" not in err and len(err) < 2000, (argv, err[:300])


def test_hostile_command_lines_are_one_line_usage_errors(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = tmp_path_factory.mktemp("cli")
    monkeypatch.chdir(folder)
    monkeypatch.delenv("AUTOREMAT_STORAGE", raising=False)
    # Cheap and local even if a bad option were wrongly accepted: 0 trials of the tiny problem.
    base = ["tune", "--problem", TINY, "--budget", "1MB", "--trials", "0", "--time-budget",
            "0.01", "--storage", f"sqlite:///{folder / 'fz.db'}", "--study-name", "fz",
            "--out", str(folder / "o.yaml"), "--no-progress"]
    seen = [0]

    @settings(FUZZ, max_examples=120)
    @given(case=st.one_of(
        bad_options.map(lambda opt: base + opt),
        bad_sizes.map(lambda kv: ["tune", "--budget", "1MB", "--trials", "0", f"{kv[0]}={kv[1]}"]),
        bad_study_files().map(lambda raw: ("study", raw)),
        documents.map(lambda raw: ("show", raw)),
        option_text.filter(_not_int).map(lambda v: ["export", v, "--out", "x.yaml"]),
        st.lists(st.sampled_from(["tune", "show", "pareto", "export", "--bogus", "-x"]),
                 min_size=1, max_size=3).filter(lambda a: a[0] not in ("tune", "pareto")),
    ))
    def check(case: Any) -> None:
        if isinstance(case, tuple):
            kind, raw = case
            path = folder / ("study.yaml" if kind == "study" else "schedule.yaml")
            path.write_bytes(raw)
            if kind == "show" and len(raw) < 200 and _is_valid(raw):
                return
            argv = ["tune", str(path)] if kind == "study" else ["show", str(path)]
        else:
            argv = case
        seen[0] += 1
        with _hang_guard(argv):
            code, out, err = _run_main(argv)
        _assert_usage_error(code, out, err, argv)

    check()
    assert seen[0] >= 100
    assert not (folder / "o.yaml").exists()  # nothing was ever tuned


# -- the real command, in a subprocess under limits ---------------------------------

SUBPROCESS_CASES = {
    "alias bomb": ("show", _bomb(9, 9)),
    "not UTF-8": ("show", b"version: 1\nlevels: [{length: \xff}]\n"),
    "deep nesting": ("show", b"version: 1\nlevels: " + b"[" * 200_000 + b"]" * 200_000),
    "huge length": ("show", b"version: 1\nlevels: [{length: 99999999999999999999}]\n"),
    "negative length": ("show", b"version: 1\nlevels: [{length: -3}]\n"),
    "not a mapping": ("show", b"- version: 1\n- levels: []\n"),
    "python tag": ("show", b"version: !!python/object/apply:os.system ['touch PWNED']\n"),
    "bad date": ("show", b"version: 2020-02-30\n"),
    "over the size limit": ("show", b"#" * (_MAX_FILE_BYTES + 1)),
    "dense flow at the size limit": ("show", b"version: 1\nmeta: [" + b"[1]," * (
        (_MAX_FILE_BYTES - 40) // 4) + b"]\n"),
    "study file bomb": ("tune", _bomb(9, 9).replace(b"version: 1\n", b"budget: 4GB\n")
                        .replace(b"levels:", b"problem:")),
    "study file not UTF-8": ("tune", b"budget: \xc3\x28\n"),
    "bad budget": ("args", ["tune", "--budget=-1"]),
    "bad seq-len": ("args", ["tune", "--budget", "4GB", "--seq-len", "0"]),
    "bad heartbeat": ("args", ["tune", "--budget", "4GB", "--heartbeat", "0"]),
    "bad time limit": ("args", ["tune", "--budget", "4GB", "--time-limit", "nan"]),
}


# The command under a 2 GiB address-space and 60 s CPU limit (set in the child itself:
# no preexec_fn, which would fork this multithreaded, jax-loaded process).
LIMITED = (
    "import resource, runpy, sys\n"
    "resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))\n"
    "resource.setrlimit(resource.RLIMIT_CPU, (60, 60))\n"
    "sys.argv = ['autoremat', *sys.argv[1:]]\n"
    "runpy.run_module('autoremat.cli', run_name='__main__')\n"
)


@pytest.mark.parametrize("case", sorted(SUBPROCESS_CASES))
def test_hostile_input_to_the_real_command(case: str, tmp_path: Path) -> None:
    kind, payload = SUBPROCESS_CASES[case]
    if kind == "args":
        argv = payload
    else:
        path = tmp_path / "input.yaml"
        path.write_bytes(payload)
        argv = [kind, str(path)]
    r = subprocess.run([sys.executable, "-c", LIMITED, *argv], cwd=tmp_path,
                       capture_output=True, timeout=60, check=False)
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2, (r.returncode, err[-2000:])
    assert err.count("\n") == 1 and err.startswith("autoremat: error: "), err[-2000:]
    assert "Traceback" not in err and r.stdout == b""
    assert not (tmp_path / "PWNED").exists()
    assert not (tmp_path / "runs").exists()
