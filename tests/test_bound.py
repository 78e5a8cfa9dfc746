"""What autoremat says of a model it cannot help much: the bound measured before the search,
a scan's own unroll, and the sentence for a function with no scan to schedule.

``tests/outside_memory.py`` is a hybrid model whose memory lives outside its scans (a
linear recurrence written with ``unroll=8``, dense attention and an MLP over every step).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import assert_close
from jax import lax

import autoremat
from autoremat._cli.breakdown_text import bound_line, nothing_fits_message
from autoremat._search.bound import NEGLIGIBLE, PendingBound, least_memory, scan_bound
from tests import outside_memory as om

PARAMS = om.init(jax.random.PRNGKey(0))
BATCH = om.batch()
#: The sizes below are a CPU's compiled figures. A TPU lays out and fuses a step this small
#: otherwise (the hybrid's total is under its attention's (B, T, T); the 512-step RNN's plain
#: scan compiles to the least-memory schedule's total), and searches under the least memory
#: anyway (offload): these run where CI runs them.
CPU_FIGURES = pytest.mark.skipif(jax.default_backend() != "cpu",
                                 reason="sizes chosen for a CPU's compiled totals")


@pytest.fixture(scope="module")
def hybrid() -> autoremat.Problem:
    return om.hybrid_problem()


@CPU_FIGURES
def test_the_bound_of_memory_outside_the_scans_is_negligible(hybrid: autoremat.Problem) -> None:
    bound = scan_bound(hybrid)
    assert bound is not None
    assert bound.step_bytes > 10 * om.B * om.T * om.T  # the attention's (B, T, T) and more
    assert bound.negligible and bound.share < NEGLIGIBLE
    assert bound.least == least_memory(om.T, True if hybrid.fuse_choice else None).describe()


def test_the_bound_on_threads_is_the_bound_in_turn(hybrid: autoremat.Problem) -> None:
    # where the search compiles on threads the bound's two compiles run beside each other
    # (and beside the caller): the same two compiled totals as one after the other
    in_turn = scan_bound(hybrid)
    beside = PendingBound(hybrid, None, "cpu", parallel=True).result()
    assert in_turn is not None and beside is not None
    assert (beside.step_bytes, beside.least_bytes, beside.least) == (
        in_turn.step_bytes, in_turn.least_bytes, in_turn.least)
    with jax.default_matmul_precision("float32"):  # a thread traces otherwise: done here
        here = PendingBound(hybrid, None, "cpu", parallel=True).result()
    assert here is not None and here.least_bytes == in_turn.least_bytes


@CPU_FIGURES
def test_the_bound_of_a_scan_heavy_step_is_not() -> None:
    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        def step(h: jax.Array, xt: jax.Array) -> tuple[jax.Array, jax.Array]:
            h = jnp.tanh(h @ w + xt)
            return h, h

        return jnp.sum(lax.scan(step, jnp.zeros((4, 32)), x)[1][-1] ** 2)

    problem = autoremat.Problem.from_loss(
        "rnn", loss, jnp.eye(32) * 0.5, (jnp.ones((512, 4, 32)) * 0.1,), optax.sgd(0.1))
    bound = scan_bound(problem)
    assert bound is not None and not bound.negligible
    assert bound.share > 0.3


def test_a_negligible_bound_times_the_plain_scan_only(hybrid: autoremat.Problem,
                                                      tmp_path: Any) -> None:
    seen: list[Any] = []
    result = autoremat.tune(hybrid, "100MB", storage=f"sqlite:///{tmp_path}/s.db",
                            time_limit=None, on_bound=seen.append)
    assert len(seen) == 1 and seen[0] == result.bound and result.bound.negligible
    assert result.measured == 1
    assert result.best == autoremat.plain(om.T) or result.best.with_fuse(None).key() == \
        autoremat.plain(om.T).key()
    assert any("unroll=8" in n for n in result.best.meta["notes"])
    again = autoremat.tune(hybrid, "100MB", storage=f"sqlite:///{tmp_path}/s.db",
                           n_trials=2, time_limit=None)  # a count given: the search runs
    assert again.measured == 2 and again.bound == result.bound  # recorded, not recompiled


class _Late(PendingBound):
    """A bound on threads whose compiles end only once two trials were measured."""

    asked = 0

    def done(self) -> bool:
        self.asked += 1
        return self.asked > 2 and super().done()


def test_the_search_does_not_wait_for_a_bound_on_threads(hybrid: autoremat.Problem,
                                                         tmp_path: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # on an accelerator the first timings run while the bound compiles; a negligible bound
    # read after two trials stops the search there, and the command line says so
    late: list[_Late] = []
    monkeypatch.setattr("autoremat._search.tune.start_bound", lambda _s, problem, built, _p:
                        late.append(_Late(problem, built, "cpu", parallel=True)) or late[-1])
    seen: list[tuple[int, Any]] = []
    trials: list[int] = []
    result = autoremat.tune(hybrid, "100MB", storage=f"sqlite:///{tmp_path}/s.db",
                            time_limit=None, on_trial=lambda _s, t: trials.append(t.number),
                            on_bound=lambda b: seen.append((len(trials), b)))
    assert seen == [(2, result.bound)] and result.bound.negligible
    assert result.measured == 2 and late[0].asked == 3
    line = bound_line(result.bound, True, 2)
    assert "the search stops at the 2 schedules timed while it compiled" in line
    assert "only the plain scan is timed" in bound_line(result.bound, True, 1)


@CPU_FIGURES
def test_nothing_fits_says_the_least_memory_and_why(hybrid: autoremat.Problem,
                                                     tmp_path: Any) -> None:
    result = autoremat.tune(hybrid, "100KB", storage=f"sqlite:///{tmp_path}/s.db",
                            time_limit=None)
    assert result.best is None and result.measured == 0
    message = nothing_fits_message(result)
    assert "least-memory schedule" in message and "outside what a schedule" in message
    assert "can save at most" in message


def test_a_time_limit_spent_in_the_bound_is_reported(hybrid: autoremat.Problem,
                                                      tmp_path: Any) -> None:
    result = autoremat.tune(hybrid, "100MB", storage=f"sqlite:///{tmp_path}/s.db",
                            time_limit=1e-3)
    assert result.measured == 0 and result.overrun is not None
    assert result.overrun.trial is None and result.overrun.compile_seconds >= 1e-3


def test_a_scans_own_unroll_is_reported_and_the_schedules_applies() -> None:
    schedule = autoremat.nested([16, 16], unroll=2)
    wrapped = autoremat.remat_scans(om.loss, schedule)
    report = wrapped.describe(PARAMS, *BATCH)
    assert [s.unroll for s in report.rewritten] == [om.UNROLL] * om.BLOCKS
    text = str(report)
    assert f"unroll {om.UNROLL}" in text and "the schedule's own unroll" in text
    grad_jaxpr = jax.make_jaxpr(jax.grad(wrapped))(PARAMS, *BATCH)
    unrolls = {e.params["unroll"] for e in _scans(grad_jaxpr.jaxpr)}
    assert unrolls and om.UNROLL not in unrolls
    assert_close(jax.jit(jax.value_and_grad(wrapped))(PARAMS, *BATCH),
                 jax.jit(jax.value_and_grad(om.loss))(PARAMS, *BATCH))


def _scans(jaxpr: Any) -> list[Any]:
    from autoremat._jax import SCAN, sub_jaxprs

    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is SCAN:
            found.append(eqn)
        for sub in sub_jaxprs(eqn.params):
            found += _scans(sub)
    return found


def test_no_scan_to_schedule_says_what_was_found() -> None:
    with pytest.raises(autoremat.ProblemError, match=r"it has no scan.*associative_scan") as e:
        autoremat.Problem.from_loss("a", om.associative_loss, PARAMS, BATCH, optax.sgd(0.1))
    assert "min_length=" not in str(e.value).split("to schedule:", 1)[1]  # no advice to lower it
    report = autoremat.remat_scans(om.associative_loss, autoremat.nested([16, 16])).describe(
        PARAMS, *BATCH)
    assert "warning: no scan of length >= min_length=64 to schedule: it has no scan" in str(report)
    with pytest.raises(autoremat.ProblemError, match=r"shorter than min_length=300 \(lengths "
                                                     r"\[128\]\): pass min_length=128"):
        autoremat.Problem.from_loss("h", om.loss, PARAMS, BATCH, optax.sgd(0.1), min_length=300)


def test_a_scan_inside_a_custom_vjp_is_named_as_such() -> None:
    @jax.custom_vjp
    def kernel(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return om.loss(params, x, y)

    kernel.defvjp(lambda p, x, y: (om.loss(p, x, y), (p, x, y)),
                  lambda res, g: jax.tree.map(lambda v: v * g, jax.grad(om.loss, (0, 1, 2))(*res)))
    with pytest.raises(autoremat.ProblemError, match=r"inside a custom_vjp rule.*cannot "
                                                     r"schedule a loop there") as e:
        autoremat.Problem.from_loss("k", kernel, PARAMS, BATCH, optax.sgd(0.1))
    assert "move" not in str(e.value)
