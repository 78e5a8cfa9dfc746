"""An equinox layer stack written the usual way (``examples/equinox_stack.py``:
``eqx.filter_vmap`` blocks, ``lax.scan`` over the arrays ``eqx.partition`` splits off,
``eqx.combine`` per layer, its own tags), at a tiny size: under ``autoremat.remat_scans``,
the drop-in ``autoremat.scan`` and its ``Problem.from_loss`` it gives the unscheduled loss
and gradients (float32, rtol 1e-5), and its problem compiles; a checkpoint inside the
scanned step is noted by ``Problem.from_loss``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest
from jax import lax

import autoremat
from autoremat._search.named_policies import step_costs
from tests.helpers import STACK_SCHEDULES, assert_close, load_example, stack_sizes

# The test extra installs equinox; a device machine running `-m device` may lack it.
eqx = pytest.importorskip("equinox")

SIZES = stack_sizes("EQX_STACK")
SCHEDULES = STACK_SCHEDULES


@pytest.fixture(scope="module")
def example() -> Any:
    return load_example("equinox_stack", SIZES)


@pytest.fixture(scope="module")
def reference(example: Any) -> Any:
    """The model as written (``lax.scan``): its loss and gradients w.r.t. its arrays."""
    params, static = example.split(example.Stack())
    return jax.jit(jax.value_and_grad(example.make_loss(static)))(params, example.tokens())


def test_remat_scans_around_the_loss_gives_the_unscheduled_gradients(
        example: Any, reference: Any) -> None:
    schedule = SCHEDULES[0]
    params, static = example.split(example.Stack())
    loss = autoremat.remat_scans(example.make_loss(static), schedule, min_length=example.LAYERS)
    assert_close(jax.jit(jax.value_and_grad(loss))(params, example.tokens()), reference)


@pytest.mark.slow  # autoremat.scan over a pytree of arrays is tested at length elsewhere
def test_the_drop_in_scan_gives_the_unscheduled_gradients(example: Any, reference: Any) -> None:
    params, static = example.split(example.Stack(schedule=SCHEDULES[1]))
    value, grads = jax.jit(jax.value_and_grad(example.make_loss(static)))(params, example.tokens())
    # the model's static field (its schedule) differs from the reference's: compare arrays
    assert_close((value, jax.tree_util.tree_leaves(grads)),
                 (reference[0], jax.tree_util.tree_leaves(reference[1])))


def test_the_problem_schedules_the_layer_scan_finds_the_tags_and_compiles(
        example: Any, reference: Any) -> None:
    problem = example.problem()
    assert problem.seq_len == example.LAYERS
    costs = step_costs(*problem.build(autoremat.plain(4)), 4)  # what the search reads
    assert costs is not None and set(costs.tags) == set(example.NAMES)
    step, args = problem.build(SCHEDULES[0])
    compiled = jax.jit(step).lower(*args).compile()
    assert compiled.memory_analysis().temp_size_in_bytes > 0
    assert_close(compiled(*args)[2], reference[0])


def test_from_loss_notes_a_checkpoint_inside_the_scanned_step(example: Any) -> None:
    arrays, rest = eqx.partition(example.Stack().blocks, eqx.is_array)

    def loss_with(wrap: Any) -> Any:
        def loss(arrays: Any, x: jax.Array) -> jax.Array:
            def layer(h: jax.Array, one: Any) -> tuple[jax.Array, None]:
                return eqx.combine(one, rest)(h), None

            return jnp.sum(lax.scan(wrap(layer), x, arrays)[0])

        return loss

    x = jnp.ones((8, 16))  # one sequence: (tokens, d_model)
    noted = autoremat.Problem.from_loss("inner", loss_with(jax.checkpoint), arrays, (x,),
                                        optax.adam(1e-3), min_length=4)
    as_written = autoremat.Problem.from_loss("plain", loss_with(lambda f: f), arrays, (x,),
                                             optax.adam(1e-3), min_length=4)
    assert len(noted.notes) == 1 and "scan of length 4 holds a jax.checkpoint" in noted.notes[0]
    assert as_written.notes == ()
