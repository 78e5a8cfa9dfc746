"""Layer stacks: which scans count, what each tag costs, the knapsack, groups proposals, and
a tune that tries the presets first (``autoremat._search.planning.presets``). Tiny stacks on a CPU."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import optuna
import pytest

import autoremat
from autoremat._measure.measure import compile_schedule
from autoremat._models.layer_stack import LayerStack, layer_stack_model
from autoremat._scan.checkpoint_names import StepCosts, TaggedValue
from autoremat._schedules import from_data
from autoremat._schedules.groups import GroupsSchedule
from autoremat._schedules.nested import NestedSchedule
from autoremat._schedules.policy import Policy
from autoremat._search.attrs import NAME_COSTS
from autoremat._search.named_policies import named_policies, step_costs
from autoremat._search.planning.layer_costs import MARGIN, LayerCosts, below_full, knapsack
from autoremat._search.planning.presets import LayerPlan, is_layer_stack, preset_labels, split
from autoremat._search.space import seeds
from autoremat._search.study import MeasuredTrial, measured_trials
from tests.tiny_problem import tiny

LAYERS = 6
TINY = LayerStack(LAYERS, 16, 2, 64, 8, 2, vocab=12, dtype="float32")


@pytest.fixture(scope="module")
def problem() -> autoremat.Problem:
    return layer_stack_model(TINY).problem()


@pytest.fixture(scope="module")
def found(problem: autoremat.Problem) -> StepCosts:
    step, args = problem.build(autoremat.plain(LAYERS))
    costs = step_costs(step, args, LAYERS)
    assert costs is not None
    return costs


@pytest.fixture(scope="module")
def costs(found: StepCosts) -> LayerCosts:
    """The trace's costs without the scanned inputs, so the byte arithmetic below is the
    layers' alone (what splitting into groups adds: ``test_splitting_into_groups_...``)."""
    return LayerCosts(LAYERS, dataclasses.replace(found, xs_bytes=0))


def test_splitting_into_groups_costs_about_the_scanned_inputs_once(
        problem: autoremat.Problem, found: StepCosts) -> None:
    """Each group's scan takes a slice of the stacked parameters and its gradient is joined
    back: the compiled total grows by about the parameters' bytes, which the prediction
    adds (``SPLIT_OVERHEAD``), checked against the compiler."""
    params = sum(x.nbytes for x in jax.tree.leaves(problem.build(autoremat.plain(LAYERS))[1][0]))
    assert 0 < found.xs_bytes <= params
    dots = Policy("dots_saveable")
    one = compile_schedule(problem, autoremat.nested([LAYERS], dots)).measurement.total_bytes
    two = compile_schedule(problem, autoremat.groups([(3, dots), (3, dots)])).measurement.total_bytes
    with_xs = LayerCosts(LAYERS, found)
    assert with_xs.split_bytes(1) == 0 and with_xs.split_bytes(2) == found.xs_bytes
    predicted = with_xs.extra(autoremat.groups([(3, dots), (3, dots)]))
    assert predicted is not None and one is not None and two is not None
    single = with_xs.extra(autoremat.nested([LAYERS], dots))
    assert single is not None
    assert 0.5 * (two - one) <= predicted[0] - single[0] <= 1.5 * (two - one)  # about it


def test_a_short_scan_of_heavy_steps_is_a_layer_stack(costs: LayerCosts) -> None:
    assert is_layer_stack(LAYERS, costs.costs)
    step, args = tiny(32).build(autoremat.plain(32))  # a toy recurrence cell: 32 FLOPs
    assert not is_layer_stack(32, step_costs(step, args, 32))
    assert not is_layer_stack(129, costs.costs)  # longer than SHORT_SCAN
    assert [s.describe() for s, _ in seeds(LAYERS, layer_stack=True)] == [
        f"{LAYERS} nothing unroll=1"]


def test_what_each_policy_keeps_comes_from_the_trace(costs: LayerCosts) -> None:
    tokens, d, mlp = TINY.batch * TINY.seq_len, TINY.d_model, TINY.mlp
    qkv = Policy("save_only_these_names", args=("query_proj", "key_proj", "value_proj"))
    assert costs.keeps(qkv) == (3 * tokens * d * 4, True)
    assert costs.keeps(Policy("nothing_saveable")) == (0.0, True)
    no_batch, exact = costs.keeps(Policy("dots_with_no_batch_dims_saveable"))
    dots, _ = costs.keeps(Policy("dots_saveable"))
    # q, k, v, out and the gated MLP's three matmuls; dots adds attention's batched scores
    # and output
    assert exact and no_batch == tokens * (5 * d + 2 * mlp) * 4
    assert dots > no_batch
    everything, exact = costs.keeps(Policy("none"))
    assert not exact and everything >= dots  # a lower bound
    # chunks of layers: meant to err low, twice the layer inputs not stored (2 + 3 of 6)
    carry = costs.costs.carry_bytes
    assert costs.extra(autoremat.nested([2, 3])) == (-2 * carry, False)
    # an outer level's tags stay for every layer (counted 1 - MARGIN); the inner level's
    # for its chunk; the layer input's tag (no matmul to redo) not at all
    inner = autoremat.nested([3, 2], ["nothing_saveable", qkv])
    assert costs.extra(inner) == (2 * 3 * tokens * d * 4 - 2 * carry, False)
    outer = autoremat.nested([3, 2], [qkv, "nothing_saveable"])
    assert costs.extra(outer) == ((1 - MARGIN) * LAYERS * 3 * tokens * d * 4 - 2 * carry, False)
    with_input = Policy("save_only_these_names", args=("decoder_layer_input",))
    assert costs.extra(autoremat.nested([3, 2], with_input)) == (-2 * carry, False)
    groups = autoremat.groups([(2, qkv), (4, "nothing_saveable")])
    assert costs.extra(groups) == (2 * 3 * tokens * d * 4, True)
    table = costs.table()
    assert {row["name"] for row in table} == set(costs.costs.tags)
    assert all(row["bytes"] == LAYERS * row["bytes_per_layer"] for row in table)


def test_the_knapsack_keeps_the_most_recompute_within_the_room(costs: LayerCosts) -> None:
    tags = costs.costs.tags
    assert knapsack(costs, 0) == ()
    every = sum(t.bytes for t in tags.values()) * LAYERS
    assert set(knapsack(costs, every)) >= {n for n, t in tags.items() if t.flops > 0}
    room = tags["mlpwi_0"].bytes * LAYERS
    kept = knapsack(costs, room)
    assert sum(tags[n].bytes for n in kept) * LAYERS <= room
    assert sum(tags[n].flops for n in kept) >= tags["mlpwi_0"].flops  # no worse than it alone


def test_split_gives_the_faster_preset_to_as_many_layers_as_fit() -> None:
    assert split(24, 10.0, 85.0) == 8
    assert split(24, 10.0, 5.0) is None  # not one layer
    assert split(24, 10.0, 1e9) is None  # all of them: the preset itself fits
    assert split(24, 0.0, 100.0) is None


MINIMAL = Policy("dots_with_no_batch_dims_saveable")


def test_where_a_run_decides_the_fit_the_plan_predicts_from_the_trace(costs: LayerCosts) -> None:
    full = autoremat.nested([LAYERS])
    per_layer, _ = costs.keeps(MINIMAL)
    base = int(10 * per_layer)
    plan = LayerPlan(costs, budget_bytes=int(base + 2.5 * per_layer), predicts=True)
    presets = {"dots_no_batch": MINIMAL}
    assert plan.observe(autoremat.nested([2, 3]), 5, presets) == []  # not full
    proposed = plan.observe(full, base, presets)
    grouped = [s for s in proposed if isinstance(s, GroupsSchedule)]
    assert [(g.length, g.policy) for g in grouped[0].groups] == [
        (2, MINIMAL), (LAYERS - 2, Policy("nothing_saveable"))]
    assert any(isinstance(s, NestedSchedule) and s.levels[0].policy.names for s in proposed)
    assert plan.over(autoremat.nested([LAYERS], MINIMAL))  # 16 x per_layer > 12.5
    assert not plan.over(grouped[0])
    assert [plan.priority(s.key()) for s in proposed] == list(range(len(proposed)))
    assert plan.observe(full, base, presets) == []  # proposed once


def test_where_the_compile_decides_a_preset_over_the_budget_brings_its_groups(
        costs: LayerCosts) -> None:
    plan = LayerPlan(costs, budget_bytes=1000)
    minimal = autoremat.nested([LAYERS], MINIMAL)
    assert not plan.over(minimal)  # no prediction: its compile decides
    assert not any(isinstance(s, GroupsSchedule)
                   for s in plan.observe(autoremat.nested([LAYERS]), 700, {"m": MINIMAL}))
    (grouped,) = plan.observe(minimal, 700 + LAYERS * 100, {})  # 100 bytes a layer more
    assert isinstance(grouped, GroupsSchedule)
    assert [(g.length, g.policy) for g in grouped.groups] == [
        (3, MINIMAL), (LAYERS - 3, Policy("nothing_saveable"))]


def test_a_preset_over_the_budget_pairs_with_the_fastest_preset_that_fits(
        costs: LayerCosts) -> None:
    """Between two measured presets: the larger on as many layers as fit, the fastest one
    within the budget on the rest; fewer layers when the pair is over by its own figure."""
    plan = LayerPlan(costs, budget_bytes=1000)
    assert plan.observe(autoremat.nested([LAYERS]), 700, {}) == []  # full; no tag fits
    assert plan.observe(autoremat.nested([LAYERS], MINIMAL), 820, {}, step=1.0) == []
    none = Policy("none")
    nothing = Policy("nothing_saveable")
    proposed = plan.observe(autoremat.nested([LAYERS], none), 1120, {})
    assert [[(g.length, g.policy) for g in s.groups] for s in proposed] == [
        [(4, none), (2, nothing)],  # 70 bytes a layer more than full, 300 of room
        [(3, none), (3, MINIMAL)]]  # 50 a layer more than minimal, 180 of room
    (fewer,) = plan.observe(proposed[1], 1100, {})  # 93 a layer more than minimal: 1 fits
    assert [(g.length, g.policy) for g in fewer.groups] == [(1, none), (5, MINIMAL)]
    assert plan.observe(fewer, 1001, {}) == []  # not fewer than one
    out_proj = Policy("save_only_these_names", args=("out_proj",))
    assert plan.observe(autoremat.nested([LAYERS], out_proj), 990, {}, step=2.0) == []  # slower
    qkv = Policy("save_only_these_names", args=("query_proj", "key_proj", "value_proj"))
    timed = autoremat.nested([LAYERS], qkv)
    (faster,) = plan.observe(timed, 900, {}, step=0.5)
    assert [(g.length, g.policy) for g in faster.groups] == [(2, none), (4, qkv)]
    # one untried pair of ``none`` is tried first, the latest: ``fewer`` is an ordinary
    # candidate now (the pair it came from was measured: it stays where it was)
    assert [plan.priority(s.key()) for s in [*proposed, fewer, faster]] == [0, 1, None, 2]
    assert plan.observe(timed, 900, {}, step=0.5) == []  # seen: every round observes it again


def test_presets_are_measured_first_and_the_study_keeps_the_tag_costs(
        problem: autoremat.Problem, tmp_path: Path) -> None:
    step, args = problem.build(autoremat.plain(LAYERS))
    found = step_costs(step, args, LAYERS)
    labels = preset_labels("cpu", named_policies(found.tags if found else {}, "cpu"))
    assert labels[:3] == ["dots_no_batch", "dots", "none"] and "save_qkv_proj" in labels
    storage = f"sqlite:///{tmp_path}/s.db"
    result = autoremat.tune(problem, 10**9, n_trials=1 + len(labels), storage=storage,
                            time_limit=None)
    measured = [t.schedule.levels[0].policy for t in _trials(result.study_name, storage)
                if isinstance(t.schedule, NestedSchedule)]
    assert measured[0] == Policy("nothing_saveable")  # the one seed
    named = named_policies(found.tags if found else {}, "cpu")
    want = [Policy("dots_with_no_batch_dims_saveable"), Policy("dots_saveable"), Policy("none"),
            *(named[lb] for lb in labels[3:])]
    assert measured[1:] == want  # every preset, in order, before any other candidate
    study = optuna.load_study(study_name=result.study_name, storage=storage)
    assert {row["name"] for row in study.user_attrs[NAME_COSTS]} == set(found.tags if found else {})


def test_below_full_where_a_run_decides_every_per_layer_schedule_is_over(
        costs: LayerCosts) -> None:
    """The TPU's below-``full`` budget (issue 45: 3-4 per-layer presets compiled and run
    over it): a per-layer schedule keeps at least what ``full`` keeps, so once ``full``
    is over, every one is, however little it keeps more (``MARGIN`` aside); above
    ``full`` a prediction within the margin is still measured."""
    small = autoremat.nested([LAYERS], Policy("save_only_these_names", args=("out_proj",)))
    extra, exact = costs.keeps(small.levels[0].policy)
    assert exact and extra > 0
    below = LayerPlan(costs, budget_bytes=10**6, predicts=True)
    below.observe(autoremat.nested([LAYERS]), 10**6 + 1, {})  # full, just over
    assert below.over(small) and below.over(autoremat.groups([(1, MINIMAL), (5, "none")]))
    assert not below.over(autoremat.nested([2, 3]))  # recomputes whole layers: compiled
    above = LayerPlan(costs, budget_bytes=10**6, predicts=True)
    above.observe(autoremat.nested([LAYERS]), 10**6 - LAYERS * extra // 2, {})
    assert not above.over(small)  # half its bytes over the budget: within the margin


def test_below_full_remat_over_chunks_of_layers_is_tried_first(
        problem: autoremat.Problem, found: StepCosts) -> None:
    """Below ``full``, remat over chunks of layers stores fewer layer inputs: Revolve
    storing just enough fewer, then the nested split storing fewest (``below_full``),
    are proposed first; the prediction errs low
    against the compiler's figure; once an all-``nothing`` one is over, every nested
    schedule storing as many inputs is, while a binomial one storing fewer is not."""
    assert found.carry_bytes == TINY.batch * TINY.seq_len * TINY.d_model * 4  # float32
    assert below_full(12) == autoremat.nested([4, 3]) and below_full(24) == autoremat.nested([6, 4])
    assert below_full(13) is None and below_full(3) is None
    costs = LayerCosts(LAYERS, found)
    chunked = below_full(LAYERS)
    assert chunked == autoremat.nested([3, 2])
    full = compile_schedule(problem, autoremat.nested([LAYERS])).measurement.total_bytes
    total = compile_schedule(problem, chunked).measurement.total_bytes
    bound = costs.extra(chunked)
    assert full is not None and total is not None and bound == (-2 * found.carry_bytes, False)
    assert full + bound[0] <= total  # errs low, on the compiler's figures
    plan = LayerPlan(costs, budget_bytes=10**6, predicts=True)
    revolve = autoremat.binomial(LAYERS - 2)  # 1 byte over: one input's bytes, one more
    assert plan.observe(autoremat.nested([LAYERS]), 10**6 + 1, {}) == [revolve, chunked]
    assert plan.first == [revolve.key(), chunked.key()] and not plan.over(chunked)
    plan.observe(chunked, 10**6 + 2, {})  # over too: what it implies full costs there
    assert plan.nested_base == 10**6 + 2 + 2 * found.carry_bytes
    assert plan.over(autoremat.nested([2, 3])) and plan.over(autoremat.nested([3, 2], MINIMAL))
    assert not plan.over(autoremat.binomial(2))  # stores 2 layer inputs, not 5


def test_chunked_predictions_err_low_on_the_tpus_measured_trials() -> None:
    """Every nested or binomial schedule the TPU v5e ran in the side-by-side (issue 45,
    ``studies/results/layer_presets*.md``: both sizes, 2026-12-06) needed at least its
    prediction from ``full``'s measured figure and the trace's bytes, which
    ``tests/data/tpu_layer_trials.json`` holds as the search saw them."""
    data = json.loads((Path(__file__).parent / "data" / "tpu_layer_trials.json").read_text())
    checked = 0
    for size in data.values():
        c = size["costs"]
        tags = {n: TaggedValue(n, t["bytes"], t["flops"]) for n, t in c["tags"].items()}
        costs = LayerCosts(size["layers"], StepCosts(
            tags, c["flops"], c["dot_bytes"], c["dot_no_batch_bytes"], c["xs_bytes"],
            c["carry_bytes"]))
        plan = LayerPlan(costs, budget_bytes=2**62, predicts=True)
        plan.base = size["full_fit_bytes"]
        for trial in size["chunked"]:
            guess = plan.predicted(from_data(trial["schedule"]))
            assert guess is not None and not guess[1], trial
            assert guess[0] <= trial["fit_bytes"], trial
            checked += 1
    assert checked == 8


def _trials(name: str, storage: str) -> list[MeasuredTrial]:
    return measured_trials(optuna.load_study(study_name=name, storage=storage))
