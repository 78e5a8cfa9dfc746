"""What the tuner measures: a user's training step, built for a schedule.

A ``Problem`` is a name, the sequence length it runs at, and a ``build``
function: ``build(schedule) -> (step, args)`` where ``step`` is the whole
un-jitted training step (forward, loss, gradients, optimizer update) that
runs its scan with ``autoremat.scan`` / ``autoremat.linen.scan`` under that
schedule, and ``args`` are example arguments for it.

The built-in problems (the seed LSTM, the layer stack) are problems like any other
(``autoremat._models``); ``resolve_problem`` finds a user's by name.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoremat._errors import ProblemError
from autoremat._schedules.base import Schedule

if TYPE_CHECKING:  # imported lazily at run time: importing autoremat must not import jax
    import optax

Step = Callable[..., Any]


@dataclass(frozen=True)
class Problem:
    """A training step to tune.

    Attributes:
      name: a short name, recorded in schedules and studies.
      seq_len: the sequence length ``T`` the step scans.
      build: ``build(schedule) -> (step, args)``; ``step(*args)`` is the
        un-jitted training step using that schedule.
      arg_names: optional names of ``args`` (e.g. ``("params", "opt_state",
        "x", "y")``), used by the memory breakdown; default ``arg0, arg1, ...``.
      at_length: optional ``at_length(n) -> Problem``: the same step on the
        first ``n < seq_len`` steps of the data. With it the tuner times long
        problems on short runs and predicts the full step time from them; without it
        every timing runs at ``seq_len``.
      small: optional ``small() -> Problem``: the same step, the same ``seq_len``, at
        a size where even the plain scan compiles and runs in moments (fewer
        tokens, a narrower model). The tuner checks risky choices (offload) on it before
        offering them; without it the probe cuts the problem with
        ``at_length``, or checks it as it is -- where the plain scan may not fit.
      fuse_choice: fusing the readout and loss into the scanned step is a choice of
        the search (``Schedule.fuse``): ``build`` applies the schedule's, and the
        tuner offers fused and unfused schedules (``Problem.from_loss``, ``linen``,
        ``nnx``, ``seed_lstm`` with ``fuse=None`` / ``fused_readout=None``).
      notes: what building the problem noticed in the user's step that changes what a
        schedule does -- a remat inside the scanned block (``Problem.from_loss``,
        ``linen.problem``, ``nnx.problem`` with ``min_length``) -- one sentence each, for
        the command line to print under the problem's name.
    """

    name: str
    seq_len: int
    build: Callable[[Schedule], tuple[Step, tuple[Any, ...]]]
    arg_names: tuple[str, ...] | None = None
    at_length: Callable[[int], Problem] | None = None
    fuse_choice: bool = False
    small: Callable[[], Problem] | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ProblemError(f"seq_len: expected a positive int, got {self.seq_len!r}")
        if not callable(self.build):
            raise ProblemError("build: expected a callable build(schedule) -> (step, args)")
        if self.at_length is not None and not callable(self.at_length):
            raise ProblemError("at_length: expected None or a callable at_length(n) -> Problem")
        if self.small is not None and not callable(self.small):
            raise ProblemError("small: expected None or a callable small() -> Problem")
        if not isinstance(self.notes, tuple) or not all(isinstance(n, str) for n in self.notes):
            raise ProblemError(f"notes: expected a tuple of strings, got {self.notes!r}")
        names = self.arg_names
        if names is not None and (not isinstance(names, tuple)
                                  or not all(isinstance(n, str) and n for n in names)):
            raise ProblemError(f"arg_names: expected a tuple of non-empty strings, got {names!r}")

    @classmethod
    def from_loss(cls, name: str, loss_fn: Callable[..., Any], params: Any,
                  batch: tuple[Any, ...], optimizer: optax.GradientTransformation, *,
                  min_length: int | None = None, fuse: bool | None = None) -> Problem:
        """A problem from an unmodified loss: ``loss_fn(params, *batch) -> scalar``.

        The step is ``value_and_grad`` of ``autoremat.remat_scans(loss_fn,
        schedule)`` and ``optimizer``'s update (optax); every scan of length
        ``>= min_length`` in the loss, however written, runs under the trial's
        schedule. ``seq_len`` is the longest such scan's length; the step's
        arguments are ``(params, opt_state, *batch)``, named for the breakdown.
        ``min_length``: shorter scans are left as written (default
        ``remat_scans``'s, 64). ``fuse``: the readout and loss after the scan
        move into its step where they are separable in time (``remat_scans``),
        so the measured step -- and the breakdown's floor -- is the fused one;
        ``False``: never; ``None`` (default): a choice of the search where fusing
        moves anything (``fuse_choice``) -- fused needs less memory, unfused was
        faster on a TPU -- recorded in the tuned schedule (``fuse:``).

        ``at_length(n)`` cuts every batch array with an axis of length ``seq_len``
        to its first ``n`` steps along it (none when an array has two such axes);
        it raises ``ProblemError`` when the loss's longest scan does not then
        have ``n`` steps, and the tuner times that problem at full length.
        """
        from autoremat._measure.from_loss import first_steps, loss_problem, time_axes  # imports jax

        seq_len, build, arg_names, choice, notes = loss_problem(
            loss_fn, params, batch, optimizer, min_length=min_length, fuse=fuse)
        axes = time_axes(batch, seq_len)

        def at_length(n: int) -> Problem:
            assert axes is not None
            got, short_build, _, _, _ = loss_problem(loss_fn, params, first_steps(batch, axes, n),
                                                  optimizer, min_length=min_length,
                                                  fuse=fuse if fuse is not None or choice
                                                  else True)
            if got != n:
                raise ProblemError(
                    f"at_length: on the first {n} of the batch's {seq_len} steps the loss's "
                    f"longest scan has {got} steps, not {n}: its length does not follow the "
                    "batch's time axis, so it cannot be timed on a short run")
            return cls(name, n, short_build, arg_names, fuse_choice=choice, notes=notes)

        return cls(name, seq_len, build, arg_names, None if axes is None else at_length,
                   fuse_choice=choice, notes=notes)


def resolve_problem(ref: str) -> Problem:
    """Find a problem by ``package.module:name`` or ``path/to/file.py:name``.

    ``name`` is a ``Problem`` or a zero-argument callable returning one. A file's folder
    goes first on ``sys.path`` (and stays there, for imports inside its functions), as
    ``python path/to/file.py`` does, so the file can import the modules beside it.
    """
    module_ref, sep, attr = ref.rpartition(":")
    if not sep or not module_ref or not attr:
        raise ProblemError(
            f"problem: expected 'package.module:name' or 'path/to/file.py:name', got {ref!r}"
        )
    if module_ref.endswith(".py"):
        path = Path(module_ref)
        if not path.is_file():
            raise ProblemError(f"problem: no such file {module_ref!r}")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        spec = importlib.util.spec_from_file_location(f"_autoremat_problem_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise ProblemError(f"problem: importing {module_ref} failed: {type(e).__name__}: {e}") from e
    else:
        try:
            module = importlib.import_module(module_ref)
        except Exception as e:
            raise ProblemError(f"problem: cannot import {module_ref!r}: {type(e).__name__}: {e}") from e
    if not hasattr(module, attr):
        raise ProblemError(f"problem: {module_ref} has no attribute {attr!r}")
    obj = getattr(module, attr)
    if not isinstance(obj, Problem) and callable(obj):
        try:
            obj = obj()
        except Exception as e:
            raise ProblemError(f"problem: calling {ref}() failed: {type(e).__name__}: {e}") from e
    if not isinstance(obj, Problem):
        raise ProblemError(
            f"problem: {ref} is a {type(obj).__name__}, expected an autoremat.Problem "
            "or a zero-argument callable returning one"
        )
    return obj
