"""The schedule format: round trips, and every invalid input's message."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import yaml

import autoremat
from autoremat import Level, Policy, Schedule, ScheduleError
from autoremat._schedules import KINDS, dump_schedule, parse_schedule
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.policy import ALL_POLICY_NAMES

SEED_YAML = """\
version: 1
kind: nested
levels:
  - {length: 100, policy: nothing_saveable}
  - {length: 100, policy: dots_saveable}
unroll: 1
"""


def test_parse_the_documented_form() -> None:
    schedule = parse_schedule(SEED_YAML)
    assert schedule == autoremat.nested([100, 100], ["nothing_saveable", "dots_saveable"])
    assert schedule.describe() == "100x100 nothing/dots unroll=1"
    assert schedule.tuned_length == 10_000


@pytest.mark.parametrize(
    "schedule",
    [
        autoremat.plain(1000),
        autoremat.nested([1000], "nothing_saveable", unroll=4),
        autoremat.nested([40, 50, 50], ["nothing_saveable", "nothing_saveable", "dots_saveable"]),
        autoremat.nested([10, 10], ["nothing_saveable", {"save_only_these_names": ["gates"]}]),
        autoremat.nested(
            [5, 6],
            [
                {"save_and_offload_only_these_names": {
                    "names_which_can_be_saved": [], "names_which_can_be_offloaded": ["h"],
                    "offload_src": "device", "offload_dst": "pinned_host"}},
                "dots_with_no_batch_dims_saveable",
            ],
        ),
        autoremat.nested([7, 7], meta={"problem": "p", "total_bytes": 123, "nested": {"a": [1, 2]}}),
        autoremat.binomial(32),
        autoremat.binomial(1, unroll=4, meta={"seq_len": 100}),
        *(s for kind in KINDS.values() for s in kind.examples()),
    ],
    ids=str,
)
def test_yaml_round_trip(tmp_path: Path, schedule: Schedule) -> None:
    path = autoremat.save_schedule(schedule, tmp_path / "s.yaml")
    loaded = autoremat.load_schedule(path)
    assert loaded == schedule
    assert loaded.key() == schedule.key()
    assert yaml.safe_load(path.read_text())["version"] == 1


def test_policies_resolve_to_jax_members() -> None:
    import jax

    assert Policy("none").resolve() is None
    assert Policy("dots_saveable").resolve() is jax.checkpoint_policies.dots_saveable
    assert callable(Policy("save_only_these_names", args=("gates",)).resolve())


def test_key_ignores_meta() -> None:
    a = autoremat.nested([4, 5])
    assert a.key() == a.with_meta(note="x").key()
    assert a.key() != autoremat.nested([4, 5], unroll=2).key()


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "out" / "schedule.yaml"
    for n in range(1, 6):
        autoremat.save_schedule(autoremat.nested([n, 3]), target)
    assert autoremat.load_schedule(target) == autoremat.nested([5, 3])
    assert [p.name for p in target.parent.iterdir()] == ["schedule.yaml"]


def _write_many(path: str, n: int) -> None:
    for _ in range(200):
        autoremat.save_schedule(autoremat.nested([n, n + 1]), path)


def test_concurrent_writers_leave_one_valid_file(tmp_path: Path) -> None:
    target = str(tmp_path / "schedule.yaml")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(target, n)) for n in (2, 3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert autoremat.load_schedule(target) in (autoremat.nested([2, 3]), autoremat.nested([3, 4]))


BAD = [
    # (yaml text, message regex)
    ("- 1\n- 2\n", r"schedule: expected a mapping"),
    ("version: 1\nlevels: [{length: 10}]\nlevles: []\n", r"'levles'.*unknown key; valid keys"),
    ("version: 2\nlevels: [{length: 10}]\n", r"version: unknown version 2.*known versions: 1"),
    ("levels: [{length: 10}]\n", r"version: missing"),
    ("version: 1\nkind: revolve\nlevels: [{length: 10}]\n", r"kind: unknown kind 'revolve'"),
    ("version: 1\n", r"levels: missing"),
    ("version: 1\nlevels: []\n", r"levels: expected a non-empty list"),
    ("version: 1\nlevels: {length: 10}\n", r"levels: expected a non-empty list"),
    ("version: 1\nlevels: [10]\n", r"levels\[0\]: expected a mapping"),
    ("version: 1\nlevels: [{policy: nothing_saveable}]\n", r"levels\[0\].length: missing"),
    ("version: 1\nlevels: [{length: 0}]\n", r"levels\[0\].length: must be >= 1, got 0"),
    ("version: 1\nlevels: [{length: -5}]\n", r"levels\[0\].length: must be >= 1, got -5"),
    ("version: 1\nlevels: [{length: '10'}]\n", r"levels\[0\].length: expected an integer >= 1"),
    ("version: 1\nlevels: [{length: 2.5}]\n", r"levels\[0\].length: expected an integer >= 1"),
    ("version: 1\nlevels: [{length: true}]\n", r"levels\[0\].length: expected an integer >= 1"),
    ("version: 1\nlevels: [{length: 10, polcy: none}]\n", r"levels\[0\].polcy: unknown key"),
    ("version: 1\nlevels: [{length: 10, policy: dots}]\n",
     r"levels\[0\].policy: unknown policy 'dots'; valid: none, nothing_saveable"),
    ("version: 1\nlevels: [{length: 10, policy: 3}]\n", r"levels\[0\].policy: expected a policy name"),
    ("version: 1\nlevels: [{length: 10, policy: {dots_saveable: [a]}}]\n",
     r"'dots_saveable' is not a policy factory"),
    ("version: 1\nlevels: [{length: 10, policy: save_only_these_names}]\n",
     r"save_only_these_names needs arguments"),
    ("version: 1\nlevels: [{length: 10}]\nunroll: 0\n", r"unroll: must be >= 1, got 0"),
    ("version: 1\nlevels: [{length: 10}]\nunroll: fast\n", r"unroll: expected an integer >= 1"),
    ("version: 1\nlevels: [{length: 10}]\nmeta: [1]\n", r"meta: expected a mapping"),
    ("version: 1\nlevels: [{length: 10}\n", r"not valid YAML \(line"),
    ("a: &x [1]\nb: *x\n", r"aliases \(\*name\) are not allowed"),
    ("", r"schedule: expected a mapping"),
    ("version: 1\nkind: binomial\n", r"snapshots: missing; a binomial schedule needs"),
    ("version: 1\nkind: binomial\nsnapshots: 0\n", r"snapshots: must be >= 1, got 0"),
    ("version: 1\nkind: binomial\nsnapshots: many\n", r"snapshots: expected an integer >= 1"),
    ("version: 1\nkind: binomial\nsnapshots: 4\nlevels: [{length: 2}]\n",
     r"levels: a binomial schedule has no levels"),
    ("version: 1\nkind: binomial\nsnapshots: 4\nbackward: fori\n",
     r"backward: expected one of loops, static, got 'fori'"),
    ("version: 1\nlevels: [{length: 2}]\nbackward: static\n",
     r"backward: a nested schedule has no backward \(a binomial schedule has\)"),
    ("version: 1\nlevels: [{length: 2}]\nsnapshots: 4\n",
     r"snapshots: a nested schedule has no snapshots \(a binomial schedule has\); remove it or "
     r"set kind: binomial"),
]


@pytest.mark.parametrize(("text", "match"), BAD)
def test_bad_schedules_name_field_and_fix(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScheduleError, match=match) as info:
        autoremat.load_schedule(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert "\n" not in message


def test_non_utf8_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"version: 1\nlevels: [{length: \xff}]\n")
    with pytest.raises(ScheduleError, match="not UTF-8"):
        autoremat.load_schedule(path)
    with pytest.raises(ScheduleError, match="cannot read schedule file"):
        autoremat.load_schedule(tmp_path / "missing.yaml")


def test_bad_objects_raise_schedule_error_not_type_error() -> None:
    with pytest.raises(ScheduleError, match="length: must be >= 1"):
        Level(0)
    with pytest.raises(ScheduleError, match="length: expected an integer >= 1"):
        Level("3")  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="policies: got 1 policies for 2 levels"):
        autoremat.nested([2, 3], ["none"])
    with pytest.raises(ScheduleError, match="levels: expected a non-empty list"):
        NestedSchedule(levels=())
    with pytest.raises(TypeError, match="abstract"):
        Schedule()  # type: ignore[abstract]
    with pytest.raises(ScheduleError, match="unknown policy 'fast'"):
        Policy("fast")
    with pytest.raises(ScheduleError, match="takes no arguments"):
        Policy("dots_saveable", args=("x",))
    assert issubclass(ScheduleError, ValueError)


def test_every_policy_name_is_documented_in_the_error() -> None:
    with pytest.raises(ScheduleError) as info:
        Policy.from_data("nope")
    for name in ALL_POLICY_NAMES:
        assert name in str(info.value)


def test_dump_is_the_documented_shape() -> None:
    data = yaml.safe_load(dump_schedule(autoremat.nested([100, 100])))
    assert data == {
        "version": 1,
        "kind": "nested",
        "levels": [
            {"length": 100, "policy": "nothing_saveable"},
            {"length": 100, "policy": "nothing_saveable"},
        ],
        "unroll": 1,
    }


def test_the_binomial_backward_is_in_the_yaml_only_when_static() -> None:
    loops, static = autoremat.binomial(8), autoremat.binomial(8, backward="static")
    assert "backward" not in yaml.safe_load(dump_schedule(loops))
    assert yaml.safe_load(dump_schedule(static))["backward"] == "static"
    assert parse_schedule(dump_schedule(static)) == static
    assert parse_schedule("version: 1\nkind: binomial\nsnapshots: 8\nbackward: loops\n") == loops
    assert loops.key() != static.key()
    assert static.describe() == "binomial s=8 backward=static unroll=1"
