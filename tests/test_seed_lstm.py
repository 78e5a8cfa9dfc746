"""The built-in seed LSTM (``autoremat._models.seed_lstm``): a problem built from its loss
like a user's (``Problem.from_loss``), so the command searches fused and unfused readouts
(issue 47; a budget under the unfused floor gets a fused schedule: ``tests/test_fuse.py``)."""

from __future__ import annotations

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


def test_on_a_cpu_the_arguments_are_made_where_they_run() -> None:
    """The host-side build (issue 47: no QR compiled for an accelerator) is for an
    accelerator only; ``tests/test_device.py`` checks it there."""
    from autoremat._models.seed_lstm import _host_cpu

    assert _host_cpu() is None
