"""The built-in layer stack, policies over a model's checkpoint_name tags, short scans.

Every schedule's loss and gradients equal the unscheduled model's (flax ``nn.scan`` of
the same blocks, float32, rtol 1e-5) on a tiny stack.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import jax
import optax
import pytest

import autoremat
from autoremat import Schedule, ScheduleError
from autoremat._models.layer_stack import CHECKPOINT_NAMES, LayerStack, layer_stack_model
from autoremat._schedules import from_data
from autoremat._schedules.base import SHORT_SCAN
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.nested_space import POLICIES, policy_choices
from autoremat._search.named_policies import name_policies, named_policies, scanned_tags
from autoremat._search.planning.short_scans import structure_params
from autoremat._search.space import propose
from autoremat.cli import main
from tests.helpers import assert_close

LAYERS = 6
TINY = LayerStack(LAYERS, 16, 2, 32, 6, 2, vocab=12, dtype="float32")


@pytest.fixture(scope="module")
def model() -> Any:
    return layer_stack_model(TINY)


@pytest.fixture(scope="module")
def reference(model: Any) -> Any:
    params, _, tokens = model.args
    return jax.jit(jax.value_and_grad(model.loss_fn(None)))(params, tokens)


@pytest.fixture(scope="module")
def tags(model: Any) -> dict[str, Any]:
    step, args = model.problem().build(autoremat.plain(LAYERS))
    return scanned_tags(step, args, LAYERS)


def _grads(model: Any, schedule: Schedule) -> Any:
    params, _, tokens = model.args
    return jax.jit(jax.value_and_grad(model.loss_fn(schedule)))(params, tokens)


OFFLOAD_QKV = {"save_and_offload_only_these_names": {
    "names_which_can_be_saved": [], "names_which_can_be_offloaded": ["query_proj", "key_proj"],
    "offload_src": "device", "offload_dst": "pinned_host"}}
SCHEDULES = [
    autoremat.plain(LAYERS),
    autoremat.nested([LAYERS]),
    autoremat.nested([2, 3], ["nothing_saveable", "everything_saveable"]),
    autoremat.nested([3, 2], ["nothing_saveable", {"save_only_these_names": ["query_proj",
                                                                             "key_proj"]}]),
    autoremat.nested([LAYERS], [{"save_anything_except_these_names": ["attention_out", "mlpwi_0"]}]),
    autoremat.nested([2, 3], ["dots_saveable", OFFLOAD_QKV], unroll=2),
    autoremat.nested([4, 2]),  # 6 layers: one chunk of 4 and a remainder
    autoremat.nested([1, 2, 3], ["nothing_saveable", "nothing_saveable", "dots_saveable"]),
    autoremat.binomial(2),
    # what the search proposes below ``full`` (``presets.LayerPlan._below_full``)
    autoremat.nested([3, 2]),
    autoremat.binomial(LAYERS - 2),
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.describe())
def test_every_schedule_gives_the_unscheduled_gradients(model: Any, reference: Any,
                                                        schedule: Schedule) -> None:
    assert_close(_grads(model, schedule), reference)


@pytest.mark.parametrize("which", [0, -1, pytest.param(slice(1, -1), marks=pytest.mark.slow)],
                         ids=["first", "last", "the others"])
def test_the_offered_name_policies_give_the_unscheduled_gradients(
        model: Any, reference: Any, tags: dict[str, Any], which: int | slice) -> None:
    """The first offered (the shortest save chain) and the last (an offload) in CI, the
    others (3 s each) with ``-m slow``."""
    offered = list(name_policies(tags, offload=True).values())
    assert len(offered) >= 6
    for policy in offered[which] if isinstance(which, slice) else [offered[which]]:
        assert_close(_grads(model, autoremat.nested([3, 2], ["nothing_saveable", policy])),
                     reference)


def test_flax_remat_of_each_layer_gives_the_unscheduled_gradients(model: Any,
                                                                  reference: Any) -> None:
    params, _, tokens = model.args
    loss = model.loss_fn(None, flax_policy=jax.checkpoint_policies.nothing_saveable)
    assert_close(jax.jit(jax.value_and_grad(loss))(params, tokens), reference)


def test_the_step_tags_maxtexts_names_with_sizes_and_costs(tags: dict[str, Any]) -> None:
    assert set(tags) == set(CHECKPOINT_NAMES)
    d, mlp, tokens = TINY.d_model, TINY.mlp, TINY.batch * TINY.seq_len
    assert tags["query_proj"].bytes == tokens * d * 4
    for gate in ("mlpwi_0", "mlpwi_1"):  # the gated MLP's two input projections
        assert tags[gate].bytes == tokens * mlp * 4
        assert tags[gate].flops == 2 * tokens * d * mlp  # its own matmul since the tags before
    assert tags["attention_out"].bytes == tokens * d * 4  # before the output projection
    assert tags["decoder_layer_input"].flops == 0  # the layer's input: nothing to recompute


def test_the_probes_instance_is_the_same_stack_small(model: Any) -> None:
    sizes = LayerStack(24, 1024, 16, 4096, 2048, 8).small()
    assert (sizes.layers, sizes.d_model, sizes.heads, sizes.seq_len, sizes.batch) == (
        24, 128, 16, 16, 1)
    problem = model.problem()
    assert problem.small is not None
    small = problem.small()
    assert small.seq_len == problem.seq_len == LAYERS and small.name != problem.name
    step, args = small.build(autoremat.plain(LAYERS))
    assert set(scanned_tags(step, args, LAYERS)) == set(CHECKPOINT_NAMES)


def test_name_policies_are_chains_not_the_power_set(tags: dict[str, Any]) -> None:
    offered = name_policies(tags, offload=False)
    save = [p for label, p in offered.items() if label.startswith("save(")]
    assert [len(p.names) for p in save] == [3, 6, 9]
    assert all(set(a.names) < set(b.names) for a, b in itertools.pairwise(save))
    assert "decoder_layer_input" not in save[0].names  # free to recompute: kept last
    assert not any(p.name.startswith("save_and_offload") for p in offered.values())
    # MaxText's presets over the tags the stack has (its kv_proj, qkv_proj, mlpwi: none)
    assert set(offered["save_qkv_proj"].names) == {"query_proj", "key_proj", "value_proj"}
    assert set(offered["minimal"].names) == set(CHECKPOINT_NAMES) - {"decoder_layer_input",
                                                                    "attention_out"}
    assert "minimal_with_context" not in offered  # it acts as minimal: offered once
    assert any(p.name == "save_and_offload_only_these_names"
               for p in name_policies(tags, offload=True).values())


def test_the_space_offers_name_policies_only_when_passed_them(model: Any) -> None:
    step, args = model.problem().build(autoremat.plain(LAYERS))
    found = scanned_tags(step, args, LAYERS)
    offered = named_policies(found, "cpu")
    cpu = policy_choices("cpu", named=offered)
    rng = random.Random(0)
    labels = {propose({}, LAYERS, "cpu", rng, named=offered)[1].get("d2_p1") for _ in range(200)}
    on_tpu = named_policies(found, "tpu")
    tpu = policy_choices("tpu", named=on_tpu)
    probed = NestedSchedule.checks(LAYERS, "tpu", on_tpu)
    assert set(POLICIES) < set(cpu) and not any(lb.startswith("offload(") for lb in cpu)
    assert any(lb.startswith("offload(") for lb in tpu)
    assert {lb for lb in probed if lb.startswith("offload(")} == {
        lb for lb in tpu if lb.startswith("offload(")}  # each probed before it is offered
    assert any(isinstance(lb, str) and lb.startswith(("save(", "all_but(")) for lb in labels)
    assert offered and set(policy_choices("cpu")) == set(POLICIES)  # nothing hidden
    assert not any(str(lb).startswith(("save(", "all_but("))
                   for lb in (propose({}, LAYERS, "cpu", rng)[1].get("d2_p1") for _ in range(50)))


def test_a_policy_naming_a_tag_the_model_lacks_is_one_clear_error(model: Any) -> None:
    bad = autoremat.nested([3, 2], ["nothing_saveable",
                                    {"save_only_these_names": ["query_proj", "qkv_proj"]}])
    with pytest.raises(ScheduleError, match=r"levels\[1\]\.policy: save_only_these_names "
                       r"names 'qkv_proj', which the scanned step does not tag .*query_proj"):
        _grads(model, bad)


def test_name_policies_round_trip_and_explain_themselves(tmp_path: Path) -> None:
    schedule = autoremat.nested([2, 3], ["nothing_saveable", OFFLOAD_QKV])
    loaded = autoremat.load_schedule(autoremat.save_schedule(schedule, tmp_path / "s.yaml"))
    assert loaded == schedule and from_data(loaded.to_data()).key() == schedule.key()
    assert schedule.describe() == "2x3 nothing/save()+offload(query_proj,key_proj) unroll=1"
    assert ("offloads query_proj, key_proj to pinned_host; recomputes all else"
            in "\n".join(schedule.explain()))
    assert schedule.policies()[1][1].names == ("query_proj", "key_proj")
    assert autoremat.binomial(2).policies() == []


def test_user_stack_through_from_loss_and_remat_scans(model: Any, reference: Any) -> None:
    """A stack written with flax's nn.scan, tuned unmodified: remat_scans reaches the
    layer scan with min_length set to the layer count."""
    params, _, tokens = model.args
    problem = autoremat.Problem.from_loss("mine", model.loss_fn(None), params, (tokens,),
                                          optax.adam(1e-3), min_length=LAYERS)
    assert problem.seq_len == LAYERS
    schedule = autoremat.nested([3, 2], ["nothing_saveable", {"save_only_these_names":
                                                              ["mlpwi_0"]}])
    loss = autoremat.remat_scans(model.loss_fn(None), schedule, min_length=LAYERS)
    assert_close(jax.jit(jax.value_and_grad(loss))(params, tokens), reference)


def test_short_scans_list_every_tiling() -> None:
    params = structure_params(24, "cpu")
    assert params is not None and len(params) < 100
    rng = random.Random(0)
    schedules = [propose(p, 24, "cpu", rng)[0] for p in params]
    two = {s.lengths for s in schedules if isinstance(s, NestedSchedule) and s.depth == 2}
    assert {(12, 2), (8, 3), (6, 4), (4, 6), (3, 8), (2, 12)} <= two
    assert any(getattr(s, "snapshots", 0) == 16 for s in schedules)
    assert structure_params(SHORT_SCAN + 1, "cpu") is None


def test_cli_tunes_the_layer_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # the sizes of docs/layer_stacks.md's tiny tune: the suite's compile cache serves both
    sizes = ["--problem", "layer_stack", "--layers", "4", "--d-model", "16", "--heads", "2",
             "--mlp", "32", "--seq-len", "4", "--batch", "2"]
    assert main(["tune", *sizes, "--trials", "2", "--no-progress", "--budget", "1GB",
                 "--storage", f"sqlite:///{tmp_path}/s.db"]) == 0
    out = capsys.readouterr().out
    assert "problem: layer_stack(L=4,d=16,H=2,mlp=32,S=4,B=2,bf16)" in out
    assert autoremat.load_schedule("schedule.yaml").meta["seq_len"] == 4
    assert main(["pareto", "--storage", f"sqlite:///{tmp_path}/s.db"]) == 0
    table = capsys.readouterr().out  # the tags' costs, from the study
    assert "what each checkpoint name costs" in table
    assert any(line.split()[:1] == ["mlpwi_0"] for line in table.splitlines())
    for argv, message in [
        (["--layers", "4"], "--layers: sizes the built-in layer_stack only; add --problem"),
        (["--problem", "layer_stack", "--hidden", "8"], "--hidden: sizes the built-in seed_lstm only"),
        (["--problem", "layer_stack", "--heads", "5"], "--heads: must divide d_model=1024"),
    ]:
        assert main(["tune", *argv, "--budget", "1GB"]) == 2
        assert message in capsys.readouterr().err


def test_remat_scans_checks_tags_against_the_whole_function() -> None:
    """One schedule serves every long scan: a tag in one of them is not missing in the
    other; a tag in none is the error."""
    import jax.numpy as jnp
    from jax import lax
    from jax.ad_checkpoint import checkpoint_name

    def loss(w: jax.Array, xs: jax.Array) -> jax.Array:
        h, _ = lax.scan(lambda h, x: (jnp.tanh(checkpoint_name(h * w, "gates") + x), None),
                        jnp.zeros(3), xs)
        g, _ = lax.scan(lambda g, x: (jnp.sin(g * w + x), None), h, xs)
        return jnp.sum(g ** 2)

    xs = jnp.linspace(-1.0, 1.0, 24).reshape(8, 3)
    want = jax.value_and_grad(loss)(0.7, xs)
    schedule = autoremat.nested([2, 4], ["nothing_saveable", {"save_only_these_names":
                                                              ["gates"]}])
    got = jax.value_and_grad(autoremat.remat_scans(loss, schedule, min_length=8))(0.7, xs)
    assert_close(got, want)
    wrong = autoremat.nested([8], [{"save_only_these_names": ["gate"]}])
    with pytest.raises(ScheduleError, match=r"levels\[0\]\.policy: .* names 'gate', .*gates"):
        jax.value_and_grad(autoremat.remat_scans(loss, wrong, min_length=8))(0.7, xs)
