"""The built-in models: the seed LSTM (``seed_lstm``) and the layer stack
(``layer_stack``), each a ``Problem`` the measurement and the search take like a user's;
and ``maxtext``, a MaxText model (its config and overrides) as a ``Problem`` run by
MaxText's own train step (optional: ``autoremat[maxtext]``; not in the registry: the
``autoremat maxtext`` command builds it).

Their registry, ``MODELS`` (looked up by ``model``): per name, its builder, the settings
the command line may pass it, and the settings that lower its floor (``FloorFixes``: the
bytes no schedule removes, ``autoremat._measure.breakdown.Floor``). The command line
(``autoremat._cli.problems``) builds ``--problem NAME`` from it and names its fixes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from autoremat._measure.problem import Problem
from autoremat._models.layer_stack import layer_stack
from autoremat._models.seed_lstm import seed_lstm


@dataclass(frozen=True)
class FloorFixes:
    """The settings of a problem that lower its floor (the bytes no schedule removes), by
    what they do; ``None``: the problem has no such setting.

    Attributes:
      readout: puts the readout inside the scanned step (nothing stacked per step).
      sequence: shortens the sequence.
      batch: shrinks the batch.
    """

    readout: str | None = "fused_readout"
    sequence: str | None = "seq_len"
    batch: str | None = "batch"


#: The seed LSTM's: ``seed_lstm(fused_readout=..., seq_len=..., batch=...)``; the fixes
#: named for a problem that is not built in.
SEED_FIXES: Final = FloorFixes()


@dataclass(frozen=True)
class Model:
    """One built-in model.

    Attributes:
      name: its name (``--problem NAME``; the default problem is ``SEED_LSTM``).
      build: its builder (the library's ``seed_lstm``, ``layer_stack``).
      settings: the builder's arguments the command line may set, in the order its
        messages list them.
      fixes: its settings that lower its floor.
    """

    name: str
    build: Callable[..., Problem]
    settings: tuple[str, ...]
    fixes: FloorFixes


#: The seed LSTM, the default problem.
SEED_LSTM: Final = "seed_lstm"
#: The transformer whose layers are the scan (``autoremat._models.layer_stack``).
LAYER_STACK: Final = "layer_stack"

#: Every built-in model by name.
MODELS: Final[Mapping[str, Model]] = MappingProxyType({
    SEED_LSTM: Model(SEED_LSTM, seed_lstm,
                     ("seq_len", "batch", "hidden", "seq2seq", "fused_readout", "mesh"),
                     SEED_FIXES),
    # its scan stacks no per-step outputs, so it has no readout to move into the step
    LAYER_STACK: Model(LAYER_STACK, layer_stack,
                       ("layers", "d_model", "heads", "mlp", "seq_len", "batch"),
                       FloorFixes(readout=None)),
})


def model(name: str | None) -> Model | None:
    """The built-in model ``name`` names (``None``: the default, the seed LSTM); ``None``
    for any other name (a user's problem, ``module:name``)."""
    return MODELS[SEED_LSTM] if name is None else MODELS.get(name)


def floor_fixes(name: str | None) -> FloorFixes:
    """The fixes for a floor of problem ``name``: a built-in model's own, else the seed
    LSTM's (the settings the message points a user's problem to as an example)."""
    found = model(name)
    return SEED_FIXES if found is None else found.fixes
