"""``tune`` on every process of a multi-controller job, in lockstep.

Every process of the job runs the same ``tune`` call (the same command on every host).
Process 0 decides: it runs the search as on one process -- the study, the planner and
the schedule file are its alone -- with compile threads off, so it compiles in one
order. Each schedule it compiles (``measure.compile_schedule``) is announced to the other
processes through the job's key-value store (``jax.distributed``); they compile it too
and send back their figures, which are combined with process 0's
(``autoremat._measure.peers.combine``: every byte figure the largest on any device of any
process, a failure on any process the trial's failure, naming it). Each run of the step
on process 0 is a run on every process: it tells the others, runs, and waits until each
has run it too, so a timed run lasts until the slowest process is done and a failed run
anywhere fails the trial. When process 0 is done it sends its ``TuneResult``: every
process returns the same one.

The processes of one run meet in its collectives by the run's launch id, which JAX
derives from the executable's fingerprint, and the fingerprint covers each operation's
source location. Process 0 traces a step under the search, the others under their loop
here: with the whole Python stack in each location (JAX's default) their programs
differ in it alone, and from jax 0.11 their first collective waits forever. So every
process lowers its steps with the innermost user frame as each location
(``autoremat._jax.same_locations_anywhere``): the same program, the same fingerprint.
And every process compiles each step itself, with JAX's persistent compilation cache
off (``autoremat._measure.compile_cache.no_persistent_cache``): an executable read back
from it has another fingerprint than the same program compiled.

Faults: every process beats every ``heartbeat / 4`` s and watches the others'; one that
has not beaten for ``LOST_AFTER * heartbeat`` s is lost (killed, hung, or its host gone),
and each other process ends its tune at once: its watcher thread interrupts the main
thread (a wait on the store returns within ``_WAIT_MS``), and ``tune`` raises
``LockstepLost`` naming the lost process (the command line prints it and exits with its
own code). A main thread blocked inside a device collective with the lost process is
ended by ``jax.distributed``'s own heartbeat check. What process 0 recorded stays in the
study; the trial under way goes stale (``storage``'s heartbeats) and the same command
resumes the study.
"""

from __future__ import annotations

import _thread
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from autoremat._errors import TuneError, one_line
from autoremat._measure.compile_cache import no_persistent_cache
from autoremat._measure.failure import BUILD, words
from autoremat._measure.measure import compile_schedule
from autoremat._measure.measurement import ERROR, OK, Measurement
from autoremat._measure.peers import combine, on_every_process
from autoremat._measure.timing import Compiled

if TYPE_CHECKING:
    from autoremat._measure.problem import Problem
    from autoremat._schedules.base import Schedule
    from autoremat._search.study import TuneResult

#: A process silent for this many heartbeats is lost (beats come every quarter of one,
#: and are checked as often: the others end within ``(LOST_AFTER + 0.25) * heartbeat``).
LOST_AFTER: Final = 1.5
#: Executables a following process keeps compiled (older ones are compiled again when run).
KEPT: Final = 4
_PREFIX: Final = "autoremat/lockstep"
_WAIT_MS: Final = 1000  # one blocking read of the store; repeated while the sender lives
_sessions = [0]  # lockstep tunes started in this process: the same count on every process


class LockstepLost(BaseException):
    """Another process of a lockstep tune was lost: this one's tune ends, keeping what the
    study recorded; the same call on every process resumes it.

    Like ``KeyboardInterrupt`` it is no ``Exception``: it ends the tune, it does not fail
    the trial under way (whose handlers record an ``Exception`` as the trial's failure).

    Attributes:
      lost: the lost process's index; ``processes``: the job's count; ``process``: this
        one's index; ``why``: how it was found lost.
    """

    def __init__(self, lost: int, processes: int, process: int, why: str) -> None:
        self.lost, self.processes, self.process, self.why = lost, processes, process, why
        super().__init__(f"lockstep tune: lost process {lost} of {processes}: {why}; "
                         f"process {process} ends its tune; the study keeps what was "
                         "recorded: run the same command on every process to resume it")


class _Store:
    """One lockstep tune's keys in the job's key-value store, pickled values."""

    def __init__(self, heartbeat: float) -> None:
        import jax

        from autoremat._jax import distributed_client

        self.client = distributed_client()
        if self.client is None:
            raise TuneError("jax.process_count() > 1 but jax.distributed is not initialized "
                            "in this process: call jax.distributed.initialize() first")
        self.process, self.count = jax.process_index(), jax.process_count()
        _sessions[0] += 1
        self.prefix = f"{_PREFIX}/{_sessions[0]}"
        self.heartbeat = float(heartbeat)
        self.sent = 0

    def put(self, key: str, value: Any) -> None:
        self.client.key_value_set_bytes(f"{self.prefix}/{key}", pickle.dumps(value))

    def get(self, key: str) -> Any:
        """The value at ``key``, waiting for it as long as it takes (the watchdog ends a
        process whose peer is lost)."""
        while True:
            try:
                raw = self.client.blocking_key_value_get_bytes(f"{self.prefix}/{key}", _WAIT_MS)
            except Exception as e:  # not there yet: wait on
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise self.lost(0, "the job's key-value store (on process 0) stopped "
                                       f"answering: {one_line(e)}") from None
                continue
            return pickle.loads(raw)

    def lost(self, process: int, why: str) -> LockstepLost:
        """The error for ``process`` lost (``why``), seen from this one."""
        return LockstepLost(process, self.count, self.process, why)

    def send(self, message: dict[str, Any]) -> int:
        """Process 0's next message to the others; its number."""
        self.put(f"msg/{self.sent}", message)
        self.sent += 1
        return self.sent - 1

    def replies(self, key: str) -> list[tuple[int, Any]]:
        """Every other process's reply at ``key``, by process."""
        return [(p, self.get(f"{key}/{p}")) for p in range(1, self.count)]


class _Watchdog:
    """Beats for this process and watches the others' beats (the module doc)."""

    def __init__(self, store: _Store) -> None:
        self.store = store
        self.lost: LockstepLost | None = None  # set once, then the main thread is interrupted
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watch, name="autoremat-lockstep",
                                       daemon=True)

    def beat_key(self, process: int) -> str:
        return f"{self.store.prefix}/beat/{process}"

    def watch(self) -> None:
        client, every = self.store.client, self.store.heartbeat / 4
        others = [p for p in range(self.store.count) if p != self.store.process]
        seen: dict[int, tuple[str, float]] = {p: ("", time.monotonic()) for p in others}
        beats = 0
        while not self.stop.wait(every):
            now = time.monotonic()
            beats += 1
            try:  # its own key alone: a count overwritten (jax 0.7 has no increment)
                client.key_value_set(self.beat_key(self.store.process), str(beats),
                                     allow_overwrite=True)
                for p in others:
                    try:
                        value = client.key_value_try_get(self.beat_key(p))
                    except Exception:  # not beaten yet
                        value = ""
                    if value != seen[p][0]:
                        seen[p] = (value, now)
            except Exception as e:  # the store itself is gone: process 0 hosts it
                return self.end(self.store.lost(0, "the job's key-value store (on process "
                                                   f"0) stopped answering: {one_line(e)}"))
            for p, (_, at) in seen.items():
                if now - at > LOST_AFTER * self.store.heartbeat:
                    return self.end(self.store.lost(p, f"no heartbeat for {now - at:.1f} s "
                                                       f"(heartbeat {self.store.heartbeat:g} s)"))

    def end(self, lost: LockstepLost) -> None:
        """Keep ``lost`` and interrupt the main thread: ``in_lockstep`` raises it there."""
        self.lost = lost
        _thread.interrupt_main()

    def __enter__(self) -> _Watchdog:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


class _Everywhere:
    """Process 0's executable of a step: each call runs it on every process (module doc)."""

    def __init__(self, executable: Any, store: _Store, ticket: int) -> None:
        self.executable, self.store, self.ticket = executable, store, ticket
        self.checked = False

    def __call__(self, *args: Any) -> Any:
        import jax

        run = self.store.send({"op": "run", "id": self.ticket})
        out = jax.block_until_ready(self.executable(*args))
        failed = [(p, why) for p, why in self.store.replies(f"ran/{run}") if why]
        if failed:
            raise RuntimeError(f"process {failed[0][0]}: {failed[0][1]}")
        if not self.checked:  # the first run: every local shard finite (timing checks one)
            self.checked = True
            if not _finite(out):
                raise RuntimeError("non-finite output on process 0's devices")
        return _local(out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.executable, name)


def _local(out: Any) -> Any:
    """A run's outputs as arrays of this process's first device: a replicated array's copy
    there, a sharded one's shard there (what process 0 checks and frees alone: a program
    over every process's array would wait for the others)."""
    import jax

    def mine(leaf: Any) -> Any:
        if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
            return leaf
        return leaf.addressable_data(0)

    return jax.tree_util.tree_map(mine, out)


def _finite(out: Any) -> bool:
    """Every floating value of every local shard of ``out`` is finite (copied to the host)."""
    import jax
    import numpy as np

    return all(np.isfinite(np.asarray(s.data)).all()
               for leaf in jax.tree_util.tree_leaves(out)
               if isinstance(leaf, jax.Array) and jax.numpy.issubdtype(leaf.dtype, np.floating)
               for s in leaf.addressable_shards)


@dataclass
class _Leader:
    """Process 0's ``autoremat._measure.peers.Peers``: announces, combines, wraps."""

    store: _Store
    tickets: int = 0
    budgets: dict[int, int | None] = field(default_factory=dict)

    def announce(self, problem: Problem, schedule: Schedule, budget_bytes: int | None) -> int:
        if threading.current_thread() is not threading.main_thread():  # no compile threads
            raise TuneError("lockstep tune: a compile off the main thread would reach the "
                            "other processes out of order")
        self.tickets += 1
        self.budgets[self.tickets] = budget_bytes
        self.store.send({"op": "compile", "id": self.tickets, "length": problem.seq_len,
                         "schedule": schedule, "budget": budget_bytes})
        return self.tickets

    def joined(self, ticket: int, compiled: Compiled) -> Compiled:
        theirs: list[tuple[int, Measurement]] = self.store.replies(f"compiled/{ticket}")
        m = combine(compiled.measurement, theirs, self.budgets.pop(ticket))
        if m.status != OK or compiled.executable is None:
            return Compiled(m)
        return Compiled(m, _Everywhere(compiled.executable, self.store, ticket), compiled.args)


@dataclass
class _Follower:
    """Any other process: compiles and runs what process 0 says, until it says done."""

    problem: Problem
    store: _Store
    recipes: dict[int, tuple[int, Schedule, int | None]] = field(default_factory=dict)
    compiled: OrderedDict[int, Compiled] = field(default_factory=OrderedDict)
    lengths: dict[int, Problem] = field(default_factory=dict)
    checked: set[int] = field(default_factory=set)

    def variant(self, length: int) -> Problem:
        """The problem at ``length`` steps (process 0's short runs: ``at_length``)."""
        if length == self.problem.seq_len or self.problem.at_length is None:
            return self.problem
        if length not in self.lengths:
            self.lengths[length] = self.problem.at_length(length)
        return self.lengths[length]

    def compile(self, ticket: int) -> Compiled:
        if ticket in self.compiled:
            self.compiled.move_to_end(ticket)
            return self.compiled[ticket]
        length, schedule, budget = self.recipes[ticket]
        try:
            problem = self.variant(length)
        except Exception as e:  # at_length refused here: this process cannot build it
            return Compiled(Measurement(schedule.key(), ERROR, f"{words(BUILD)}: at length "
                                        f"{length}: {one_line(e)}", failed_at=BUILD))
        c = compile_schedule(problem, schedule, budget_bytes=budget)
        self.compiled[ticket] = c
        while len(self.compiled) > KEPT:
            self.compiled.popitem(last=False)[1].release()
        return c

    def run(self, ticket: int) -> str:
        """Run the step once (its first run checked finite); why it failed, or ``""``."""
        import jax

        c = self.compile(ticket)
        if c.executable is None:
            return f"it did not compile here: {c.measurement.reason}"
        try:
            out = jax.block_until_ready(c.executable(*c.args))
            if ticket not in self.checked:
                self.checked.add(ticket)
                if not _finite(out):
                    return "non-finite output on this process's devices"
        except Exception as e:
            return f"run failed: {one_line(e)}"
        return ""

    def follow(self) -> TuneResult:
        me = self.store.process
        for n in range(1 << 62):
            msg = self.store.get(f"msg/{n}")
            op = msg["op"]
            if op == "compile":
                self.recipes[msg["id"]] = (msg["length"], msg["schedule"], msg["budget"])
                self.store.put(f"compiled/{msg['id']}/{me}", self.compile(msg["id"]).measurement)
            elif op == "run":
                self.store.put(f"ran/{n}/{me}", self.run(msg["id"]))
            elif op == "hello":
                self.store.put(f"hello/{me}", (self.problem.name, self.problem.seq_len))
            elif op == "done":
                return msg["result"]
            elif op == "error":
                raise TuneError(f"lockstep tune: process 0 stopped: {msg['message']}")
        raise AssertionError("unreachable")


def in_lockstep(problem: Problem, heartbeat: float,
                tune_here: Callable[[Problem], TuneResult]) -> TuneResult:
    """``tune`` on every process of the job (module doc), their heartbeats ``heartbeat``
    seconds apart: process 0 runs ``tune_here`` on ``problem`` compiled on every process
    (``autoremat._measure.peers.on_every_process``; no compile threads, so its compiles
    reach the others in one order) with the others following; every process returns its
    ``TuneResult``.

    Raises:
      TuneError: jax.distributed is not initialized, the processes built different
        problems, or process 0's tune failed (its error, on the others).
      LockstepLost: another process was lost (the module doc).
    """
    from autoremat._jax import same_locations_anywhere

    store = _Store(float(heartbeat))
    watchdog = _Watchdog(store)
    try:  # one executable of each step on every process (module doc)
        with watchdog, same_locations_anywhere(), no_persistent_cache():
            result = _follow(problem, store) if store.process != 0 else _lead(
                problem, store, tune_here)
    except KeyboardInterrupt:  # the watchdog's, or Ctrl-C
        if watchdog.lost is not None:
            raise watchdog.lost from None
        raise
    if watchdog.lost is not None:  # its interrupt ended the search early (as Ctrl-C does)
        raise watchdog.lost
    return result


def _follow(problem: Problem, store: _Store) -> TuneResult:
    return _Follower(problem, store).follow()


def _lead(problem: Problem, store: _Store,
          tune_here: Callable[[Problem], TuneResult]) -> TuneResult:
    try:
        store.send({"op": "hello"})
        mine = (problem.name, problem.seq_len)
        for p, theirs in store.replies("hello"):
            if tuple(theirs) != mine:
                raise TuneError(f"lockstep tune: process {p} built {theirs[0]} (T={theirs[1]}), "
                                f"process 0 built {mine[0]} (T={mine[1]}): run the same "
                                "command with the same arguments on every process")
        result = tune_here(on_every_process(problem, _Leader(store)))
    except BaseException as e:
        store.send({"op": "error", "message": one_line(e)})
        raise
    store.send({"op": "done", "result": result})
    return result
