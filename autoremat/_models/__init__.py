"""The built-in models: the seed LSTM (``seed_lstm``) and the layer stack
(``layer_stack``), each a ``Problem`` the measurement and the search take like a user's;
and ``maxtext``, a MaxText model (its config and overrides) as a ``Problem`` run by
MaxText's own train step (optional: ``autoremat[maxtext]``; not in the registry: the
``autoremat maxtext`` command builds it).

Their registry, ``MODELS`` (looked up by ``model``), the one place a built-in model is
declared: per name, its builder, the settings the command line may pass it, its sizes
(each an option ``--NAME`` with its default), how the command's settings become the
builder's arguments, and the settings that lower its floor (``FloorFixes``: the bytes no
schedule removes, ``autoremat._measure.breakdown.Floor``). The command line
(``autoremat._cli.settings``, ``autoremat._cli.problems``) makes its options from it,
builds ``--problem NAME`` from it and names its fixes: a new built-in model is one entry
here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from inspect import signature
from types import MappingProxyType
from typing import Any, Final

from autoremat._errors import ProblemError
from autoremat._measure.problem import Problem
from autoremat._models.layer_stack import DEFAULT as STACK
from autoremat._models.layer_stack import layer_stack
from autoremat._models.seed_lstm import seed_batch, seed_lstm


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
class Size:
    """A size of a built-in model: a whole number >= 1 the command line sets as ``--NAME``.

    Attributes:
      name: the builder's argument (and the study file's key).
      help: what it sizes, in a few words.
      default: the builder's default.
    """

    name: str
    help: str
    default: int


def _as_given(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A model's builder arguments: the settings given, as they are."""
    return dict(settings)


@dataclass(frozen=True)
class Model:
    """One built-in model.

    Attributes:
      name: its name (``--problem NAME``; the default problem is ``SEED_LSTM``).
      build: its builder (the library's ``seed_lstm``, ``layer_stack``).
      settings: the builder's arguments the command line may set, in the order its
        messages list them.
      fixes: its settings that lower its floor.
      summary: what it is, for ``--problem``'s help.
      sizes: its sizes among ``settings`` (options taking a whole number), with defaults.
      arguments: the builder's keyword arguments from the settings given (each one of
        ``settings``); raises ``ProblemError`` naming a setting where two conflict.
    """

    name: str
    build: Callable[..., Problem]
    settings: tuple[str, ...]
    fixes: FloorFixes
    summary: str = ""
    sizes: tuple[Size, ...] = ()
    arguments: Callable[[Mapping[str, Any]], dict[str, Any]] = _as_given


#: The seed LSTM, the default problem.
SEED_LSTM: Final = "seed_lstm"
#: The transformer whose layers are the scan (``autoremat._models.layer_stack``).
LAYER_STACK: Final = "layer_stack"



def _seed_arguments(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The command line's seed LSTM: its readout fused into the step or not as the search
    chooses (``fused_readout=None``) unless a setting forces one; with the loss on the last
    state (``seq2seq=False``) nothing is stacked, so there is nothing to fuse."""
    arguments = dict(settings)
    if arguments.get("seq2seq", True):
        arguments.setdefault("fused_readout", None)
    elif arguments.get("fused_readout"):
        raise ProblemError("fused_readout: the loss on the last state (seq2seq=False) stacks "
                           "no outputs, so there is nothing to fuse; drop one of the two")
    else:
        arguments["fused_readout"] = False
    return arguments


_SEED_DEFAULTS: Final = {k: v.default for k, v in signature(seed_lstm).parameters.items()}

#: Every built-in model by name.
MODELS: Final[Mapping[str, Model]] = MappingProxyType({
    SEED_LSTM: Model(
        SEED_LSTM, seed_lstm,
        ("seq_len", "batch", "hidden", "seq2seq", "fused_readout", "mesh"), SEED_FIXES,
        f"the seed LSTM (hidden {_SEED_DEFAULTS['hidden']}, batch {seed_batch(None, None)}, "
        f"T={_SEED_DEFAULTS['seq_len']:,}, seq2seq, Adam; its readout fused into the scanned "
        "step or not, as the search chooses)",
        (Size("seq_len", "sequence length", _SEED_DEFAULTS["seq_len"]),
         Size("batch", "batch size", seed_batch(None, None)),
         Size("hidden", "LSTM width", _SEED_DEFAULTS["hidden"])),
        _seed_arguments),
    # its scan stacks no per-step outputs, so it has no readout to move into the step
    LAYER_STACK: Model(
        LAYER_STACK, layer_stack,
        ("layers", "d_model", "heads", "mlp", "seq_len", "batch"), FloorFixes(readout=None),
        "a decoder-only transformer whose scan is over its layers (bfloat16, MaxText's "
        "checkpoint names)",
        (Size("layers", "transformer blocks, the scan's length", STACK.layers),
         Size("d_model", "model width", STACK.d_model),
         Size("heads", "attention heads, dividing d_model", STACK.heads),
         Size("mlp", "MLP width", STACK.mlp),
         Size("seq_len", "tokens", STACK.seq_len),
         Size("batch", "batch size", STACK.batch))),
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
