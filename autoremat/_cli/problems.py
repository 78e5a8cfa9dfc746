"""The problem a command runs on: a built-in model, looked up by name in the registry
(``autoremat._models.MODELS``) and built at the sizes its flags give, or the user's
``--problem module:name``; a flag that sizes another problem is refused by its name."""

from __future__ import annotations

from typing import Any

from autoremat._cli.settings import LAYER_SETTINGS, PROBLEM_SETTINGS, UsageError, flag
from autoremat._errors import AutorematError
from autoremat._measure.problem import Problem, resolve_problem
from autoremat._models import LAYER_STACK, MODELS, SEED_LSTM, model


def make_problem(ref: str | None, seq_len: int | None, batch: int | None,
                 hidden: int | None, seq2seq: bool, fused_readout: bool | None = None,
                 mesh: str | None = None, layers: dict[str, int | None] | None = None) -> Problem:
    """The built-in LSTM or layer stack (resized), or the problem ``ref`` names (sizes
    checked by ``check_settings``); ``layers``: the layer stack's own sizes (``LAYER_SETTINGS``).
    ``fused_readout``: the built-in LSTM's readout fused (``True``), unfused (``False``), or either,
    as the search chooses (``None``; unfused with ``seq2seq=False``: nothing to fuse)."""
    readout = {True: "--fused-readout", False: "--unfused-readout", None: None}[fused_readout]
    layer_flags = [s.flag for s in LAYER_SETTINGS if (layers or {}).get(s.name) is not None]
    found = model(ref)
    if found is not None and found.name == LAYER_STACK:
        seed_only = {"--hidden": hidden, "--last-only": None if seq2seq else True,
                     "--mesh": mesh}
        named = [f for f, v in seed_only.items() if v is not None] + ([readout] if readout else [])
        if named:
            raise UsageError(f"{named[0]}: sizes the built-in LSTM (seed_lstm) only; {LAYER_STACK} takes "
                             + " ".join(flag(name) for name in found.settings))
        sizes: dict[str, Any] = {k: v for k, v in {**(layers or {}), "seq_len": seq_len,
                                                   "batch": batch}.items() if v is not None}
        try:
            return found.build(**sizes)
        except AutorematError as e:
            name, _, rest = str(e).partition(": ")
            raise UsageError(f"--{name.replace('_', '-')}: {rest}") from e
    if layer_flags:
        raise UsageError(f"{layer_flags[0]}: sizes the built-in {LAYER_STACK} only; add "
                         f"--problem {LAYER_STACK}")
    if found is not None:
        if fused_readout and not seq2seq:
            raise UsageError("--fused-readout: the loss on the last state (--last-only) stacks "
                             "no outputs, so there is nothing to fuse; drop one of the two")
        resized = {k: v for k, v in (("seq_len", seq_len), ("hidden", hidden)) if v is not None}
        return MODELS[SEED_LSTM].build(**resized, batch=batch, seq2seq=seq2seq, mesh=mesh,
                                       fused_readout=fused_readout if seq2seq else False)
    sizes = {"seq_len": seq_len, "batch": batch, "hidden": hidden,
             "fused_readout": True if readout == "--fused-readout" else None,
             "unfused_readout": True if readout == "--unfused-readout" else None, "mesh": mesh}
    named = [s.flag for s in PROBLEM_SETTINGS if sizes.get(s.name) is not None]
    if named:
        raise UsageError(f"{named[0]}: only resizes the built-in problem; your --problem "
                         "sets its own sizes")
    assert ref is not None  # no name is the default, the built-in LSTM
    return resolve_problem(ref)
