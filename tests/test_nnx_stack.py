"""An NNX layer stack written the usual way (``examples/nnx_stack.py``: ``nnx.vmap`` blocks,
``nnx.scan`` over layers, its own tags), at a tiny size: under ``autoremat.nnx.remat_scans``,
the drop-in ``autoremat.nnx.scan`` and ``autoremat.nnx.problem(min_length=...)`` it gives the
unscheduled loss and gradients (float32, rtol 1e-5), and its problem compiles."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import jax
import optax
import pytest
from flax import nnx

import autoremat
import autoremat.nnx
from autoremat._search.named_policies import step_costs
from tests.helpers import assert_close

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "nnx_stack.py"
SIZES = {"NNX_STACK_LAYERS": "4", "NNX_STACK_D_MODEL": "16", "NNX_STACK_HEADS": "2",
         "NNX_STACK_MLP": "32", "NNX_STACK_SEQ_LEN": "8", "NNX_STACK_BATCH": "2"}
SCHEDULES = [
    autoremat.nested([2, 2], ["nothing_saveable", {"save_only_these_names": ["ffn_up"]}]),
    autoremat.groups([(1, {"save_only_these_names": ["attn_qkv", "ffn_down"]}),
                      (3, "nothing_saveable")]),
]
IDS = [s.describe() for s in SCHEDULES]


@pytest.fixture(scope="module")
def example() -> Any:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in SIZES.items():
            mp.setenv(k, v)
        spec = importlib.util.spec_from_file_location("_nnx_stack", EXAMPLE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference(example: Any) -> Any:
    """The model as written (``nnx.scan``): its loss and ``nnx.Param`` gradients."""
    return nnx.jit(nnx.value_and_grad(example.loss_fn))(example.Stack(), example.tokens())


@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_remat_scans_around_the_loss_gives_the_unscheduled_gradients(
        example: Any, reference: Any, schedule: autoremat.Schedule) -> None:
    loss = autoremat.nnx.remat_scans(example.loss_fn, schedule, min_length=example.LAYERS)
    assert_close(nnx.jit(nnx.value_and_grad(loss))(example.Stack(), example.tokens()), reference)


def test_the_drop_in_scan_gives_the_unscheduled_gradients(example: Any, reference: Any) -> None:
    model = example.Stack(schedule=SCHEDULES[0])
    assert_close(nnx.jit(nnx.value_and_grad(example.loss_fn))(model, example.tokens()), reference)


def test_the_problem_schedules_the_layer_scan_finds_the_tags_and_compiles(
        example: Any, reference: Any) -> None:
    problem = example.problem()
    assert problem.seq_len == example.LAYERS and problem.fuse_choice
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
