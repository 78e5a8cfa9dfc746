"""autoremat: the fastest remat schedule for a scan that fits a memory budget.

The pipeline, one module per box::

    schedule (YAML)  _schedule.py   Schedule (abstract): from_data/to_data, load/save, key
                     _kinds.py      the table of kinds -> _nested.py, _binomial.py (one type each)
                     _policy.py     checkpoint policies by name, Level; _yaml.py: safe YAML
      -> builder     _scan.py       scan(): lax.scan semantics, dispatches to the kind's run()
                     _step_trace.py the step's one (cached) trace: lax.scan's carry checks
                     _nested_scan.py / _binomial_scan.py (+ _revolve.py's plan): the builders
                     linen.py, nnx.py (_nnx_scan.py, _rnn.py): nn.scan / nnx.scan / RNN drop-ins
                     _fuse.py       fuse_head/fuse_loss: the readout inside the step
                     bounds.py      Revolve's optimum; any schedule's recompute and carries
      -> measure     _measure.py    measure_step: compile -> memory_analysis -> run -> time
                     _breakdown.py  where the memory goes; the floor no schedule removes
                     _problem.py    Problem (a train step built for a schedule), the seed LSTM
                     _mesh.py       many devices: mesh specs, per-device layout, the seed's sharding
      -> search      _space.py      Optuna trial -> Schedule (each kind's suggest/seed_params)
                     _predict.py    the cost model, from each kind's features()
                     _plan.py       Planner: which schedule to compile and time next
                     _fidelity.py   long T: time on a short run, predict the full-length time
                     _tune.py       the search loop: budget constraint, dedupe, workers
                     _confirm.py    time the pick at full length before answering (long T)
                     _resume.py     open a study, or resume one made for the same run
                     _storage.py    Optuna storages, stale-trial retry, the workers' lock
      -> study       _study.py      reading a study: measured trials, the answer, TuneResult
      -> front       _pareto.py     non-dominated trials, table, plot, export, show
      -> schedule    (YAML again, with what was measured in ``meta``)

    errors: _errors.py (AutorematError and its kinds); the command: cli.py, _cli_settings.py,
    _cli_print.py
    JAX and Flax private APIs, in one place: _jax_internals.py

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
from autoremat._fuse import fuse_head as fuse_head
from autoremat._fuse import fuse_loss as fuse_loss
from autoremat._kinds import save_schedule as save_schedule
from autoremat._measure import measure as measure
from autoremat._measure import measure_step as measure_step
from autoremat._measurement import Measurement as Measurement
from autoremat._pareto import FrontPoint as FrontPoint
from autoremat._pareto import pareto_front as pareto_front
from autoremat._policy import Level as Level
from autoremat._policy import Policy as Policy
from autoremat._problem import Problem as Problem
from autoremat._problem import seed_lstm as seed_lstm
from autoremat._schedule import Schedule as Schedule
from autoremat._stale import StaleScheduleWarning as StaleScheduleWarning
from autoremat._stale import load_schedule as load_schedule
from autoremat._study import MeasuredTrial as MeasuredTrial
from autoremat._study import TuneResult as TuneResult
from autoremat._tune import tune as tune
from autoremat._units import parse_bytes as parse_bytes

if TYPE_CHECKING:  # at run time both load lazily (they import jax), see __getattr__
    from autoremat import linen as linen
    from autoremat import nnx as nnx
    from autoremat._remat_scans import remat_scans as remat_scans
    from autoremat._scan import scan as scan

__all__ = [
    "AutorematError",
    "BudgetError",
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
    "StaleScheduleWarning",
    "TuneError",
    "TuneResult",
    "bounds",
    "fuse_head",
    "fuse_loss",
    "linen",
    "load_schedule",
    "measure",
    "measure_step",
    "nnx",
    "pareto_front",
    "parse_bytes",
    "remat_scans",
    "save_schedule",
    "scan",
    "seed_lstm",
    "tune",
]


def __getattr__(name: str) -> Any:
    # Lazy: these import jax (and flax), which --help must not pay for.
    if name == "scan":
        from autoremat._scan import scan

        return scan
    if name == "remat_scans":
        from autoremat._remat_scans import remat_scans

        return remat_scans
    if name == "linen":
        import autoremat.linen as linen

        return linen
    if name == "nnx":
        import autoremat.nnx as nnx

        return nnx
    raise AttributeError(f"module 'autoremat' has no attribute {name!r}")
