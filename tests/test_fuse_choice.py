"""Fusing the readout into the scanned step as a choice of the search (issue 36, item 2).

A problem made from a loss (``Problem.from_loss``, ``linen.problem``, ``nnx.problem``)
or the built-in seed with ``fused_readout=None`` offers fused and unfused schedules;
the tuned schedule records which (``fuse:``), ``remat_scans`` applies it, and
``describe``/``show`` say which and why. Both give the plain scan's loss and gradients.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
import pytest

import autoremat
from autoremat._cli.show_text import describe_schedule
from autoremat._errors import ScheduleError
from autoremat._measure.measure import compile_schedule
from autoremat._models.seed_lstm import seed_lstm
from autoremat._schedules import dump_schedule, parse_schedule
from autoremat._search.space import propose, seeds
from autoremat._search.tune import tune
from tests.helpers import assert_close

T, B, XD, H, Y = 64, 2, 3, 8, 3
KEYS = jax.random.split(jax.random.PRNGKey(0), 6)
X = jax.random.normal(KEYS[0], (T, B, XD))
YS = jax.random.normal(KEYS[1], (T, B, Y))
P = {"w": jax.random.normal(KEYS[2], (H, H)) * 0.3, "u": jax.random.normal(KEYS[3], (XD, H)),
     "o": jax.random.normal(KEYS[4], (H, Y))}
NESTED = autoremat.nested([8, 8])


def seq2seq_loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    """A readout and loss per step after the scan: fusing applies."""
    def step(h: jax.Array, xt: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = jnp.tanh(h @ p["w"] + xt @ p["u"])
        return h, h

    _, hs = jax.lax.scan(step, jnp.zeros((B, H)), x)
    return jnp.mean((hs @ p["o"] - y) ** 2)


def last_loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    """The loss on the last state: nothing to fuse."""
    def step(h: jax.Array, xt: jax.Array) -> tuple[jax.Array, None]:
        return jnp.tanh(h @ p["w"] + xt @ p["u"]), None

    h, _ = jax.lax.scan(step, jnp.zeros((B, H)), x)
    return jnp.mean((h @ p["o"] - y[-1]) ** 2)


def test_fuse_is_recorded_only_where_it_was_a_choice() -> None:
    old = parse_schedule("version: 1\nkind: nested\nlevels: [{length: 8, policy: "
                         "nothing_saveable}, {length: 8, policy: nothing_saveable}]\n")
    assert old.fuse is None and "fuse" not in dump_schedule(old)  # old files load unchanged
    assert old.key() == NESTED.key()
    fused, unfused = NESTED.with_fuse(True), NESTED.with_fuse(False)
    assert len({NESTED.key(), fused.key(), unfused.key()}) == 3
    assert fused.describe().endswith(" fused") and unfused.describe().endswith(" unfused")
    for s in (fused, unfused):
        back = parse_schedule(dump_schedule(s))
        assert back == s and back.fuse is s.fuse
    with pytest.raises(ScheduleError, match="fuse: expected true or false"):
        parse_schedule(dump_schedule(fused).replace("fuse: true", "fuse: 1"))


def test_remat_scans_applies_the_schedules_fuse_unless_told() -> None:
    want = jax.grad(seq2seq_loss)(P, X, YS)
    assert autoremat.remat_scans(seq2seq_loss, NESTED).fuse is True  # not a choice: fused
    assert autoremat.remat_scans(seq2seq_loss, NESTED.with_fuse(False)).fuse is False
    assert autoremat.remat_scans(seq2seq_loss, NESTED.with_fuse(False), fuse=True).fuse is True
    for schedule in (NESTED.with_fuse(True), NESTED.with_fuse(False)):
        wrapped = autoremat.remat_scans(seq2seq_loss, schedule)
        with jax.default_matmul_precision("highest"):
            assert_close(jax.grad(wrapped)(P, X, YS), want)
        fusion = [s.fusion for s in wrapped.describe(P, X, YS).scans]
        assert any(f.startswith("fused into the step") for f in fusion) is schedule.fuse


def test_a_loss_made_problem_offers_both_where_fusing_applies() -> None:
    sgd = optax.sgd(0.1)
    problem = autoremat.Problem.from_loss("s2s", seq2seq_loss, P, (X, YS), sgd)
    assert problem.fuse_choice
    assert not autoremat.Problem.from_loss("s2s", seq2seq_loss, P, (X, YS), sgd,
                                           fuse=True).fuse_choice
    assert not autoremat.Problem.from_loss("last", last_loss, P, (X, YS), sgd).fuse_choice
    sized = {f: compile_schedule(problem, NESTED.with_fuse(f)).measurement for f in (True, False)}
    # unfused stacks every step's state: more temp than the fused step
    assert sized[False].temp_bytes > sized[True].temp_bytes  # type: ignore[operator]
    outs = []
    for f in (True, False):
        step, args = problem.build(NESTED.with_fuse(f))
        outs.append(jax.jit(step)(*args))
    assert_close(outs[0], outs[1])
    cut = autoremat.Problem.from_loss("s2s", seq2seq_loss, P, (X, YS), sgd, min_length=8)
    short = cut.at_length(16) if cut.at_length else None
    assert short is not None and short.fuse_choice


def test_the_seed_problem_offers_both_with_fused_readout_none() -> None:
    choice = seed_lstm(seq_len=32, batch=2, hidden=8, fused_readout=None)
    assert choice.fuse_choice and "fuse chosen" in choice.name
    assert not seed_lstm(seq_len=32, batch=2, hidden=8).fuse_choice
    with pytest.raises(autoremat.ProblemError, match="fused_readout"):
        seed_lstm(seq_len=32, batch=2, hidden=8, seq2seq=False, fused_readout=None)
    schedule = autoremat.nested([4, 8])
    # each compiled once: its figures, then its run
    compiled = [compile_schedule(choice, schedule.with_fuse(f)) for f in (True, False)]
    outs = [c.executable(*c.args) for c in compiled if c.executable is not None]
    assert len(outs) == 2
    want = jax.jit(seed_lstm(seq_len=32, batch=2, hidden=8).build(autoremat.plain(32))[0])(
        *choice.build(autoremat.plain(32))[1])
    assert_close(outs[0], want)
    assert_close(outs[1], want)
    fused, unfused = (c.measurement for c in compiled)
    assert unfused.stacked_bytes and not fused.stacked_bytes  # the (T, B, H) stack


def test_the_space_offers_fuse_and_seeds_unfused_off_a_cpu() -> None:
    cpu, tpu = ([p for _, p in seeds(10_000, platform, fuse=True)] for platform in ("cpu", "tpu"))
    assert all(p["fuse"] == "fused" for p in cpu)
    unfused = [p for p in tpu if p["fuse"] == "unfused"]
    assert len(unfused) == 1 and unfused[0]["kind"] == "nested" and unfused[0]["depth"] >= 2
    assert {**unfused[0], "fuse": "fused"} == next(  # the sqrt(T) seed, not the unrolled one
        p for p in tpu if p["kind"] == "nested" and p["depth"] >= 2
        and p[f"d{p['depth']}_unroll"] == 1 and p["fuse"] == "fused")
    twin = tpu.index(unfused[0])  # right before its fused twin: timed among the first
    assert tpu[twin + 1] == {**unfused[0], "fuse": "fused"} and twin < len(tpu) - 2
    assert "fuse" not in seeds(10_000, "tpu")[0][1]  # not a choice: as before
    rng = random.Random(0)
    seen = {propose({}, 1000, "cpu", rng, fuse=True)[0].fuse for _ in range(20)}
    assert seen == {True, False}


def test_tune_records_the_choice_and_show_says_why(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    problem = autoremat.Problem.from_loss("s2s", seq2seq_loss, P, (X, YS), optax.sgd(0.1))
    result = tune(problem, 10**7, n_trials=8, time_budget=0.02, study_name="fuse")
    plain = result.plain_trial  # seeded fused: still the plain scan "vs plain" is against
    assert plain is not None and plain.schedule.with_fuse(None) == autoremat.plain(T)
    best = result.best
    assert best is not None and best.fuse is not None
    why = str(best.meta["fuse_why"])
    assert why.startswith("fused: " if best.fuse else "unfused: ")
    assert f"  fuse: {why}" in describe_schedule(best).splitlines()
    assert autoremat.remat_scans(seq2seq_loss, best).fuse is best.fuse
