"""The ``autoremat`` command's settings, in one table.

Each ``Setting`` makes one command-line option (``--name-with-dashes``, or
its own ``flag``) and, for ``tune``, one study-file key (``name``); its
``check`` validates the value whichever way it came (study files can hold
anything), and library errors that name an argument get its flag
(``with_flag``). It imports no jax (only the jax-free autoremat modules named
below, and yaml): ``autoremat --help`` must stay instant.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from autoremat._cli.distributed import COORDINATOR_HELP, check_coordinator
from autoremat._errors import ScheduleError, TuneError
from autoremat._measure.mesh import parse_mesh
from autoremat._measure.timing import DEFAULT_TIME_BUDGET
from autoremat._models import MODELS, SEED_LSTM, Size
from autoremat._models.seed_lstm import SEED_AXES
from autoremat._schedules.safe_yaml import read_yaml_file
from autoremat._search.storage import DEFAULT_HEARTBEAT, DEFAULT_STORAGE
from autoremat._search.tune import DEFAULT_TIME_LIMIT
from autoremat._units import DURATION_FORMS, parse_duration, parse_whole_seconds

#: The default problem, the seed LSTM, a name in the built-in models' registry
#: (``autoremat._models.MODELS``).
BUILTIN_PROBLEM: Final = SEED_LSTM
STORAGE_ENV: Final = "AUTOREMAT_STORAGE"
#: Where studies go by default, as the help says it: relative to the folder the command runs in.
DEFAULT_STORAGE_HELP: Final = (f"{DEFAULT_STORAGE}, a runs/ folder made in the current "
                               "folder")
_MAX_SIZE: Final = 2**31 - 1  # lax.scan lengths and array dimensions are int32

#: ``check(value)``: ``None`` when the value is good, else what was expected.
Check = Callable[[Any], "str | None"]


class UsageError(Exception):
    """Bad command-line input; printed as one line, exit 2."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _integer(low: int, high: int, expected: str | None = None) -> Check:
    def check(v: Any) -> str | None:
        ok = _is_int(v) and low <= v <= high
        return None if ok else expected or f"an integer from {low} to {high}"

    return check


def _duration(v: Any) -> str | None:
    try:
        parse_duration(v)
    except TuneError:
        return DURATION_FORMS
    return None


def _whole_seconds(v: Any) -> str | None:
    try:
        parse_whole_seconds(v)
    except TuneError:
        return "whole seconds >= 1 such as 60, 90s or 5m"
    return None


def _text(max_len: int | None = None) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, str) or not v.strip() or "\0" in v:
            return "a non-empty string"
        return None if max_len is None or len(v) <= max_len else f"at most {max_len} characters"

    return check


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _any(v: Any) -> str | None:  # the budget: parse_bytes says what it accepts
    return None


def _mesh(v: Any) -> str | None:
    try:
        ok = all(name in SEED_AXES for name, _ in parse_mesh(v if isinstance(v, str) else ""))
    except ValueError:
        ok = False
    expected = "axis=N[,axis=N] over the axes data and fsdp, such as data=4 or data=2,fsdp=2"
    return None if ok else expected


@dataclass(frozen=True)
class Setting:
    """One setting: its study-file key, option, check and ``tune`` default.

    ``help`` may name ``{default}``; ``const`` makes a flag storing that value.
    """

    name: str
    help: str
    check: Check
    type: Callable[[str], Any] = str
    default: Any = None
    metavar: str | None = None
    const: Any = None
    flag_name: str | None = None

    @property
    def flag(self) -> str:
        return self.flag_name or f"--{self.name.replace('_', '-')}"

    def add_to(self, parser: Any) -> None:
        """The option; its default is ``None`` (not given), so study files can fill it."""
        text = self.help.format(default=self.default)
        if self.const is not None:
            parser.add_argument(self.flag, dest=self.name, action="store_const",
                                const=self.const, default=None, help=text)
        else:
            parser.add_argument(self.flag, dest=self.name, type=self.type,
                                metavar=self.metavar, default=None, help=text)


_SIZE = _integer(1, _MAX_SIZE, f"a positive integer up to {_MAX_SIZE}")


def _size_settings() -> tuple[Setting, ...]:
    """One option per size of the built-in models (``MODELS``), in their order; a size two
    models share (``--seq-len``) is one option naming each model's meaning and default."""
    names: dict[str, list[tuple[str, Size]]] = {}
    for m in MODELS.values():
        for size in m.sizes:
            names.setdefault(size.name, []).append((m.name, size))
    out = []
    for name, sizes in names.items():
        words = "; ".join(f"{model}: {size.help} ({size.default})" for model, size in sizes)
        out.append(Setting(name, f"built-in problems: {words}" if len(sizes) > 1 else words,
                           _SIZE, int))
    return tuple(out)


_SIZES: Final = _size_settings()
#: The sizes that only the layer stack takes (``--layers``, ...).
LAYER_SETTINGS: Final = tuple(s for s in _SIZES if s.name not in MODELS[SEED_LSTM].settings)

#: The built-in problems' settings (``tune`` and ``show``): each model's sizes, then the
#: seed LSTM's loss, readout and mesh.
PROBLEM_SETTINGS: Final = (
    *(s for s in _SIZES if s not in LAYER_SETTINGS),
    Setting("seq2seq", f"{SEED_LSTM}: loss on the last hidden state only", _boolean,
            default=True, const=False, flag_name="--last-only"),
    Setting("fused_readout", f"{SEED_LSTM}: only schedules with the readout and loss "
            "inside the scanned step (seq2seq): nothing T-long is stacked, so a schedule removes "
            "almost all temp (default: the search tries fused and unfused)", _boolean,
            default=False, const=True),
    Setting("unfused_readout", f"{SEED_LSTM}: only schedules with the readout after the "
            "scan, as written (its T-long stack of states is a floor under every schedule)",
            _boolean, default=False, const=True),
    Setting("mesh", f"{SEED_LSTM} on many devices: data=4 splits the batch over 4 devices; "
            "data=2,fsdp=2 also splits parameters and optimizer state over fsdp (FSDP); the "
            "batch defaults to a multiple of the device count. Every figure and --budget are "
            "then per device", _mesh, str, metavar="AXIS=N[,AXIS=N]"),
    *LAYER_SETTINGS,
)

PROBLEM_HELP: Final = ("package.module:name or path/file.py:name (a Problem or a zero-argument "
                       f"callable returning one); default: {BUILTIN_PROBLEM}; built in: "
                       + "; ".join(f"{m.name}, {m.summary}" for m in MODELS.values()))

#: Every ``tune`` setting, in ``--help`` order; the study-file keys.
TUNE_SETTINGS: Final = (
    Setting("budget", "memory budget per device (on a mesh, 4GB means 4 GB on each device): "
            "4GB (10^9), 4GiB (2^30), 512MB, 1.5G, 4000000000B (a number without a unit is "
            "bytes, and warned); "
            "default: the device's memory (host RAM on CPU)", _any),
    Setting("problem", PROBLEM_HELP, _text()),
    *PROBLEM_SETTINGS,
    Setting("trials", "measure N schedules, fewer if a small space runs out (default: until "
            "nothing left is predicted to beat the best, or --time-limit; with --total-trials, "
            "that total); duplicates are skipped and do not count", _integer(0, _MAX_SIZE), int, metavar="N"),
    Setting("total_trials", "stop when the study holds N measured schedules, counting every "
            "worker's; a worker then waits for trials still running elsewhere, so all of them "
            "end on the same final answer", _integer(1, _MAX_SIZE), int, metavar="N"),
    Setting("time_limit", "stop starting trials after this long: 90, 90s, 5m, 1.5h "
            "({default}); at T >= 20000 trials are timed on short runs and the pick is then "
            "timed at full length after the search (a step predicted longer than this and than 15 "
            "minutes is not)",
            _duration, str, DEFAULT_TIME_LIMIT, "DURATION"),
    Setting("explore_front", "measure the whole memory/time front, not just the fastest "
            "schedule that fits (no early stop or cut trials; see 'autoremat pareto')",
            _boolean, default=False, const=True),
    Setting("storage", f"Optuna storage URL (env {STORAGE_ENV}; default "
            f"{DEFAULT_STORAGE_HELP}); any RDB URL, e.g. postgresql://..., lets several "
            "workers share one study", _text()),
    Setting("study_name", "resume or create this study (default: from the problem, device "
            "and budget, so the same command resumes)", _text(512)),  # Optuna: VARCHAR(512)
    Setting("out", "where to write the chosen schedule ({default})", _text(), str,
            "schedule.yaml"),
    Setting("seed", "seed of the planner's random candidates ({default})", _integer(0, 2**32 - 1),
            int, 0),
    Setting("time_budget", "timed runs per schedule, about this long: 0.5, 5s, 1m "
            "({default:g}s)", _duration, str, DEFAULT_TIME_BUDGET, "DURATION"),
    Setting("heartbeat", "a running trial records a heartbeat this often: 60, 90s, 5m "
            "({default}s); one silent for 3x that (its worker was killed or lost) is marked "
            "failed and re-queued for another worker, at most twice", _whole_seconds, str,
            DEFAULT_HEARTBEAT, "DURATION"),
    Setting("coordinator", COORDINATOR_HELP, check_coordinator, metavar="auto|HOST:PORT,N,I"),
)
#: ``tune --help``'s option groups: (title, the settings' names), every setting in one.
TUNE_GROUPS: Final = (
    ("budget and search", ("budget", "trials", "total_trials", "time_limit", "explore_front",
                           "seed", "time_budget")),
    ("problem: yours, or a built-in one and its sizes",
     ("problem", *(s.name for s in PROBLEM_SETTINGS))),
    ("storage (the study; several workers)", ("storage", "study_name", "heartbeat")),
    ("many hosts: every process of a job runs this command", ("coordinator",)),
    ("output", ("out",)),
)
STUDY_FILE_KEYS: Final = tuple(s.name for s in TUNE_SETTINGS)
_BY_NAME: Final = {s.name: s for s in TUNE_SETTINGS}
#: Library argument -> the flag that sets it (library errors start with ``argument:``).
#: Not the problem sizes: ``seq_len:`` from a user's ``Problem`` is not ``--seq-len``.
_FLAGS: Final = {"trial": "TRIAL", **{s.name: s.flag for s in TUNE_SETTINGS
                                      if s not in PROBLEM_SETTINGS}}


def flag(name: str) -> str:
    """The option that sets ``name``."""
    return _BY_NAME[name].flag


def with_flag(message: str) -> str:
    """A library message ``argument: ...`` as ``--flag: ...`` (others unchanged)."""
    name, sep, rest = message.partition(": ")
    return f"{_FLAGS[name]}: {rest}" if sep and name in _FLAGS else message


def add_settings(parser: Any, settings: Iterable[Setting]) -> None:
    """Each setting's option on ``parser`` (or an argument group of one)."""
    for s in settings:
        s.add_to(parser)


def add_grouped(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``TUNE_SETTINGS`` in ``TUNE_GROUPS``' argument groups (``--help`` lists them so);
    returns the groups by title, for the command's own options."""
    groups: dict[str, Any] = {}
    for title, names in TUNE_GROUPS:
        groups[title] = parser.add_argument_group(title)
        add_settings(groups[title], (_BY_NAME[name] for name in names))
    return groups


def given(args: argparse.Namespace, settings: Iterable[Setting]) -> dict[str, Any]:
    """The settings given on the command line (``None``: not given)."""
    return {s.name: getattr(args, s.name) for s in settings
            if getattr(args, s.name, None) is not None}


def with_defaults(settings: Mapping[str, Any], table: Iterable[Setting]) -> dict[str, Any]:
    """``settings`` with each unset one at its default."""
    out = dict(settings)
    for s in table:
        if out.get(s.name) is None:
            out[s.name] = s.default
    return out


def check_settings(settings: Mapping[str, Any]) -> None:
    """Every setting has the right type and range.

    Raises:
      UsageError: naming the option, what it expects and the bad value.
    """
    for s in TUNE_SETTINGS:
        value = settings.get(s.name)
        expected = None if value is None else s.check(value)
        if expected is not None:
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise UsageError(f"{s.flag}: expected {expected}, got {shown}")
    out = settings.get("out")
    if isinstance(out, str) and Path(out).is_dir():
        raise UsageError(f"--out: {out!r} is a directory; give a file name such as schedule.yaml")


@dataclass(frozen=True)
class ProblemSettings:
    """The problem a command runs on, as ``PROBLEM_SETTINGS`` give it.

    Attributes:
      problem: ``--problem`` (``None``: the default built-in problem).
      given: the built-in problems' settings given, ``(name, value)`` in
        ``PROBLEM_SETTINGS`` order; one at its default (``seq2seq: true``) or not given is
        absent. The readout's two flags are one entry, ``fused_readout``: ``True``
        (``--fused-readout``) or ``False`` (``--unfused-readout``).
    """

    problem: str | None = None
    given: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> ProblemSettings:
        """From checked settings by name (``check_settings``).

        Raises:
          UsageError: both readout flags given.
        """
        given = {s.name: values[s.name] for s in PROBLEM_SETTINGS
                 if values.get(s.name) is not None and values[s.name] != s.default}
        if given.get("unfused_readout"):
            if given.get("fused_readout"):
                raise UsageError("--fused-readout, --unfused-readout: each forces one readout; "
                                 "give one, or neither to let the search choose")
            given = {("fused_readout" if k == "unfused_readout" else k): (False if k ==
                     "unfused_readout" else v) for k, v in given.items()}
        problem = values.get("problem")
        return cls(problem if isinstance(problem, str) else None, tuple(given.items()))

    def flag(self, name: str) -> str:
        """The option that gave setting ``name`` (the readout's: the one given)."""
        if name == "fused_readout" and dict(self.given).get(name) is False:
            return _BY_NAME["unfused_readout"].flag
        return _BY_NAME[name].flag


@dataclass(frozen=True, kw_only=True)
class TuneSettings:
    """``tune``'s settings, checked, each unset one at its default (``TUNE_SETTINGS``: the
    study-file keys and options; the problem's are ``problem``)."""

    budget: str | int | None
    problem: ProblemSettings
    trials: int | None
    total_trials: int | None
    time_limit: str | float | None
    explore_front: bool
    storage: str | None
    study_name: str | None
    out: str
    seed: int
    time_budget: str | float
    heartbeat: str | int
    coordinator: str | None

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> TuneSettings:
        """From settings by name (a study file's, then the command line's over them);
        ``trials`` defaults to ``total_trials``.

        Raises:
          UsageError: a setting of the wrong type or range, naming its option.
        """
        check_settings(values)
        full = with_defaults(values, TUNE_SETTINGS)
        if full["trials"] is None:
            full["trials"] = full["total_trials"]
        return cls(problem=ProblemSettings.of(full),
                   **{s.name: full[s.name] for s in TUNE_SETTINGS
                      if s not in PROBLEM_SETTINGS and s.name != "problem"})


def read_study_file(path: str) -> dict[str, Any]:
    """A study file's settings (keys may use dashes); unknown keys are usage errors."""
    try:
        data = read_yaml_file(path, what="study file")
    except ScheduleError as e:
        raise UsageError(str(e)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of settings ({', '.join(STUDY_FILE_KEYS)})")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    bad = [k for k in data if k not in STUDY_FILE_KEYS]
    if bad:
        raise UsageError(f"{path}: unknown setting {bad[0][:60]!r}; valid: "
                         f"{', '.join(STUDY_FILE_KEYS)}")
    return data
