"""A MaxText model as a ``Problem``: MaxText's own train step under each of its remat knobs.

MaxText (``pip install autoremat[maxtext]``; Python >= 3.12, jax >= 0.11) builds its
decoder from a config -- its ``configs/base.yml`` (or ``config``) and ``key=value``
overrides, as on its command line -- and wraps each scanned layer in its own
``jax.checkpoint`` under ``remat_policy``. ``maxtext_problem`` is that train step as a
``Problem`` whose ``seq_len`` is the layer count: a schedule of one policy per layer
becomes the config's remat knobs (``config_overrides``: ``remat_policy: full``, or
``custom`` with ``device`` / ``offload`` / ``remat`` per tagged tensor, as
``autoremat export --format maxtext`` writes them), and the step built is MaxText's
``train_step`` under that config (MaxText's ahead-of-time path, ``train_compile``'s
shaped inputs, on this machine's devices). What is measured is MaxText itself, so the
answer is MaxText's config, exact by construction. A schedule MaxText cannot write
(chunks of layers, a policy by kind) fails to build, saying why.

The step runs on arguments made from MaxText's shaped state and batch (parameters
normal * 0.02, optimizer state zeros, random tokens in one segment): the same shapes,
program and memory as training, not a trained model. Compiling MaxText's step takes
tens of seconds on a CPU even for a tiny decoder; each knob setting is one compile.
MaxText is imported only inside these functions (``import autoremat`` needs neither it
nor jax).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoremat._errors import ProblemError
from autoremat._measure.problem import Problem, Step
from autoremat._schedules.base import Schedule
from autoremat._schedules.frameworks import framework_policy

#: The overrides every MaxText problem here starts from: synthetic data, no checkpoints,
#: no output folder kept; the user's overrides come after and win.
BASE_OVERRIDES = ("dataset_type=synthetic", "enable_checkpointing=false", "steps=1",
                  "run_name=autoremat", "skip_jax_distributed_system=true")


def maxtext_available() -> bool:
    """MaxText can be imported here (Python >= 3.12 with ``autoremat[maxtext]``)."""
    import importlib.util

    return importlib.util.find_spec("maxtext") is not None


def _require() -> None:
    if not maxtext_available():
        raise ProblemError("maxtext: MaxText is not installed here; on Python >= 3.12, "
                           "pip install 'autoremat[maxtext]'")


def base_config() -> str:
    """MaxText's own ``configs/base.yml``."""
    _require()
    import maxtext

    return str(Path(maxtext.__file__).parent / "configs" / "base.yml")


def config_overrides(schedule: Schedule, tags: Sequence[str]) -> list[str]:
    """The MaxText ``key=value`` overrides that run ``schedule`` (one policy on every layer)
    over a model tagging ``tags``: MaxText's preset where one does exactly that to the
    tags (``full``, ``minimal``, ...), else ``custom`` and its keys; a ``ProblemError``
    saying why when MaxText's ``remat_policy`` cannot write it."""
    form = framework_policy(schedule, tags)
    if not form.maxtext_ok:
        raise ProblemError(f"schedule: MaxText's remat_policy cannot run "
                           f"{schedule.describe()}: {form.why_not or form.maxtext_why_not}")
    if form.maxtext_preset:  # MaxText's own preset does exactly this to the model's tags
        return [f"remat_policy={form.maxtext_preset}"]
    return ["remat_policy=custom", *(f"{name}={value}" for name, value in form.maxtext)]


@dataclass(frozen=True)
class MaxTextModel:
    """A MaxText config (``config`` and ``overrides``) and what its traced step tags.

    Attributes:
      overrides: the user's ``key=value`` overrides.
      config: the config file (MaxText's ``base.yml`` by default).
      layers: ``num_decoder_layers``.
      scan_layers: the config's ``scan_layers``.
      costs: the tags of its scanned layer, with what each costs
        (``checkpoint_names.TaggedValue`` by name; none when the layers are not scanned).
    """

    overrides: tuple[str, ...]
    config: str
    layers: int
    scan_layers: bool = True
    costs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def tags(self) -> tuple[str, ...]:
        """The tags of its scanned layer, sorted."""
        return tuple(sorted(self.costs))

    def settings(self, extra: Sequence[str] = ()) -> Any:
        """MaxText's config (``pyconfig.initialize``) of these overrides and ``extra``;
        MaxText's own error when it refuses one."""
        from maxtext.configs import pyconfig

        return pyconfig.initialize(["", self.config, *BASE_OVERRIDES, *self.overrides,
                                    *extra])

    def step(self, extra: Sequence[str] = ()) -> tuple[Step, tuple[Any, ...]]:
        """MaxText's train step under these overrides and ``extra``, and arguments for it."""
        return maxtext_step(self.settings(extra))

    def problem(self, scan_layers: bool | None = None) -> Problem:
        """This model as a ``Problem``: each schedule run as MaxText's remat knobs, with
        ``scan_layers`` when given (default: the config's)."""
        scan = [] if scan_layers is None else [f"scan_layers={str(scan_layers).lower()}"]

        def build(schedule: Schedule) -> tuple[Step, tuple[Any, ...]]:
            return self.step([*config_overrides(schedule, self.tags), *scan])

        return Problem(name=f"maxtext({' '.join([*self.overrides, *scan])})",
                       seq_len=self.layers, build=build, arg_names=("state", "batch"))


def maxtext_model(overrides: Sequence[str] = (), config: str | None = None) -> MaxTextModel:
    """The MaxText model of ``config`` (default: MaxText's ``base.yml``) and ``overrides``
    (``key=value``): its layer count and, from one trace of its step under
    ``remat_policy=full``, the tags its scanned layer has."""
    _require()
    import jax

    from autoremat._scan.checkpoint_names import scanned_costs

    model = MaxTextModel(tuple(overrides), config or base_config(), 0)
    settings = model.settings(["remat_policy=full"])
    layers = int(settings.num_decoder_layers)
    step, args = maxtext_step(settings)
    costs = scanned_costs(jax.make_jaxpr(step)(*args).jaxpr, layers) \
        if settings.scan_layers else None
    return MaxTextModel(model.overrides, model.config, layers, bool(settings.scan_layers),
                        costs.tags if costs is not None else {})


def maxtext_problem(overrides: Sequence[str] = (), config: str | None = None) -> Problem:
    """``maxtext_model(overrides, config).problem()``: the module docstring's ``Problem``."""
    return maxtext_model(overrides, config).problem()


def maxtext_step(settings: Any) -> tuple[Step, tuple[Any, ...]]:
    """MaxText's ``train_step`` for ``settings`` on this machine's devices, as
    ``step(state, batch) -> (state, metrics)`` with arguments made from its shaped ones."""
    import jax
    from flax.core.spmd import logical_axis_rules
    from jax.sharding import AxisType, Mesh
    from maxtext.trainers.pre_train import train, train_compile
    from maxtext.utils import maxtext_utils, sharding

    devices = maxtext_utils.create_device_mesh(settings, jax.devices())
    mesh = Mesh(devices, settings.mesh_axes,
                axis_types=(AxisType.Auto,) * len(settings.mesh_axes))
    shaped, _, state_shardings, _, graph = train_compile.get_shaped_inputs(mesh, settings)
    param_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(
        settings, state_shardings)
    state_in = sharding.build_zero1_input_state_mesh_shardings(settings, state_shardings,
                                                               param_shardings)
    data = sharding.get_input_data_sharding(settings, mesh)
    func, _, _, _, _ = maxtext_utils.get_functional_train_with_signature(
        train.train_step, data, state_in, graph, settings, param_shardings)
    rules = settings.logical_axis_rules
    state, batch = _concrete(shaped, int(settings.vocab_size))
    keys = jax.tree_util.tree_map(_is_key, state)

    def step(state: Any, batch: Any) -> Any:  # PRNG keys in and out as their raw data
        state = jax.tree_util.tree_map(
            lambda x, k: jax.random.wrap_key_data(x) if k else x, state, keys)
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), logical_axis_rules(rules):
            out = func(state, batch)
        return jax.tree_util.tree_map(
            lambda x: jax.random.key_data(x) if _is_key(x) else x, out)

    raw = jax.tree_util.tree_map(lambda x: jax.random.key_data(x) if _is_key(x) else x, state)
    return step, (raw, batch)


def _is_key(x: Any) -> bool:
    import jax

    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _concrete(shaped: tuple[Any, ...], vocab: int) -> tuple[Any, ...]:
    """Arrays of the shaped ``(state, batch)``: parameters normal * 0.02, the optimizer's
    state zeros, tokens random in ``[0, vocab)``, positions ``0..S-1``, one segment."""
    import math

    import jax
    import jax.numpy as jnp

    key = [jax.random.PRNGKey(0)]

    def make(path: Any, leaf: Any) -> Any:
        where = jax.tree_util.keystr(path)
        shape, dtype = leaf.shape, leaf.dtype
        if "position" in where:
            return jnp.broadcast_to(jnp.arange(shape[-1], dtype=dtype), shape)
        if "segmentation" in where:
            return jnp.ones(shape, dtype)
        key[0], sub = jax.random.split(key[0])
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # the model's rngs
            return jax.random.split(jax.random.key(0), math.prod(shape)).reshape(shape)
        if jnp.issubdtype(dtype, jnp.integer):
            return (jax.random.randint(sub, shape, 0, vocab, dtype) if "input" in where
                    or "target" in where else jnp.zeros(shape, dtype))
        if "opt" in where:
            return jnp.zeros(shape, dtype)
        return (jax.random.normal(sub, shape, jnp.float32) * 0.02).astype(dtype)

    return tuple(jax.tree_util.tree_map_with_path(make, part) for part in shaped)
