"""What the tuner measures: a user's training step, built for a schedule.

A ``Problem`` is a name, the sequence length it runs at, and a ``build``
function: ``build(schedule) -> (step, args)`` where ``step`` is the whole
un-jitted training step (forward, loss, gradients, optimizer update) that
runs its scan with ``autoremat.scan`` / ``autoremat.linen.scan`` under that
schedule, and ``args`` are example arguments for it.

The built-in problem is the LSTM of the original report (``../shared/seeds``):
``flax.linen.OptimizedLSTMCell``, a Dense readout, L2 loss, Adam(1e-3), seq2seq,
at the sizes ``seed_lstm``'s defaults give (their one home). With
``fused_readout=True`` the readout and loss run inside the scanned step
(``autoremat.fuse_loss``), so no ``(T, B, H)`` stack of states exists and the
schedule's savings are no longer capped by it (same loss and gradients).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from autoremat._errors import ProblemError
from autoremat._measure.mesh import layout, make_mesh, seed_batch, shard_seed_args
from autoremat._scan.fuse import fuse_loss
from autoremat._schedules.base import Schedule

if TYPE_CHECKING:  # imported lazily at run time: importing autoremat must not import jax
    import flax.linen as nn
    import jax
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
        problems on short runs and predicts the full step time from them
        (``autoremat._search.short_runs``); without it every timing runs at ``seq_len``.
      small: optional ``small() -> Problem``: the same step, the same ``seq_len``, at
        a size where even the plain scan compiles and runs in moments (fewer
        tokens, a narrower model). The probe checks risky choices (offload) on it
        (``autoremat._search.probe``); without it the probe cuts the problem with
        ``at_length``, or checks it as it is -- where the plain scan may not fit.
      fuse_choice: fusing the readout and loss into the scanned step is a choice of
        the search (``Schedule.fuse``): ``build`` applies the schedule's, and the
        tuner offers fused and unfused schedules (``Problem.from_loss``, ``linen``,
        ``nnx``, ``seed_lstm`` with ``fuse=None`` / ``fused_readout=None``).
    """

    name: str
    seq_len: int
    build: Callable[[Schedule], tuple[Step, tuple[Any, ...]]]
    arg_names: tuple[str, ...] | None = None
    at_length: Callable[[int], Problem] | None = None
    fuse_choice: bool = False
    small: Callable[[], Problem] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ProblemError(f"seq_len: expected a positive int, got {self.seq_len!r}")
        if not callable(self.build):
            raise ProblemError("build: expected a callable build(schedule) -> (step, args)")
        if self.at_length is not None and not callable(self.at_length):
            raise ProblemError("at_length: expected None or a callable at_length(n) -> Problem")
        if self.small is not None and not callable(self.small):
            raise ProblemError("small: expected None or a callable small() -> Problem")
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

        seq_len, build, arg_names, choice = loss_problem(loss_fn, params, batch, optimizer,
                                                         min_length=min_length, fuse=fuse)
        axes = time_axes(batch, seq_len)

        def at_length(n: int) -> Problem:
            assert axes is not None
            got, short_build, _, _ = loss_problem(loss_fn, params, first_steps(batch, axes, n),
                                                  optimizer, min_length=min_length,
                                                  fuse=fuse if fuse is not None or choice
                                                  else True)
            if got != n:
                raise ProblemError(
                    f"at_length: on the first {n} of the batch's {seq_len} steps the loss's "
                    f"longest scan has {got} steps, not {n}: its length does not follow the "
                    "batch's time axis, so it cannot be timed on a short run")
            return cls(name, n, short_build, arg_names, fuse_choice=choice)

        return cls(name, seq_len, build, arg_names, None if axes is None else at_length,
                   fuse_choice=choice)


#: ``run_scan(params, x) -> (final_carry, hs)``: how a train step runs the LSTM
#: over ``x`` (batch-major ``(B, T, D)``); ``hs`` is time-major ``(T, B, H)``,
#: or ``None`` when the loss is on the last state only. With a fused readout
#: ``x`` is ``(x, y)`` and the final carry ``(lstm_carry, summed_loss)``.
RunScan = Callable[[Any, Any], tuple[Any, Any]]


@dataclass(frozen=True)
class SeedModel:
    """The seed's LSTM, readout, optimizer and example arguments, built once.

    ``train_step(run_scan)`` is the seed's train step (forward, L2 loss,
    gradients, Adam) around any way of running the scan: ``seed_lstm`` runs
    it with ``autoremat.scan``; ``studies/compare.py`` with its competitors.
    ``fused_readout``: the readout and per-step loss run inside the scanned
    step (``cell_step``, ``autoremat.fuse_loss``); nothing is stacked.
    ``fuse_choice``: each schedule's ``fuse`` decides instead (``None``: fused).
    """

    cell: nn.OptimizedLSTMCell
    readout: nn.Dense
    tx: optax.GradientTransformation
    carry0: Any
    args: tuple[Any, ...]  # (params, opt_state, x, y)
    seq2seq: bool
    fused_readout: bool = False
    fuse_choice: bool = False

    #: What ``args`` hold, for the memory breakdown.
    ARG_NAMES = ("params", "opt_state", "x", "y")

    @property
    def seq_len(self) -> int:
        return int(self.args[2].shape[1])

    def problem(self) -> Problem:
        """This train step as a ``Problem``, its scan run by ``autoremat.scan`` under a schedule."""

        def build(schedule: Schedule) -> tuple[Step, tuple[Any, ...]]:
            from autoremat._scan.scan import scan

            model = self if not self.fuse_choice else replace(
                self, fused_readout=schedule.fuse is not False, fuse_choice=False)

            def run_scan(params: Any, x: Any) -> tuple[Any, Any]:
                return scan(model.cell_step(params), model.scan_init(), x, schedule=schedule,
                            axis=1, out_axis=0)

            return model.train_step(run_scan), self.args

        batch = self.args[2].shape[0]
        kind = "seq2seq" if self.seq2seq else "last"
        kind += ",fuse chosen" if self.fuse_choice else ",fused" if self.fused_readout else ""
        _, mesh = layout(self.args)
        kind += f",mesh {mesh}" if mesh else ""
        name = f"seed_lstm(T={self.seq_len},B={batch},H={self.cell.features},{kind})"
        return Problem(name=name, seq_len=self.seq_len, build=build, arg_names=self.ARG_NAMES,
                       at_length=lambda n: self.first_steps(n).problem(),
                       fuse_choice=self.fuse_choice)

    def first_steps(self, n: int) -> SeedModel:
        """The same model and parameters on the first ``n`` steps of ``x`` (and ``y``)."""
        params, opt_state, x, y = self.args
        from autoremat._measure.from_loss import first_steps

        return replace(self, args=(params, opt_state,
                                   *first_steps((x, y), [1, 1 if self.seq2seq else None], n)))

    def scan_init(self) -> Any:
        """The scan's initial carry: the LSTM's, and with a fused readout a zero loss sum."""
        if not self.fused_readout:
            return self.carry0
        import jax.numpy as jnp

        return self.carry0, jnp.zeros((), jnp.float32)

    def cell_step(self, params: Any) -> Callable[[Any, Any], tuple[Any, Any]]:
        """One scan step with ``params``: ``(carry, x_t) -> (carry, h_t or None)``; with a
        fused readout ``((carry, loss_sum), (x_t, y_t)) -> ((carry, loss_sum + loss_t), None)``."""

        def step(carry: Any, xt: Any) -> tuple[Any, Any]:
            carry, h = self.cell.apply({"params": params["cell"]}, carry, xt)
            return carry, (h if self.seq2seq else None)

        if not self.fused_readout:
            return step
        import optax

        readout = {"params": params["readout"]}
        return fuse_loss(step, lambda h, yt: optax.l2_loss(self._apply(readout, h), yt).sum())

    def train_step(self, run_scan: RunScan) -> Step:
        """``train_step(params, opt_state, x, y) -> (params, opt_state, loss)``."""
        import jax
        import jax.numpy as jnp
        import optax

        def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
            if self.fused_readout:  # the readout and loss ran inside the step
                (_, total), _ = run_scan(params, (x, y))
                return total / y.size
            (_, h_last), hs = run_scan(params, x)
            readout = {"params": params["readout"]}
            # hs stays time-major (T, B, H): only the small predictions are transposed.
            preds = (jnp.moveaxis(self._apply(readout, hs), 0, 1) if self.seq2seq
                     else self._apply(readout, h_last))
            return optax.l2_loss(preds, y).mean()

        def train_step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            updates, opt_state = self.tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        return train_step

    def _apply(self, variables: Any, h: jax.Array) -> jax.Array:
        # Dense.apply is typed as maybe returning (output, state); without mutable it does not.
        return cast("jax.Array", self.readout.apply(variables, h))


def seed_model(seq_len: int, batch: int, hidden: int, input_dim: int, output_dim: int,
               seq2seq: bool = True, fused_readout: bool | None = False) -> SeedModel:
    """The seed's ``OptimizedLSTMCell`` + Dense, Adam(1e-3) and random data (``PRNGKey(0)``).

    The arguments are ``seed_lstm``'s, every size given (its defaults are the seed's
    sizes, in that one place); the data and parameters do not depend on ``fused_readout``.
    """
    if fused_readout is not False and not seq2seq:
        raise ProblemError("fused_readout: the loss on the last state stacks no outputs, so "
                           "there is nothing to fuse; use it with seq2seq=True")
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    cell = nn.OptimizedLSTMCell(hidden)
    readout = nn.Dense(output_dim)
    tx = optax.adam(1e-3)

    def arrays() -> tuple[Any, tuple[Any, ...]]:
        kx, ky, kc, kd = jax.random.split(jax.random.PRNGKey(0), 4)
        x = jax.random.normal(kx, (batch, seq_len, input_dim), jnp.float32)
        y = jax.random.normal(ky, (batch, seq_len, output_dim) if seq2seq else (batch, output_dim))
        carry0 = cell.initialize_carry(kc, (batch, input_dim))
        params = {
            "cell": cell.init(kc, carry0, x[:, 0])["params"],
            "readout": readout.init(kd, jnp.zeros((batch, hidden)))["params"],
        }
        return carry0, (params, tx.init(params), x, y)

    # One compiled program, not ~45 op-by-op ones (issue 47: on a TPU v5e each eager op
    # compiled on its own, most of the 41 s before the first line); the same values.
    carry0, args = jax.jit(arrays)()
    return SeedModel(cell, readout, tx, carry0, args, seq2seq,
                     fused_readout is not False, fused_readout is None)


def seed_lstm(
    seq_len: int = 10_000,
    batch: int | None = None,
    hidden: int = 128,
    input_dim: int = 32,
    output_dim: int = 4,
    seq2seq: bool = True,
    fused_readout: bool | None = False,
    mesh: str | jax.sharding.Mesh | None = None,
) -> Problem:
    """The seed's LSTM train step (``OptimizedLSTMCell`` + Dense, L2, Adam 1e-3).

    ``x`` is batch-major ``(batch, seq_len, input_dim)`` as in the seed, scanned
    with ``axis=1`` (no transposed copy). With ``seq2seq=False`` the loss is on
    the last hidden state, so no per-step output is stacked at all. With
    ``fused_readout=True`` (seq2seq only) the readout and L2 loss run inside the
    scanned step and the loss is summed in the carry: the ``(T, B, H)`` stack of
    states, its cotangent and the readout's residual -- memory no schedule can
    remove -- do not exist; loss and gradients are the unfused step's. With
    ``fused_readout=None`` (seq2seq only) it is a choice of the search
    (``Problem.fuse_choice``): each schedule's ``fuse`` decides.

    ``mesh`` (``"data=4"``, ``"data=2,fsdp=2"`` or a ``jax.sharding.Mesh``
    with those axis names): the batch is split over every mesh axis and, with
    ``fsdp``, parameters and optimizer state along their largest divisible
    axis (``autoremat._measure.mesh``); every measured figure is then per device.
    ``batch`` defaults to 10, with a mesh to the next multiple of its size.
    """
    placed = None if mesh is None else make_mesh(mesh)
    model = seed_model(seq_len, seed_batch(batch, placed), hidden, input_dim, output_dim,
                       seq2seq, fused_readout)
    if placed is not None:
        model = replace(model, args=shard_seed_args(model.args, placed, (2, 3)))
    return model.problem()


def resolve_problem(ref: str) -> Problem:
    """Find a problem by ``package.module:name`` or ``path/to/file.py:name``.

    ``name`` is a ``Problem`` or a zero-argument callable returning one.
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
        spec = importlib.util.spec_from_file_location(f"_autoremat_problem_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise ProblemError(f"problem: importing {module_ref} failed: {type(e).__name__}: {e}") from None
    else:
        try:
            module = importlib.import_module(module_ref)
        except Exception as e:
            raise ProblemError(f"problem: cannot import {module_ref!r}: {type(e).__name__}: {e}") from None
    if not hasattr(module, attr):
        raise ProblemError(f"problem: {module_ref} has no attribute {attr!r}")
    obj = getattr(module, attr)
    if not isinstance(obj, Problem) and callable(obj):
        try:
            obj = obj()
        except Exception as e:
            raise ProblemError(f"problem: calling {ref}() failed: {type(e).__name__}: {e}") from None
    if not isinstance(obj, Problem):
        raise ProblemError(
            f"problem: {ref} is a {type(obj).__name__}, expected an autoremat.Problem "
            "or a zero-argument callable returning one"
        )
    return obj
