"""autoremat: the fastest remat schedule for a scan that fits a memory budget.

The pipeline, one package per stage (``tests/test_imports.py`` fails when a module is
missing here)::

    _schedules/   schedule (YAML): what a remat schedule is
        __init__        the registry of kinds, their constructors (nested, binomial, groups,
                        root, plain); load/parse/dump/save the YAML form
        base            Schedule (knows no kind): fields, key, to_data; Features; Param
        policy          checkpoint policies by name, Level, int checks
        lengths         chunk lengths: divisors, snap, the depth-th root split of T
        platforms       platform names (GPU, CUDA, offload), read by the kinds and the search
        safe_yaml       reading YAML safely: one document, plain data, bounded
        nested          the nested kind (Chen et al. 2016); nested_scan: its builder,
                        nested_space: its search space (depths, policy choices, seeds)
        groups          the groups kind: consecutive groups of steps, a policy per group
        binomial        the binomial kind (Revolve); binomial_scan: its builder,
                        binomial_backward: its backward pass (loops or static)
        revolve         Revolve's tables: where to snapshot, what to redo
        frameworks      a schedule as MaxText's remat_policy: custom keys and Flax's
                        remat policy, or why it has no such form
        maxtext_names   MaxText's remat keys, tags and presets, pinned from its source
                        (maxtext_names.json, studies/maxtext_inventory.py)
    _scan/        -> builder: run a scan under a schedule
        scan            autoremat.scan: lax.scan semantics, dispatch to the kind's run()
        as_tuned        does a scan run the program its schedule was tuned with (stacked
                        outputs, compiler options)? refused or warned at trace time
        records         what each outermost scan stacks and carries (read by measure)
        step_trace      the step's one cached trace; lax.scan's carry checks
        checkpoint_names  the step's checkpoint_name tags (bytes, FLOPs); a policy naming
                        a tag the step lacks is refused
        fuse            fuse_head / fuse_loss: the readout inside the step
        remat_scans     any function's long scans under a schedule; rewrite: the jaxpr pass
        fuse_readout    remat_scans moves the readout and loss after a scan into its step:
                        fuse_rules (per primitive), fuse_calls (jit, custom_jvp), fuse_inline
    _flax/        -> builder, for Flax: linen_scan, linen_rnn, nnx_scan, nnx_remat_scans, rnn
    _measure/     -> measure: compiled memory and step time of any Problem
        problem         Problem: a train step built for a schedule; find a user's by name
        from_loss       a Problem from an unmodified loss, params, batch and optimizer
        measure         compile -> memory_analysis; timing: run -> time, until the runs are
                        steady; measurement: the record, of figures: its records (sizes,
                        device peaks, timing, where, failure, proof), flat in a study
        failure         a failure as data: where (build, compile, run), out of memory, the size
        breakdown       where the memory goes (memory_analysis' parts) and the floor no
                        schedule removes, as records (Breakdown, Floor; worded in _cli)
        device          the device's facts; mesh: many devices, per-device layout; peers:
                        the other processes of a lockstep tune, figures combined over them
        allocator       the one reader of a device's allocator (memory_stats)
        device_memory   a step's own need, read where each platform books it
        within          a run within a budget (the proof of fit); the least that suffices
                        (bisection): the truth device_memory is checked against
        stale           is a saved schedule still the one for this problem?
        compile_cache   compiles paid once: JAX's persistent cache in a study's folder,
                        its hits counted
        parity          does it compile to the total its tune measured? (show --problem)
    _models/      the built-in problems, measured and searched like a user's; their
                  registry (MODELS: builder, settings, the fixes for a floor)
        seed_lstm       the seed LSTM (the original report's step); its mesh rule
        layer_stack     the layer stack: a decoder whose layers are one scan
        maxtext         a MaxText model (config + overrides) as a Problem: MaxText's own
                        train step under each remat knob setting (autoremat[maxtext])
    _search/      -> search (Optuna) -> Pareto front -> schedule
        space           what the search can choose: parameters -> Schedule; the seeds
        planning/       which schedule to time next: planner (composes the rest); pool:
                        the candidates; standings: what was timed, the best, the
                        patience; judge: the models' view of a candidate (predict: step
                        time; memory_model: bytes before compiling; untimed: pure rules);
                        screening: the one rule of what to do with a candidate; clock: the
                        time left, a compile's cost by its unroll; ahead: compiles ahead on compile_pool's
                        threads; offload_twins: an offload only where its twin does not
                        fit; presets: a layer stack's presets first (layer_costs: what
                        its schedules keep, what each tag costs); candidates: the pool's
                        entries; short_scans: every structure of a short heavy scan
        arguments       one set of arguments for compiled steps alike
        short_runs      long T: time on short runs, predict full length; confirm: then check
        probes/         risky choices (offload) checked on the problem before a study
                        offers them: probe (the checks, typed verdicts); guard: each when
                        the planner first proposes it, and the combinations it proposes;
                        cache: the verdicts beside the storage
        named_policies  policies over the problem's own checkpoint_name tags, per level
        bound           what scheduling can save at most: the step as written and at its
                        least memory, compiled before the search
        tune            the search: open the study, run a worker, confirm, prove, answer;
                        lockstep: every process of a multi-controller job, process 0 deciding;
                        tune_log: each trial and the answer on the "autoremat" logger, and
                        the opt-in progress bar
        proof           the proof of fit: the pick runs with only the budget on the device
        reports         what tune reports as records: its progress (TuneEvent) and the
                        proof's outcome (ProofOfFit), worded by _cli
        worker          one worker's loop: plan, claim (no schedule twice), measure, count;
                        retime: before it stops, the leader and its challengers run in turn
        resume          open a study or resume one; storage: storages, retries, the lock,
                        Optuna's log level; the one user of Optuna's internals
        trials          a measured trial, and the answer among them: the fastest that
                        fits, ties within noise to the least memory; why fused or unfused
        study           reading a study: measured trials, the answer, TuneResult;
                        last_study: the last study tuned from a folder (runs/)
        attrs           the names written into a study: trial attrs, study attrs
        trial_params    each trial's schedule as Optuna params (dashboards, importance)
        pareto          the front as data: non-dominated trials, the plot's groups, export
        export_forms    export in a framework: a trial's form, or the nearest measured one
        maxtext_knobs   tune a MaxText model by its own remat knobs: each a MaxText config,
                        compiled and run as MaxText's train step; the fastest that fits
    _cli/         the command's settings and printing; breakdown_text: the breakdown and the
                  floor in words; front_text: the front's table and JSON; plot: the front
                  drawn (autoremat.plot_front); show_text: what show prints of a schedule;
                  problems: the problem a command runs on, a built-in one from the registry;
                  tune_command: the tune command (TuneSettings read, the answer printed);
                  export_command: the export command,
                  export_text: its MaxText and Flax text; show_command: the show command;
                  pareto_command: the pareto command; maxtext_command: the maxtext
                  command (a MaxText model tuned by its knobs); exits: the exit codes' table, how an
                  error or a crash is reported; distributed: tune --coordinator, joining a
                  multi-controller job (cli.py is the parser)

    shared:  _errors (every error kind), _atomic (atomic writes), _units (bytes, durations),
             _jax (every read of JAX's and Flax's internals: jaxpr parameters, tracer
             classes, private modules; one module, tested on each JAX line CI runs)
    public:  __init__, cli, linen, nnx, bounds (Revolve's optimum; any schedule's cost)

Importing ``autoremat`` does not import jax: ``scan``, ``linen`` and ``nnx`` load it
when first used, so ``autoremat --help`` is instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autoremat import bounds as bounds
from autoremat._errors import AutorematError as AutorematError
from autoremat._errors import BudgetError as BudgetError
from autoremat._errors import ProblemError as ProblemError
from autoremat._errors import RematScansWarning as RematScansWarning
from autoremat._errors import ScheduleError as ScheduleError
from autoremat._errors import TuneError as TuneError
from autoremat._measure.measure import measure as measure
from autoremat._measure.measure import measure_step as measure_step
from autoremat._measure.measurement import Measurement as Measurement
from autoremat._measure.problem import Problem as Problem
from autoremat._measure.stale import StaleScheduleWarning as StaleScheduleWarning
from autoremat._measure.stale import load_schedule as load_schedule
from autoremat._models.layer_stack import layer_stack as layer_stack
from autoremat._models.seed_lstm import seed_lstm as seed_lstm
from autoremat._scan.as_tuned import ScheduleMismatchError as ScheduleMismatchError
from autoremat._scan.as_tuned import ScheduleMismatchWarning as ScheduleMismatchWarning
from autoremat._scan.fuse import fuse_head as fuse_head
from autoremat._scan.fuse import fuse_loss as fuse_loss
from autoremat._schedules import binomial as binomial
from autoremat._schedules import groups as groups
from autoremat._schedules import nested as nested
from autoremat._schedules import plain as plain
from autoremat._schedules import root as root
from autoremat._schedules import save_schedule as save_schedule
from autoremat._schedules.base import Schedule as Schedule
from autoremat._schedules.frameworks import FrameworkPolicy as FrameworkPolicy
from autoremat._schedules.frameworks import framework_policy as framework_policy
from autoremat._schedules.policy import Level as Level
from autoremat._schedules.policy import Policy as Policy
from autoremat._search.last_study import last_study as last_study
from autoremat._search.pareto import FrontPoint as FrontPoint
from autoremat._search.pareto import pareto_front as pareto_front
from autoremat._search.study import MeasuredTrial as MeasuredTrial
from autoremat._search.study import TuneResult as TuneResult
from autoremat._search.study import load_study as load_study
from autoremat._search.tune import tune as tune
from autoremat._units import parse_bytes as parse_bytes

if TYPE_CHECKING:  # at run time these load lazily (jax; the command line's), see __getattr__
    from autoremat import linen as linen
    from autoremat import nnx as nnx
    from autoremat._cli.plot import plot_study as plot_front
    from autoremat._scan.remat_scans import remat_scans as remat_scans
    from autoremat._scan.scan import scan as scan


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("autoremat")
    except PackageNotFoundError:  # a source tree on the path, not installed
        return "unknown (not installed)"


#: The installed distribution's version (``pyproject.toml``); ``autoremat --version``.
__version__: str = _version()

__all__ = [
    "AutorematError",
    "BudgetError",
    "FrameworkPolicy",
    "FrontPoint",
    "Level",
    "MeasuredTrial",
    "Measurement",
    "Policy",
    "Problem",
    "ProblemError",
    "RematScansWarning",
    "Schedule",
    "ScheduleError",
    "ScheduleMismatchError",
    "ScheduleMismatchWarning",
    "StaleScheduleWarning",
    "TuneError",
    "TuneResult",
    "binomial",
    "bounds",
    "framework_policy",
    "fuse_head",
    "fuse_loss",
    "groups",
    "last_study",
    "layer_stack",
    "linen",
    "load_schedule",
    "load_study",
    "measure",
    "measure_step",
    "nested",
    "nnx",
    "pareto_front",
    "parse_bytes",
    "plain",
    "plot_front",
    "remat_scans",
    "root",
    "save_schedule",
    "scan",
    "seed_lstm",
    "tune",
]


def __getattr__(name: str) -> Any:
    # Lazy: these import jax (and flax), which --help must not pay for; plot_front is the
    # command line's (``autoremat._cli.plot``), loaded when first used.
    if name == "scan":
        from autoremat._scan.scan import scan

        return scan
    if name == "remat_scans":
        from autoremat._scan.remat_scans import remat_scans

        return remat_scans
    if name == "linen":
        import autoremat.linen as linen

        return linen
    if name == "nnx":
        import autoremat.nnx as nnx

        return nnx
    if name == "plot_front":  # the command line's drawing: the library does not load _cli
        from autoremat._cli.plot import plot_study

        return plot_study
    raise AttributeError(f"module 'autoremat' has no attribute {name!r}")
