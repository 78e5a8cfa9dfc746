"""A user's transformer written the usual Flax way (``examples/user_transformer.py``),
tuned through ``Problem.from_loss`` / ``remat_scans`` at a tiny size: the tags found in the
traced step, the presets tried first, every schedule giving the unscheduled gradients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import pytest

import autoremat
from autoremat._search.named_policies import named_policies, step_costs
from autoremat._search.planning.presets import is_layer_stack, preset_labels
from tests.helpers import assert_close, load_example

SIZES = {"USER_LAYERS": "4", "USER_D_MODEL": "16", "USER_HEADS": "2", "USER_MLP": "32",
         "USER_SEQ_LEN": "8", "USER_BATCH": "2"}
NAMES = {"query_proj", "key_proj", "value_proj", "attention_out", "out_proj", "mlpwi", "mlpwo"}


@pytest.fixture(scope="module")
def example() -> Any:
    return load_example("user_transformer", SIZES)


@pytest.fixture(scope="module")
def problem(example: Any) -> autoremat.Problem:
    """The example's ``problem`` (its loss traced once), for every test that reads it."""
    return example.problem()


def _costs(problem: autoremat.Problem) -> Any:
    step, args = problem.build(autoremat.plain(problem.seq_len))
    return step_costs(step, args, problem.seq_len)


def test_the_tags_in_the_traced_step_are_found_and_its_presets_offered(
        example: Any, problem: autoremat.Problem) -> None:
    tagged, untagged = _costs(problem), _costs(example.untagged())
    assert problem.seq_len == 4
    assert set(tagged.tags) == NAMES and untagged.tags == {}
    assert is_layer_stack(4, tagged) and is_layer_stack(4, untagged)
    named = named_policies(tagged.tags, "cpu")
    assert {"save_qkv_proj", "save_dot_except_mlpwi"} <= set(preset_labels("cpu", named))
    assert preset_labels("cpu", named_policies(untagged.tags, "cpu")) == [
        "dots_no_batch", "dots", "none"]  # no names: the dots policies and no remat


@pytest.mark.parametrize("schedule", [
    autoremat.nested([4], "dots_with_no_batch_dims_saveable"),
    autoremat.groups([(1, {"save_only_these_names": ["query_proj", "mlpwo"]}),
                      (3, "nothing_saveable")]),
    autoremat.groups([(2, "dots_saveable"), (1, "none"), (1, "nothing_saveable")]),
    autoremat.nested([2, 2], ["nothing_saveable", {"save_only_these_names": ["mlpwi"]}]),
], ids=lambda s: s.describe())
def test_every_schedule_gives_the_unscheduled_loss_and_gradients(
        unscheduled: tuple[Any, Any, Any, Any], schedule: Any) -> None:
    loss, params, tokens, reference = unscheduled
    scheduled = autoremat.remat_scans(loss, schedule, min_length=4)
    assert_close(jax.jit(jax.value_and_grad(scheduled))(params, tokens), reference)


@pytest.fixture(scope="module")
def unscheduled(example: Any) -> tuple[Any, Any, Any, Any]:
    """A 4-layer decoder's loss, parameters, tokens, and its unscheduled loss and
    gradients (the reference), made once for every schedule above."""
    model = example.Decoder(4, 16, 2, 32)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 8), 0, example.VOCAB)
    params = model.init(jax.random.PRNGKey(0), tokens)["params"]

    def loss(p: Any, t: Any) -> Any:
        return example.next_token_loss(model.apply({"params": p}, t), t)

    return loss, params, tokens, jax.jit(jax.value_and_grad(loss))(params, tokens)


def test_tuning_it_writes_a_pick_of_its_presets(problem: autoremat.Problem,
                                                tmp_path: Path) -> None:
    result = autoremat.tune(problem, 10**9, n_trials=3, time_limit=None,
                            storage=f"sqlite:///{tmp_path}/s.db", out=tmp_path / "s.yaml")
    assert result.best is not None
    assert autoremat.load_schedule(tmp_path / "s.yaml").meta["seq_len"] == 4
