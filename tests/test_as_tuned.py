"""A scan given a tuned schedule says where it runs another program than the one measured:
more stacked outputs than the tuned program (refused where that breaks the schedule's
budget, warned otherwise), compiler options it cannot apply (warned once). What it runs is
unchanged: loss and gradients equal a plain ``lax.scan``'s."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import autoremat
from autoremat import ScheduleError
from autoremat._scan.as_tuned import (
    ScheduleMismatchError,
    ScheduleMismatchWarning,
    stacked_difference,
)
from tests.helpers import assert_close

T, B, H = 64, 2, 8
W = jax.random.normal(jax.random.PRNGKey(0), (H, H)) * 0.3
XS = jax.random.normal(jax.random.PRNGKey(1), (T, B, H))
# Tuned with the readout and loss in the step: nothing stacked, total 10 KB.
FUSED = autoremat.nested([8, 8]).with_fuse(True).with_meta(
    total_bytes=10_000, stacked_bytes=0, seq_len=T, devices=1, budget_bytes=20_000)


def step(h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    h = jnp.tanh(h @ W + x)
    return h, h


def loss(scan: object, w: jax.Array) -> jax.Array:
    def body(h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = jnp.tanh(h @ w + x)
        return h, h

    _, hs = scan(body, jnp.zeros((B, H)), XS)  # type: ignore[operator]
    return jnp.mean(hs**2)  # the readout after the scan: (T, B, H) stacked


def test_stacked_difference_is_per_step_and_per_device() -> None:
    # T x B x H float32 = 4096 bytes stacked where the tuned program stacked none
    d = stacked_difference(FUSED, 4096, T)
    assert d is not None and d.extra_bytes == 4096 and d.fused and not d.breaks_budget
    assert stacked_difference(FUSED, 4096, 2 * T) is not None  # any length: per step
    half = FUSED.with_meta(stacked_bytes=2048)  # the tuned program stacked half of it
    assert stacked_difference(half, 4096, T).extra_bytes == 2048  # type: ignore[union-attr]
    on_two = FUSED.with_meta(devices=2, stacked_bytes=2048)  # per device: the same stack
    assert stacked_difference(on_two, 4096, T) is None
    assert stacked_difference(FUSED, 150, T) is None  # within 2% of the tuned total
    assert stacked_difference(autoremat.nested([8, 8]), 10**9, T) is None  # no meta
    over = stacked_difference(FUSED, 20_000, T)
    assert over is not None and over.breaks_budget
    # Tuned on a TPU, whose compiler can keep stacked outputs on chip: said, still refused
    on_tpu = stacked_difference(FUSED.with_meta(platform="tpu"), 20_000, T)
    assert on_tpu is not None and on_tpu.on_chip_maybe and on_tpu.breaks_budget
    assert "a TPU can keep them on chip" in on_tpu.message(FUSED)


def test_an_unfused_run_of_a_fused_tune_over_its_budget_is_refused_before_compiling() -> None:
    def scan(f: object, init: object, xs: object) -> object:
        return autoremat.scan(f, init, xs, schedule=FUSED.with_meta(total_bytes=18_000))

    with pytest.raises(ScheduleMismatchError) as e:
        jax.jit(jax.grad(lambda w: loss(scan, w))).lower(W)
    assert isinstance(e.value, ScheduleError)
    text = str(e.value)
    for words in ("fuse: true", "total 18 KB", "4.1 KB more", "over its budget 20 KB",
                  "autoremat.remat_scans(loss, schedule)", "fuse_loss",
                  "schedule.with_meta(budget_bytes=None)"):
        assert words in text, words


@pytest.mark.parametrize("schedule", [FUSED, FUSED.with_meta(total_bytes=18_000, budget_bytes=None)],
                         ids=["within-budget", "accepted"])
def test_within_budget_or_accepted_it_warns_and_runs_the_plain_scans_gradients(
        schedule: autoremat.Schedule) -> None:
    def scan(f: object, init: object, xs: object) -> object:
        return autoremat.scan(f, init, xs, schedule=schedule)

    with pytest.warns(ScheduleMismatchWarning, match="this scan stacks 4.1 KB more"):
        got = jax.jit(jax.value_and_grad(lambda w: loss(scan, w)))(W)
    assert_close(got, jax.value_and_grad(lambda w: loss(lax.scan, w))(W))


def test_the_linen_drop_in_is_held_to_the_same_figures() -> None:
    import flax.linen as nn

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, xs: jax.Array) -> jax.Array:
            scan = autoremat.linen.scan(lambda mdl, h, x: step(h, x), schedule=FUSED.with_meta(
                total_bytes=18_000))
            return scan(self, jnp.zeros((B, H)), xs)[1]

    with pytest.raises(ScheduleMismatchError, match="over its budget"):
        Stack().init(jax.random.PRNGKey(0), XS)


def test_a_scan_that_stacks_what_was_tuned_says_nothing() -> None:
    def fused_loss(w: jax.Array) -> jax.Array:  # the loss summed in the carry: no stack
        def body(c: tuple[jax.Array, jax.Array], x: jax.Array) -> tuple[object, None]:
            h = jnp.tanh(c[0] @ w + x)
            return (h, c[1] + jnp.sum(h**2)), None

        (_, total), _ = autoremat.scan(body, (jnp.zeros((B, H)), 0.0), XS, schedule=FUSED)
        return total / XS.size

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = jax.jit(jax.value_and_grad(fused_loss))(W)
    assert_close(got, jax.value_and_grad(lambda w: loss(lax.scan, w))(W))


def test_scans_inside_a_scanned_step_are_part_of_its_program() -> None:
    """An inner scan stacks per outer step: its own output is not held to the tuned stack."""
    def outer(h: jax.Array, x: jax.Array) -> tuple[jax.Array, None]:
        h, _ = autoremat.scan(step, h, jnp.broadcast_to(x, (4, *x.shape)), schedule=FUSED)
        return h, None

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h, _ = autoremat.scan(outer, jnp.zeros((B, H)), XS, schedule=FUSED)
    assert h.shape == (B, H)


def test_compiler_options_a_scan_cannot_apply_are_warned_once() -> None:
    schedule = autoremat.nested([8, 8]).with_options(xla_cpu_enable_fast_math=False)
    fused_loss_args = (step, jnp.zeros((B, H)), XS)
    with pytest.warns(ScheduleMismatchWarning, match=r"compiler_options=dict\(schedule"):
        first = autoremat.scan(*fused_loss_args, schedule=schedule)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = autoremat.scan(*fused_loss_args, schedule=schedule)
    assert_close(again, first)
    assert_close(first, lax.scan(*fused_loss_args))
