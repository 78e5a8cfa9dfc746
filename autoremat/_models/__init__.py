"""The built-in models: the seed LSTM (``seed_lstm``) and the layer stack
(``layer_stack``), each a ``Problem`` the measurement and the search take like a user's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


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


#: The seed LSTM's: ``seed_lstm(fused_readout=..., seq_len=..., batch=...)``.
SEED_FIXES: Final = FloorFixes()
