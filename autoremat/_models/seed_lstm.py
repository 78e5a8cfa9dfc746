"""The built-in problem: the LSTM train step of the original report (``../shared/seeds``).

``flax.linen.OptimizedLSTMCell``, a Dense readout, L2 loss, Adam(1e-3), seq2seq, at the
sizes ``seed_lstm``'s defaults give (the one home of the seed's sizes: the command reads
them from its signature). The ``Problem`` is built from the loss as written
(``lax.scan``, the readout after it) like a user's (``Problem.from_loss``), so it is
searched like one: with ``fused_readout=True`` the readout and loss run inside the scanned
step (``remat_scans`` moves them), so no ``(T, B, H)`` stack of states exists and the
schedule's savings are no longer capped by it (same loss and gradients); with ``None``
fused and unfused are both candidates (``Problem.fuse_choice``). ``SeedModel.train_step``
is the same step around any way of running the scan (``autoremat.scan`` with
``autoremat.fuse_loss``, or a competitor's: ``studies/compare.py``).

On many devices (``mesh``, ``shard_seed_args``): the batch is split over every mesh axis
(``data`` and ``fsdp``); with an ``fsdp`` axis, each parameter and optimizer-state array
is split along its largest axis divisible by the ``fsdp`` size (FSDP / ZeRO-3), anything
else is replicated. Sharding the batch ``n`` ways divides the scan's activations,
residuals and carries by ``n``; replicated parameters and optimizer state stay whole on
every device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, cast

from autoremat._errors import ProblemError
from autoremat._measure.mesh import layout, make_mesh, put
from autoremat._measure.problem import Problem, Step
from autoremat._scan.fuse import fuse_loss

if TYPE_CHECKING:  # imported lazily at run time: importing autoremat must not import jax
    import flax.linen as nn
    import jax
    import optax

#: ``run_scan(params, x) -> (final_carry, hs)``: how a train step runs the LSTM
#: over ``x`` (batch-major ``(B, T, D)``); ``hs`` is time-major ``(T, B, H)``,
#: or ``None`` when the loss is on the last state only. With a fused readout
#: ``x`` is ``(x, y)`` and the final carry ``(lstm_carry, summed_loss)``.
RunScan = Callable[[Any, Any], tuple[Any, Any]]


@dataclass(frozen=True)
class SeedModel:
    """The seed's LSTM, readout, optimizer and example arguments, built once.

    ``train_step(run_scan)`` is the seed's train step (forward, L2 loss,
    gradients, Adam) around any way of running the scan (``autoremat.scan``;
    ``studies/compare.py``'s competitors); ``problem()`` is the tuner's, built from
    ``loss`` around ``lax.scan``. ``fused_readout``: the readout and per-step loss run
    inside the scanned step (``cell_step``, ``autoremat.fuse_loss``); nothing is stacked.
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
        """This train step as a ``Problem`` built from its loss, like a user's
        (``Problem.from_loss``): the loss as written (``lax.scan``, the readout after it),
        its scan run under each schedule by ``remat_scans``, which moves the readout and
        loss into the step where ``fused_readout`` says -- and where the schedule's
        ``fuse`` does under ``fuse_choice``. Its figures are those of the same step run by
        ``autoremat.scan`` (``train_step``); ``at_length`` keeps the model."""
        import optax

        params, opt_state, x, y = self.args
        written = replace(self, fused_readout=False, fuse_choice=False)
        # The optimizer state as built (placed on the mesh, where there is one).
        tx = optax.GradientTransformation(lambda _: opt_state, self.tx.update)
        fuse = None if self.fuse_choice else self.fused_readout
        problem = Problem.from_loss(self.name, written.loss(_lax_scan(written)), params, (x, y),
                                    tx, min_length=1, fuse=fuse)
        return replace(problem, at_length=lambda n: self.first_steps(n).problem())

    @property
    def name(self) -> str:
        """``seed_lstm(T=...,B=...,H=...,seq2seq[,fused | ,fuse chosen][,mesh ...])``."""
        batch = self.args[2].shape[0]
        kind = "seq2seq" if self.seq2seq else "last"
        kind += ",fuse chosen" if self.fuse_choice else ",fused" if self.fused_readout else ""
        _, mesh = layout(self.args)
        kind += f",mesh {mesh}" if mesh else ""
        return f"seed_lstm(T={self.seq_len},B={batch},H={self.cell.features},{kind})"


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

    def loss(self, run_scan: RunScan) -> Callable[[Any, jax.Array, jax.Array], jax.Array]:
        """``loss(params, x, y)``: the mean L2 loss of the readout of the states ``run_scan``
        gives (with a fused readout, the summed loss it carries over ``y.size``)."""
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

        return loss_fn

    def train_step(self, run_scan: RunScan) -> Step:
        """``train_step(params, opt_state, x, y) -> (params, opt_state, loss)``."""
        import jax
        import optax

        loss_fn = self.loss(run_scan)

        def train_step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            updates, opt_state = self.tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        return train_step

    def _apply(self, variables: Any, h: jax.Array) -> jax.Array:
        # Dense.apply is typed as maybe returning (output, state); without mutable it does not.
        return cast("jax.Array", self.readout.apply(variables, h))


def _lax_scan(model: SeedModel) -> RunScan:
    """The seed's scan as a user writes it: ``lax.scan`` over the time-major ``x``."""

    def run_scan(params: Any, x: Any) -> tuple[Any, Any]:
        import jax.numpy as jnp
        from jax import lax

        return lax.scan(model.cell_step(params), model.scan_init(), jnp.moveaxis(x, 1, 0))

    return run_scan


def seed_model(seq_len: int, batch: int, hidden: int, input_dim: int, output_dim: int,
               seq2seq: bool = True, fused_readout: bool | None = False) -> SeedModel:
    """The seed's ``OptimizedLSTMCell`` + Dense, Adam(1e-3), its parameters drawn as Flax's
    initializers draw them and standard normal data, both by NumPy (``_host_arrays``).

    The arguments are ``seed_lstm``'s, every size given (its defaults are the seed's
    sizes, in that one place); the data and parameters do not depend on ``fused_readout``.
    """
    if fused_readout is not False and not seq2seq:
        raise ProblemError("fused_readout: the loss on the last state stacks no outputs, so "
                           "there is nothing to fuse; use it with seq2seq=True")
    import flax.linen as nn
    import jax
    import optax

    cell = nn.OptimizedLSTMCell(hidden)
    readout = nn.Dense(output_dim)
    tx = optax.adam(1e-3)
    # Made on a thread while JAX starts the device (seconds on an accelerator): no JAX
    # backend is needed for them, so the host's init of the model and the copy of its
    # results overlap the start-up instead of following it.
    with ThreadPoolExecutor(1) as pool:
        made = pool.submit(_host_arrays, cell, readout, tx, batch, seq_len, input_dim,
                           hidden, output_dim, seq2seq)
        device = jax.local_devices()[0]  # this process's: the others' are not addressable
        carry0, args = made.result()
    carry0, args = jax.device_put((carry0, args), device)
    return SeedModel(cell, readout, tx, carry0, args, seq2seq,
                     fused_readout is not False, fused_readout is None)


def _host_arrays(cell: nn.OptimizedLSTMCell, readout: nn.Dense, tx: optax.GradientTransformation,
                 batch: int, seq_len: int, input_dim: int, hidden: int, output_dim: int,
                 seq2seq: bool) -> tuple[Any, tuple[Any, ...]]:
    """The initial carry and ``(params, opt_state, x, y)`` as NumPy arrays (seed 0), shaped by
    ``jax.eval_shape`` (no device): zero carry, biases and optimizer state; square kernels
    (the recurrent ones) orthogonal and the others LeCun normal, as Flax's LSTM and Dense
    initializers; standard normal ``x`` and ``y``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def init(key: Any) -> Any:
        kc, kd = jax.random.split(key)
        carry0 = cell.initialize_carry(kc, (batch, input_dim))
        params = {"cell": cell.init(kc, carry0, jnp.zeros((batch, input_dim)))["params"],
                  "readout": readout.init(kd, jnp.zeros((batch, hidden)))["params"]}
        return carry0, (params, tx.init(params))

    rng = np.random.default_rng(0)

    def draw(shape: Any) -> Any:
        if len(shape.shape) != 2:
            return np.zeros(shape.shape, shape.dtype)
        fan_in, fan_out = shape.shape
        if fan_in == fan_out:  # orthogonal: Q of a normal matrix's QR, signs fixed
            q, r = np.linalg.qr(rng.standard_normal(shape.shape))
            return (q * np.sign(np.diag(r))).astype(shape.dtype)
        return (rng.standard_normal(shape.shape) / np.sqrt(fan_in)).astype(shape.dtype)

    carry0, (params, opt_state) = jax.eval_shape(init, jax.ShapeDtypeStruct((2,), jnp.uint32))
    zeros = functools.partial(jax.tree_util.tree_map, lambda s: np.zeros(s.shape, s.dtype))
    x = rng.standard_normal((batch, seq_len, input_dim), dtype=np.float32)
    y = rng.standard_normal((batch, seq_len, output_dim) if seq2seq else (batch, output_dim),
                            dtype=np.float32)
    return zeros(carry0), (jax.tree_util.tree_map(draw, params), zeros(opt_state), x, y)


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
    (``Problem.fuse_choice``): each schedule's ``fuse`` decides. The default here is the
    readout after the scan, as written; ``autoremat tune`` without ``--problem`` builds
    ``seed_lstm(fused_readout=None)``: fused needs less memory, unfused was faster on a TPU.

    ``mesh`` (``"data=4"``, ``"data=2,fsdp=2"`` or a ``jax.sharding.Mesh``
    with those axis names): the batch is split over every mesh axis and, with
    ``fsdp``, parameters and optimizer state along their largest divisible
    axis; every measured figure is then per device.
    ``batch`` defaults to 10, with a mesh to the next multiple of its size.
    """
    placed = None if mesh is None else make_mesh(mesh)
    model = seed_model(seq_len, seed_batch(batch, placed), hidden, input_dim, output_dim,
                       seq2seq, fused_readout)
    if placed is not None:
        model = replace(model, args=shard_seed_args(model.args, placed, (2, 3)))
    return model.problem()


#: The mesh axes the built-in problem knows: the batch over both, parameters over ``fsdp``.
SEED_AXES: Final = ("data", "fsdp")


def fsdp_axis(shape: tuple[int, ...], size: int) -> int | None:
    """The axis FSDP splits over ``size`` devices: the largest divisible one (the first
    of equals); ``None`` (replicate) when none divides or ``size`` is 1."""
    fits = [i for i, n in enumerate(shape) if size > 1 and n % size == 0]
    return max(fits, key=lambda i: (shape[i], -i)) if fits else None


def shard_seed_args(args: tuple[Any, ...], mesh: jax.sharding.Mesh,
                    batch_args: tuple[int, ...]) -> tuple[Any, ...]:
    """The seed's arguments placed on ``mesh`` (module doc): ``args[i]`` for ``i`` in
    ``batch_args`` split along axis 0 over every mesh axis, the others FSDP or replicated.

    Raises:
      ProblemError: an axis other than ``data``/``fsdp``, or a batch not divisible
        by the mesh's device count.
    """
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    names = tuple(mesh.axis_names)
    unknown = [n for n in names if n not in SEED_AXES]
    if unknown:
        raise ProblemError(f"mesh: the built-in problem splits its batch over 'data' and its "
                           f"parameters over 'fsdp'; axis {unknown[0]!r} is neither")
    batch = int(args[batch_args[0]].shape[0])
    if batch % mesh.size:
        raise ProblemError(f"batch: {batch} does not split over the mesh's {mesh.size} "
                           f"devices; use a multiple of {mesh.size}")
    fsdp = int(dict(mesh.shape).get("fsdp", 1))

    def param_spec(leaf: Any) -> P:
        axis = fsdp_axis(tuple(getattr(leaf, "shape", ())), fsdp)
        return P() if axis is None else P(*([None] * axis), "fsdp")

    def place(i: int, arg: Any) -> Any:
        if i in batch_args:
            return put(arg, NamedSharding(mesh, P(names)))
        return jax.tree_util.tree_map(
            lambda leaf: put(leaf, NamedSharding(mesh, param_spec(leaf))), arg)

    return tuple(place(i, a) for i, a in enumerate(args))


def seed_batch(batch: int | None, mesh: jax.sharding.Mesh | None) -> int:
    """The built-in problem's batch: ``batch``, else 10 -- with a mesh, the smallest
    multiple of its device count that is >= 10 (``data=4``: 12)."""
    if batch is not None:
        return batch
    size = 1 if mesh is None else int(mesh.size)
    return -(-10 // size) * size
