"""An NNX layer stack written the usual way (``examples/nnx_stack.py``: ``nnx.vmap`` blocks,
``nnx.scan`` over layers, its own tags), at a tiny size: under ``autoremat.nnx.remat_scans``,
the drop-in ``autoremat.nnx.scan`` and ``autoremat.nnx.problem(min_length=...)`` it gives the
unscheduled loss and gradients (float32, rtol 1e-5), and its problem compiles; a remat
inside the scanned block is noted, and the schedule still decides what is kept."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import jax
import optax
import pytest
from flax import nnx

import autoremat
import autoremat.nnx
from autoremat._search.named_policies import step_costs
from tests.helpers import STACK_SCHEDULES, assert_close, load_example, stack_sizes

SIZES = stack_sizes("NNX_STACK")
SCHEDULES = STACK_SCHEDULES


@pytest.fixture(scope="module")
def example() -> Any:
    return load_example("nnx_stack", SIZES)


@pytest.fixture(scope="module")
def reference(example: Any) -> Any:
    """The model as written (``nnx.scan``): its loss and ``nnx.Param`` gradients."""
    return nnx.jit(nnx.value_and_grad(example.loss_fn))(example.Stack(), example.tokens())


def test_remat_scans_around_the_loss_gives_the_unscheduled_gradients(
        example: Any, reference: Any) -> None:
    schedule = SCHEDULES[0]
    loss = autoremat.nnx.remat_scans(example.loss_fn, schedule, min_length=example.LAYERS)
    assert_close(nnx.jit(nnx.value_and_grad(loss))(example.Stack(), example.tokens()), reference)


def test_the_drop_in_scan_gives_the_unscheduled_gradients(example: Any, reference: Any) -> None:
    model = example.Stack(schedule=SCHEDULES[1])
    assert_close(nnx.jit(nnx.value_and_grad(example.loss_fn))(model, example.tokens()), reference)


def test_the_problem_schedules_the_layer_scan_finds_the_tags_and_compiles(
        example: Any, reference: Any) -> None:
    problem = example.problem()
    # the readout follows the last layer: fusing moves nothing, so it is no choice
    assert problem.seq_len == example.LAYERS and not problem.fuse_choice
    costs = step_costs(*problem.build(autoremat.plain(4)), 4)  # what the search reads
    assert costs is not None and set(costs.tags) == set(example.NAMES)
    step, args = problem.build(SCHEDULES[0])
    compiled = jax.jit(step).lower(*args).compile()
    assert compiled.memory_analysis().temp_size_in_bytes > 0
    assert_close(compiled(*args)[1], reference[0])


@pytest.mark.parametrize("min_length, match", [
    (0, "min_length: expected a positive int"),
    (True, "min_length: expected a positive int"),
    (5, "min_length: 5 is above seq_len=4"),
])
def test_a_bad_min_length_is_refused_naming_it(example: Any, min_length: Any, match: str) -> None:
    with pytest.raises(autoremat.ProblemError, match=match):
        autoremat.nnx.problem("bad", lambda _: example.Stack(), example.loss_fn,
                              lambda m: nnx.Optimizer(m, optax.adam(1e-3), wrt=nnx.Param),
                              (example.tokens(),), seq_len=4, min_length=min_length)
    with pytest.raises(autoremat.AutorematError, match="min_length: expected a positive int"):
        autoremat.nnx.remat_scans(example.loss_fn, SCHEDULES[0], min_length=0)


def _with_inner_remat(example: Any) -> Any:
    """The example's stack, its block remat'd inside the scanned step (``nnx.remat``)."""
    model = example.Stack()
    model.layers = nnx.scan(nnx.remat(example._layer), in_axes=(nnx.Carry, 0),
                            out_axes=nnx.Carry)
    return model


def _kept(example: Any, model: Any) -> list[str]:
    """The shapes of the residuals the scheduled loss's gradient keeps."""
    graphdef, state = nnx.split(model)
    loss = autoremat.nnx.remat_scans(example.loss_fn, SCHEDULES[0], min_length=example.LAYERS)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        jax.ad_checkpoint.print_saved_residuals(
            lambda s, t: loss(nnx.merge(graphdef, s), t), state, example.tokens())
    return sorted(line.split()[0] for line in printed.getvalue().splitlines())


def test_a_remat_inside_the_block_is_noted_and_the_schedule_still_decides(
        example: Any, reference: Any) -> None:
    problem = autoremat.nnx.problem(
        "inner", lambda _: _with_inner_remat(example), example.loss_fn,
        lambda m: nnx.Optimizer(m, optax.adam(1e-3), wrt=nnx.Param), (example.tokens(),),
        seq_len=4, min_length=4)
    assert len(problem.notes) == 1 and "holds a jax.checkpoint" in problem.notes[0]
    assert example.problem().notes == ()
    # JAX applies the schedule's policy inside the block's own checkpoint: the same
    # residuals are kept (the names the schedule saves among them), the same gradients
    assert _kept(example, _with_inner_remat(example)) == _kept(example, example.Stack())
    loss = autoremat.nnx.remat_scans(example.loss_fn, SCHEDULES[0], min_length=4)
    got = nnx.jit(nnx.value_and_grad(loss))(_with_inner_remat(example), example.tokens())
    assert_close(got, reference)
