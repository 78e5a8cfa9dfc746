"""Where a tune's time goes, command to written pick (issue 47): three CLI runs, phase by phase.

Each case is ``autoremat tune`` run as its own fresh process (``python -m autoremat.cli``
behind a thin wrapper, ``--child``), so start-up -- imports, JAX and the device
starting, the problem's arguments -- is counted as a user sees it. The parent never
imports jax (one process at a time may hold a TPU); the cases run one after another in
one scratch folder (one study storage, one probe cache, empty at the start: a fresh
machine). The wrapper time-stamps, on stderr, every compile of a schedule (and whether
the compiler ran out of memory), every probe (``probes.guard``), every trial, the
full-length confirmation and the proof of fit; the parent time-stamps the CLI's own lines.

Cases (issue 47's targets on a TPU v5e):

a. ``big``: ``tune --hidden 1024 --batch 128 --budget 12GB`` (T=10^4): <= 60 s command
   to written pick, <= 2 out-of-memory compiles;
b. ``seed``: ``tune --budget 4GB`` (the seed LSTM): <= 45 s;
c. ``unmodified``: ``tune --problem examples/seed_unmodified.py:problem --budget 4GB``
   (``Problem.from_loss``, T=10^4): 0 trials lost to compiles of combined offload
   placements;
d. ``mlp_stack``: the MLP-heavy layer stack (12 layers, d_model 1536, MLP 6144, 512
   tokens, batch 16: ``studies/layer_presets.py``'s ``MLP_HEAVY``) at the chip's memory
   (16909 MB on a v5e), the default time limit: <= 150 s, and the pick unrolled where an
   unroll is >= 5% faster than unroll 1 (the line ``unroll`` of each run gives the pick's).

Each case also times the steps of JAX's persistent-cache path (the key, the entry's write
and its compression and file write alone, a read; the executables' bytes), and a thread
that sleeps 1 ms in a loop records each time it woke over 20 ms late (the GIL held that
long): a study's instrument on JAX's private modules, never the library's.

Per case the breakdown: the first line, start-up to the ``problem:`` line, probes (count,
seconds, verdicts), trials (measured, seconds, cut, lost to failed compiles -- of them
combining offload placements), out-of-memory compiles, confirmation, proof of fit, total,
the pick. Written to ``--out`` (Markdown) and the same name with ``.json``.

On the TPU machine (after ``source studies/device_setup.sh``)::

    PYTHONUNBUFFERED=1 python3 studies/tune_time.py --out studies/results/tune_time.md

``--cases a,b`` runs only those, in that order (a letter twice runs it twice);
``--fresh`` gives each run its own scratch folder (a fresh study, probe cache and
compile cache: three fresh runs of ``d`` are ``--cases d,d,d --fresh``; without it a case
run again resumes the study, and its compile cache's hits are in its ``study:`` line);
``TUNE_TIME_SWITCH_INTERVAL`` (seconds) in the environment sets Python's switch interval in
each case (the default is 0.005) for an A/B of it;
``--sample`` samples each case's main thread every 10 ms
and adds where its time went (seconds on the stack per function, and in time). Off a TPU
it says so and exits 0 unless ``--allow-cpu``;
``--small`` shrinks every size (T=64, tiny models, 1 trial each: the CPU plumbing test,
``tests/test_studies.py``; its figures are not measurements of anything).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parent.parent
#: The wrapper's event lines on stderr start with this.
TAG = "@tune_time "
CASES = ("a", "b", "c", "d")
NAMES = {"a": "big", "b": "seed", "c": "unmodified", "d": "mlp_stack"}
#: The targets: seconds command to written pick (``None``: none).
TARGET_S = {"a": 60.0, "b": 45.0, "c": None, "d": 150.0}
#: The MLP-heavy layer stack (``studies/layer_presets.py``'s ``MLP_HEAVY``) and a v5e's
#: memory, the budget of case ``d``.
MLP_STACK: Final = ["--problem", "layer_stack", "--layers", "12", "--d-model", "1536",
                    "--heads", "12", "--mlp", "6144", "--seq-len", "512", "--batch", "16"]
CHIP_BUDGET: Final = "16909MB"
#: Set in the environment: Python's switch interval in the case, in seconds.
SWITCH_ENV: Final = "TUNE_TIME_SWITCH_INTERVAL"
#: Set (by ``--sample``) in a case's environment: its main thread is sampled (``_sample_main``).
SAMPLE_ENV: Final = "TUNE_TIME_SAMPLE"


def case_args(case: str, small: bool) -> tuple[list[str], dict[str, str]]:
    """The CLI arguments and extra environment of a case."""
    if small:
        quick = ["--trials", "1", "--time-budget", "0.02"]
        return {
            "a": (["tune", "--hidden", "16", "--batch", "4", "--budget", "2MB", "--seq-len",
                   "64", *quick], {}),
            "b": (["tune", "--budget", "12MB", "--seq-len", "64", *quick], {}),
            "c": (["tune", "--problem", f"{ROOT / 'examples' / 'seed_unmodified.py'}:problem",
                   "--budget", "12MB", *quick], {"SEED_SEQ_LEN": "64"}),
            "d": (["tune", "--problem", "layer_stack", "--layers", "2", "--d-model", "16",
                   "--heads", "2", "--mlp", "32", "--seq-len", "8", "--batch", "2",
                   "--budget", "64MB", *quick], {}),
        }[case]
    return {
        "a": (["tune", "--hidden", "1024", "--batch", "128", "--budget", "12GB"], {}),
        "b": (["tune", "--budget", "4GB"], {}),
        "c": (["tune", "--problem", f"{ROOT / 'examples' / 'seed_unmodified.py'}:problem",
               "--budget", "4GB"], {}),
        "d": (["tune", *MLP_STACK, "--budget", CHIP_BUDGET], {}),
    }[case]


# -- the child: the CLI, instrumented ----------------------------------------------------
_EMITTING = threading.Lock()  # compile threads emit too: one whole line at a time


def _emit(event: str, **fields: Any) -> None:
    line = TAG + json.dumps({"event": event, "t": time.time(), **fields}, default=str) + "\n"
    with _EMITTING:
        sys.stderr.write(line)
        sys.stderr.flush()


def _sample_main(interval: float, stop: threading.Event) -> None:
    """Sample the main thread's stack every ``interval`` seconds (``--sample``) and emit,
    at ``stop``, what it was doing: per function of ``autoremat``/``optuna``, the share of
    samples it was on the stack (inclusive), the innermost frames (self), and the runs of
    equal ``autoremat function > innermost function`` labels in time (``spans``)."""
    main = threading.main_thread().ident
    inclusive: dict[str, int] = {}
    inner: dict[str, int] = {}
    spans: list[list[Any]] = []
    n = 0
    while not stop.wait(interval):
        frame = sys._current_frames().get(main)
        if frame is None:
            continue
        n += 1
        seen: set[str] = set()
        ours = innermost = ""
        f: Any = frame
        while f is not None:
            code = f.f_code
            path = code.co_filename.replace(os.sep, "/")
            label = f"{path.rsplit('/', 1)[-1]}:{code.co_name}"
            if not innermost:
                innermost = label
            if "/autoremat/" in path or "/optuna/" in path:
                if not ours and "/autoremat/" in path:
                    ours = label
                if label not in seen:
                    seen.add(label)
                    inclusive[label] = inclusive.get(label, 0) + 1
            f = f.f_back
        inner[innermost] = inner.get(innermost, 0) + 1
        label = f"{ours} > {innermost}"
        now = time.time()
        if spans and spans[-1][2] == label:
            spans[-1][1] = now
        else:
            spans.append([now, now, label])
    top = sorted(inclusive.items(), key=lambda kv: -kv[1])[:60]
    _emit("profile", interval=interval, samples=n,
          inclusive=[[k, round(v * interval, 2)] for k, v in top],
          inner=[[k, round(v * interval, 2)] for k, v in
                 sorted(inner.items(), key=lambda kv: -kv[1])[:30]],
          spans=[[round(a, 3), round(b - a + interval, 3), lab] for a, b, lab in spans
                 if b - a + interval >= 0.05])


def _watch_cache_path() -> None:
    """Time-stamp the steps of JAX's persistent-cache path (a study's instrument, not the
    library's: JAX's private modules, wrapped where present): the key (the program
    canonicalized and hashed, before every compile), the entry's write (the executable
    serialized, compressed and written, after every compile) and its compression and file
    write alone, and a read."""
    try:
        from jax._src import compilation_cache as cc
        from jax._src import lru_cache
    except ImportError:
        return

    def wrap(owner: Any, name: str, event: str, size: Any = None) -> None:
        real = getattr(owner, name, None)
        if real is None:
            return

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.time()
            out = real(*args, **kwargs)
            fields = {"bytes": size(args, out)} if size is not None else {}
            _emit(event, start=start, seconds=time.time() - start,
                  thread=threading.current_thread().name, **fields)
            return out
        setattr(owner, name, wrapper)

    wrap(cc, "get_cache_key", "cache_key")
    wrap(cc, "put_executable_and_time", "cache_put")
    wrap(cc, "get_executable_and_time", "cache_get")
    wrap(cc, "compress_executable", "cache_compress",
         lambda args, out: [len(args[0]), len(out)])
    wrap(lru_cache.LRUCache, "put", "cache_file_write")


def _heartbeat(interval: float = 0.001, stall: float = 0.02) -> None:
    """How long a thread waits to run again: a sleep of ``interval`` that comes back over
    ``stall`` late means the GIL was held that long (by a C call that keeps it, or by
    other threads' Python); each such stall is recorded as a span."""
    spans: list[list[float]] = []
    last_emit = time.time()
    while True:
        before = time.time()
        time.sleep(interval)
        late = time.time() - before - interval
        if late > stall:
            spans.append([round(before, 3), round(late, 3)])
        if time.time() - last_emit > 2.0 and spans:
            _emit("stalls", spans=[[round(a, 3), b] for a, b in spans])
            spans = []
            last_emit = time.time()


def child(argv: list[str]) -> int:
    """Run ``autoremat`` with ``argv``, time-stamping what the parent reads (module doc)."""
    _emit("start")
    sampling = threading.Event()
    sampler = None
    if os.environ.get(SAMPLE_ENV):
        sampler = threading.Thread(target=_sample_main, args=(0.01, sampling), daemon=True,
                                   name="tune_time-sampler")
        sampler.start()
    import autoremat._measure.measure as measure_module
    import autoremat._measure.timing as timing_module
    import autoremat._search.planning.compile_pool as pool_module
    import autoremat._search.probes.guard as guard_module
    import autoremat._search.tune as tune_module
    import autoremat._search.worker as worker_module
    from autoremat import cli
    from autoremat._cli import tune_command

    if os.environ.get(SWITCH_ENV):  # Python's switch interval, for an A/B of it
        sys.setswitchinterval(float(os.environ[SWITCH_ENV]))
    real_compile = measure_module.compile_step

    def compile_step(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        compiled = real_compile(*args, **kwargs)
        m = compiled.measurement
        _emit("compile", start=start, seconds=time.time() - start, status=m.status,
              oom=m.reason.startswith("out of memory at compile"), reason=m.reason[:200],
              thread=threading.current_thread().name, label=m.schedule_key[:120],
              own_seconds=m.compile_seconds)  # lowering and XLA, not the wait for a timing
        return compiled

    real_timing = timing_module._Timing.run

    def timing(self: Any, **kwargs: Any) -> Any:
        start = time.time()
        m = real_timing(self, **kwargs)
        _emit("timing", start=start, seconds=time.time() - start, label=self.label[:120],
              runs=len(m.step_samples or ()), cut=m.cut_seconds is not None,
              samples_ms=[round(x * 1e3, 2) for x in m.step_samples or ()],
              thread=threading.current_thread().name)
        return m

    real_close = pool_module.CompilePool.close

    def close(self: Any, wait: bool = False) -> None:
        real_close(self, wait)
        _emit("pool", threads=self.threads, submitted=self.submitted, taken=self.taken,
              released=self.released, cancelled=self.cancelled)

    real_probe = guard_module.ProbeGuard._probe

    def probe(self: Any, check: Any) -> Any:
        start = time.time()
        verdict = real_probe(self, check)
        _emit("probe", start=start, seconds=time.time() - start,
              schedule=check.schedule.describe(), verdict=verdict.text()[:300])
        return verdict

    real_callback = worker_module.Worker.callback

    def callback(self: Any, study: Any, trial: Any) -> None:
        from autoremat._search.study import MeasuredTrial

        done = MeasuredTrial.of(trial)
        m = done.measurement if done is not None else None
        _emit("trial", number=trial.number, state=trial.state.name,
              measured=done is not None,
              compile_failed=bool(trial.user_attrs.get("compile_failed")),
              describe=done.schedule.describe() if done is not None else "",
              status=m.status if m is not None else "", cut=bool(m is not None and m.cut),
              reason=(m.reason if m is not None else "")[:200])
        real_callback(self, study, trial)

    def timed(name: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.time()
            try:
                return real(*args, **kwargs)
            finally:
                _emit(name, start=start, seconds=time.time() - start)
        return wrapper

    real_problem_of = tune_command.problem_of

    def problem_of(settings: Any) -> Any:  # after the first line, as the CLI
        _emit("building")
        import jax
        import jax.monitoring

        _emit("jax_imported")

        def listen(event: str, duration_secs: float, **_: str | int) -> None:
            if event.endswith("backend_compile_duration"):
                _emit("xla_compile", seconds=duration_secs)

        jax.monitoring.register_event_duration_secs_listener(listen)
        if settings.problem is None:  # the seed's build starts the device itself,
            real_devices = jax.devices  # its arrays made meanwhile

            def devices(*args: Any, **kwargs: Any) -> Any:
                try:
                    return real_devices(*args, **kwargs)
                finally:
                    jax.devices = real_devices  # the first call only
                    _emit("backend")

            jax.devices = devices
        else:
            jax.devices()  # what the problem's arguments start anyway
            _emit("backend")
        return real_problem_of(settings)

    _watch_cache_path()
    threading.Thread(target=_heartbeat, daemon=True, name="tune_time-heartbeat").start()
    tune_command.problem_of = problem_of
    measure_module.compile_step = compile_step
    timing_module._Timing.run = timing  # type: ignore[method-assign]
    pool_module.CompilePool.close = close  # type: ignore[method-assign]
    guard_module.ProbeGuard._probe = probe  # type: ignore[method-assign]
    worker_module.Worker.callback = callback  # type: ignore[method-assign]
    tune_module.confirm = timed("confirm", tune_module.confirm)
    tune_module.prove_fit = timed("proof", tune_module.prove_fit)
    try:
        code = cli.main(argv)
    finally:
        if sampler is not None:
            sampling.set()
            sampler.join()
    import jax

    _emit("end", code=code, platform=jax.default_backend())
    return code


# -- the parent: run, read, break down ------------------------------------------------------
def run_case(case: str, small: bool, cwd: Path, timeout: float,
             sample: bool = False) -> dict[str, Any]:
    """One case as a fresh process; its lines and events, time-stamped from the launch."""
    argv, env_extra = case_args(case, small)
    env = {**os.environ, **env_extra, "PYTHONUNBUFFERED": "1"}
    if sample:
        env[SAMPLE_ENV] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    launched = time.time()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", "--",
                             *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[tuple[str, float, str]] = queue.Queue()

    def read(stream: Any, name: str) -> None:
        for line in stream:
            lines.put((name, time.time(), line.rstrip("\n")))

    readers = [threading.Thread(target=read, args=(s, n), daemon=True)
               for s, n in ((proc.stdout, "out"), (proc.stderr, "err"))]
    for r in readers:
        r.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = -9
    for r in readers:
        r.join(timeout=10)
    ended = time.time()
    events: list[dict[str, Any]] = []
    log: list[tuple[float, str, str]] = []
    while not lines.empty():
        name, t, line = lines.get()
        if name == "err" and TAG in line:  # XLA's own stderr may share the line
            head, *pieces = line.split(TAG)
            for piece in pieces:
                try:
                    events.append(json.loads(piece))
                except json.JSONDecodeError:  # cut by another writer: that event is lost
                    log.append((t - launched, name, TAG + piece))
            if head.strip():
                log.append((t - launched, name, head))
        else:
            log.append((t - launched, name, line))
    for e in events:
        for key in ("t", "start"):
            if key in e:
                e[key] -= launched
        for span in e.get("spans", ()):
            span[0] = round(span[0] - launched, 3)
    log.sort()
    return breakdown(case, argv, code, ended - launched, log, events)


def breakdown(case: str, argv: list[str], code: int, total: float,
              log: list[tuple[float, str, str]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The phases of one run (module doc) from its time-stamped lines and events."""
    def first(prefix: str) -> float | None:
        return next((t for t, name, line in log if name == "out" and line.startswith(prefix)),
                    None)

    of = {kind: [e for e in events if e["event"] == kind]
          for kind in ("compile", "probe", "trial", "confirm", "proof", "start", "end",
                       "jax_imported", "backend", "xla_compile", "timing", "pool",
                       "profile", "cache_key", "cache_put", "cache_get", "cache_compress",
                       "cache_file_write", "stalls")}
    trials = [e for e in of["trial"] if e["measured"]]
    failed = [e for e in trials if e["compile_failed"]]
    combined = [e for e in failed if placements(e["describe"]) >= 2]
    problem_t = first("problem:")
    trial_ts = [e["t"] for e in of["trial"]]
    wrote = first("wrote ")
    result = {
        "case": case, "name": NAMES[case],
        "command": "autoremat " + " ".join(argv).replace(f"{ROOT}{os.sep}", ""),
        "exit": code, "total_s": total,
        "written_s": wrote,
        "first_line_s": log[0][0] if log else None,
        "python_start_s": of["start"][0]["t"] if of["start"] else None,
        "startup_s": problem_t,
        "jax_imported_s": of["jax_imported"][0]["t"] if of["jax_imported"] else None,
        "backend_s": of["backend"][0]["t"] if of["backend"] else None,
        "xla_compiles_before_problem": [e["seconds"] for e in of["xla_compile"]
                                        if problem_t is not None and e["t"] <= problem_t],
        "xla_compiles": len(of["xla_compile"]),
        "xla_compile_s": sum(e["seconds"] for e in of["xla_compile"]),
        "probes": len(of["probe"]), "probe_s": sum(e["seconds"] for e in of["probe"]),
        "probe_verdicts": [f"{e['schedule']}: {e['verdict']}" for e in of["probe"]],
        "trials": len(trials) - len(failed), "cut": sum(e["cut"] for e in trials),
        "search_s": (max(trial_ts) - problem_t) if trial_ts and problem_t is not None else None,
        "compiles": len(of["compile"]), "compile_s": sum(e["seconds"] for e in of["compile"]),
        "oom_compiles": sum(e["oom"] for e in of["compile"]),
        "lost_to_compile_failures": len(failed), "lost_combined_offload": len(combined),
        "failed_trials": [f"#{e['number']} {e['describe']}: {e['reason']}" for e in failed],
        "confirm_s": sum(e["seconds"] for e in of["confirm"]),
        "proof_s": sum(e["seconds"] for e in of["proof"]),
        "pick": next((line for _, name, line in log if name == "out"
                      and line.strip().startswith("best (trial")), None),
        "unroll": next((int(m.group(1)) for _, name, line in log if name == "out"
                        and line.strip().startswith("best (trial")
                        and (m := re.search(r"unroll=(\d+)", line))), None),
        "study_line": next((line for _, name, line in log if name == "out"
                            and line.startswith("study: ")), None),
        "target_s": TARGET_S[case],
        "platform": of["end"][0].get("platform") if of["end"] else None,
        "tail": [f"{t:7.1f}s {name} {line}" for t, name, line in log[-8:]],
        **overlap(of["compile"], of["timing"]),
        **main_thread(events),
        "pool": of["pool"][-1] if of["pool"] else None,
        "cache_path": {kind: [len(of[kind]), round(sum(e["seconds"] for e in of[kind]), 2)]
                       for kind in ("cache_key", "cache_put", "cache_compress",
                                    "cache_file_write", "cache_get")},
        "cache_bytes": [sum(e["bytes"][i] for e in of["cache_compress"]) for i in (0, 1)],
        "stalls": _stalls([s for e in of["stalls"] for s in e["spans"]]),
        "profile": of["profile"][-1] if of["profile"] else None,
        "timeline": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in e.items()}
                     for e in events if e["event"] in ("compile", "timing", "probe", "trial",
                                                       "proof", "confirm", "cache_key",
                                                       "cache_put", "cache_get")],
    }
    if code != 0:
        result["stderr"] = [line for _, name, line in log if name == "err"][-15:]
    return result


def _stalls(spans: list[list[float]]) -> dict[str, float]:
    """The heartbeat's stalls (``_heartbeat``): how many, their seconds, the longest, and
    how many were over 100 ms."""
    lates = [late for _, late in spans]
    return {"n": len(lates), "s": round(sum(lates), 2), "max": max(lates, default=0.0),
            "over_100ms": sum(late > 0.1 for late in lates)}


def placements(describe: str) -> int:
    """The offload placements a schedule's description names: carries offloaded at a
    level (``offload(...)``) and offloaded dots (``offload_dot...``)."""
    return describe.count("offload(") + describe.count("offload_dot")


def overlap(compiles: list[dict[str, Any]], timings: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the compiles ran and how much of them ran beside a timing (the compile
    threads' point): seconds on the main thread and on threads, the device's timing
    seconds and runs, and the compile seconds that overlapped a timing."""
    spans = [(e["start"], e["start"] + e["seconds"]) for e in timings]

    def beside(e: dict[str, Any]) -> float:
        a, b = e["start"], e["start"] + e["seconds"]
        return sum(max(0.0, min(b, d) - max(a, c)) for c, d in spans)

    on_main = [e for e in compiles if e.get("thread", "MainThread") == "MainThread"]
    return {
        "timing_s": sum(e["seconds"] for e in timings), "timings": len(timings),
        "timed_runs": sum(e["runs"] for e in timings),
        "compile_main_s": sum(e["seconds"] for e in on_main),
        "compile_threads_s": sum(e["seconds"] for e in compiles) - sum(
            e["seconds"] for e in on_main),
        "compile_own_s": sum(e.get("own_seconds") or 0.0 for e in compiles),
        "compile_beside_timing_s": sum(beside(e) for e in compiles),
    }


def main_thread(events: list[dict[str, Any]]) -> dict[str, float]:
    """Where a tune's seconds went around the device, summed over the run (the figures of
    ``studies/results/tune_time_v5e_workers.md``): *gaps*, each timing's end to its
    trial's record; *waits*, each record to the next timing's start; *before_timing*, of
    the waits, from the later of the record and the timed schedule's compile to the
    timing (the main thread's storage and planning, its wait for the lock); *sized_late*,
    each compile's cache entry written (its XLA work done) to its result handed back."""
    of = {k: [e for e in events if e["event"] == k]
          for k in ("timing", "trial", "compile", "cache_put")}
    timings, records = of["timing"], [e["t"] for e in of["trial"]]
    gaps = sum(next((r for r in records if r >= t["t"]), t["t"]) - t["t"] for t in timings)
    waits = sum(next((t["start"] for t in timings if t["start"] >= r), r) - r
                for r in records)
    before = 0.0
    for t in timings:
        ready = [r for r in records if r <= t["start"]] + [
            c["t"] for c in of["compile"]
            if c.get("label") == t.get("label") and c["t"] <= t["start"] + 0.05]
        before += t["start"] - max(ready, default=t["start"])
    late = 0.0
    for c in of["compile"]:
        puts = [p["t"] for p in of["cache_put"]
                if p.get("thread") == c.get("thread") and c["start"] <= p["t"] <= c["t"]]
        late += c["t"] - puts[-1] if puts else 0.0
    return {"gaps_s": gaps, "waits_s": waits, "before_timing_s": before, "sized_late_s": late}


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def markdown(results: list[dict[str, Any]], header: list[str]) -> str:
    rows = ["| case | first line | `problem:` | probes | trials (cut) | search | OOM compiles "
            "| lost to failed compiles (combined offload) | confirm | proof | written | total "
            "| target |", "|---|" + "---|" * 12]
    for r in results:
        target = r["target_s"]
        met = "-" if target is None else (
            f"<= {target:.0f} s: {'met' if (r['written_s'] or 1e9) <= target else 'NOT met'}")
        if r["case"] == "a":
            met += f"; <= 2 OOM: {'met' if r['oom_compiles'] <= 2 else 'NOT met'}"
        if r["case"] == "c":
            met = f"0 combined lost: {'met' if r['lost_combined_offload'] == 0 else 'NOT met'}"
        rows.append(
            f"| {r['case']}. {r['name']} | {_s(r['first_line_s'])} | {_s(r['startup_s'])} "
            f"| {r['probes']} in {_s(r['probe_s'])} | {r['trials']} ({r['cut']}) "
            f"| {_s(r['search_s'])} | {r['oom_compiles']} of {r['compiles']} "
            f"| {r['lost_to_compile_failures']} ({r['lost_combined_offload']}) "
            f"| {_s(r['confirm_s'])} | {_s(r['proof_s'])} | {_s(r['written_s'])} "
            f"| {_s(r['total_s'])} | {met} |")
    out = ["# studies/tune_time.py", "", *header, "", *rows, ""]
    for r in results:
        out += [f"## {r['case']}. {r['name']}", "", f"`{r['command']}` (exit {r['exit']})", ""]
        before = r["xla_compiles_before_problem"]
        out.append(f"- start-up: first line {_s(r['first_line_s'])}, jax imported "
                   f"{_s(r['jax_imported_s'])}, device up {_s(r['backend_s'])}, `problem:` "
                   f"{_s(r['startup_s'])} ({len(before)} XLA compiles before it, "
                   f"{sum(before):.1f} s; {r['xla_compiles']} in the run, "
                   f"{r['xla_compile_s']:.1f} s)")
        out.append(f"- device: {r['timings']} timings, {r['timed_runs']} runs, "
                   f"{r['timing_s']:.1f} s; compiles (wall, lock waits included): main thread "
                   f"{r['compile_main_s']:.1f} s, threads {r['compile_threads_s']:.1f} s "
                   f"(their own: {r['compile_own_s']:.1f} s), beside a timing "
                   f"{r['compile_beside_timing_s']:.1f} s; compiles ahead: "
                   + (", ".join(f"{k} {v}" for k, v in r["pool"].items() if k not in (
                       "event", "t")) if r["pool"] else "none"))
        if "gaps_s" in r:
            out.append(f"- around the device (`main_thread`): gaps {_s(r['gaps_s'])}, waits "
                       f"{_s(r['waits_s'])} (before a timing {_s(r['before_timing_s'])}), "
                       f"compiles sized late {_s(r['sized_late_s'])}")
        if r.get("cache_path"):
            cp, (raw, stored) = r["cache_path"], r["cache_bytes"]
            out.append("- JAX's cache path (count, seconds summed over threads): " + ", ".join(
                f"{k.removeprefix('cache_')} {n} in {sec:.1f} s" for k, (n, sec) in cp.items())
                + f"; executables {raw / 1e6:.1f} MB, stored {stored / 1e6:.1f} MB")
        if r.get("stalls"):
            st = r["stalls"]
            out.append(f"- a 1-ms heartbeat thread's stalls over 20 ms: {st['n']}, "
                       f"{st['s']:.1f} s, longest {st['max'] * 1e3:.0f} ms, "
                       f"{st['over_100ms']} over 100 ms")
        out += [f"- {x}" for x in ([r["study_line"]] if r["study_line"] else [])]
        out += [f"- pick: {r['pick'].strip()}" if r["pick"] else "- pick: none"]
        out += [f"- unroll: {r['unroll']}"] if r.get("unroll") is not None else []
        out += [f"- probe: {v}" for v in r["probe_verdicts"]]
        if r.get("profile"):
            prof = r["profile"]
            out.append(f"- main thread, sampled every {prof['interval'] * 1e3:.0f} ms "
                       f"({prof['samples']} samples), seconds on the stack: " + "; ".join(
                           f"{k} {v:.1f}" for k, v in prof["inclusive"][:25]))
        out += [f"- lost: {v}" for v in r["failed_trials"]]
        out += ["", "```text", *r["tail"], *r.get("stderr", []), "```", ""]
    return "\n".join(out)


def _platform() -> str:
    """The default backend, asked of a child process (the parent never holds the chip)."""
    proc = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"],
                          capture_output=True, text=True, timeout=300, check=False)
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="the Markdown report (and .json beside it)")
    p.add_argument("--cases", default=",".join(CASES), help="e.g. a,b (default: all)")
    p.add_argument("--small", action="store_true", help="tiny sizes: the CPU plumbing test")
    p.add_argument("--allow-cpu", action="store_true", help="run off a TPU too")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per case")
    p.add_argument("--fresh", action="store_true",
                   help="each run in its own scratch folder (fresh study and caches)")
    p.add_argument("--sample", action="store_true",
                   help="sample each case's main thread every 10 ms (where its time goes)")
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    if any(c not in CASES for c in cases):
        p.error(f"--cases: expected some of {','.join(CASES)}, got {args.cases!r}")
    platform = "not checked (--small)" if args.small else _platform()
    if platform != "tpu" and not (args.allow_cpu or args.small):
        print(f"no TPU here (jax's default backend: {platform}); nothing run "
              "(--allow-cpu or --small to run anyway)")
        return 0
    results: list[dict[str, Any]] = []

    def header() -> list[str]:
        sizes = "--small sizes (not measurements)" if args.small else "issue 47 sizes"
        ran = next((r["platform"] for r in results if r.get("platform")), platform)
        where = ("each run its own scratch folder (fresh study, probe and compile caches)"
                 if args.fresh else "one scratch folder (probe and compile caches empty at "
                 "the start)")
        return [f"Platform: {ran}; {sizes}; {when} UTC; each case a fresh process, {where}."]

    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="tune_time-") as scratch:
        for i, case in enumerate(cases):
            folder = Path(scratch) / (f"run{i}" if args.fresh else "shared")
            folder.mkdir(exist_ok=True)
            r = run_case(case, args.small, folder, args.timeout, args.sample)
            results.append(r)
            print(f"{case}. {r['name']}: exit {r['exit']}, problem: at {_s(r['startup_s'])}, "
                  f"{r['probes']} probes {_s(r['probe_s'])}, {r['trials']} trials, "
                  f"{r['oom_compiles']} OOM compiles, {r['lost_to_compile_failures']} lost "
                  f"({r['lost_combined_offload']} combined offload), written at "
                  f"{_s(r['written_s'])}, total {_s(r['total_s'])}", flush=True)
            if args.out is not None:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(markdown(results, header()))
                args.out.with_suffix(".json").write_text(
                    json.dumps({"header": header(), "cases": results}, indent=1) + "\n")
    if args.out is None:
        print(markdown(results, header()))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]))
    sys.exit(main())
