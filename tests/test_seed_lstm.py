"""The built-in seed LSTM (``autoremat._models.seed_lstm``): a problem built from its loss
like a user's (``Problem.from_loss``), so the command searches fused and unfused readouts
(issue 47; a budget under the unfused floor gets a fused schedule: ``tests/test_fuse.py``)."""

from __future__ import annotations

import functools

import jax
import numpy as np

import autoremat
from autoremat._measure.measure import compile_schedule


def test_the_problem_is_its_loss_under_remat_scans_with_the_old_figures() -> None:
    """Built from its loss, the seed's step sizes as the ``autoremat.scan`` step did, fused
    or not (``SeedModel.train_step``: the one step, around any scan)."""
    schedule = autoremat.nested([4, 8])
    for fused in (False, True):
        problem = autoremat.seed_lstm(seq_len=32, batch=2, hidden=8, fused_readout=fused)
        assert problem.arg_names == ("params", "opt_state", "x", "y")
        m = compile_schedule(problem, schedule).measurement
        assert (m.stacked_bytes or 0) == (0 if fused else 32 * 2 * 8 * 4)
        assert problem.at_length is not None and problem.at_length(16).name == (
            problem.name.replace("T=32", "T=16"))


def test_the_arguments_are_drawn_as_flax_draws_them_without_a_device() -> None:
    """Issue 47: made by NumPy on a thread while JAX starts the device, shaped as Flax's
    init shapes them (``jax.eval_shape``): recurrent kernels orthogonal, biases and the
    optimizer state zero; the step is finite."""
    import flax.linen as nn
    import optax

    from autoremat._models.seed_lstm import _host_arrays

    cell, readout, tx = nn.OptimizedLSTMCell(16), nn.Dense(3), optax.adam(1e-3)
    carry0, (params, opt_state, x, y) = _host_arrays(cell, readout, tx, 2, 50, 5, 16, 3, True)
    assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves((carry0, params)))
    flax_params = {"cell": cell.init(jax.random.PRNGKey(0), carry0, x[:, 0])["params"],
                   "readout": readout.init(jax.random.PRNGKey(1), np.zeros((2, 16)))["params"]}
    shapes = functools.partial(jax.tree.map, lambda a: (a.shape, a.dtype))
    assert shapes(params) == shapes(flax_params)
    assert shapes(opt_state) == shapes(tx.init(flax_params))
    for gate in ("hi", "hf", "hg", "ho"):
        kernel = params["cell"][gate]["kernel"]
        np.testing.assert_allclose(kernel.T @ kernel, np.eye(16), atol=1e-5)
        assert not params["cell"][gate]["bias"].any()
    assert (x.shape, y.shape) == ((2, 50, 5), (2, 50, 3))
    assert not any(leaf.any() for leaf in jax.tree.leaves((carry0, opt_state)))
    problem = autoremat.seed_lstm(seq_len=50, batch=2, hidden=16, input_dim=5, output_dim=3)
    step, args = problem.build(autoremat.plain(50))
    assert all(np.isfinite(np.asarray(leaf)).all()
               for leaf in jax.tree.leaves(jax.jit(step)(*args)))
