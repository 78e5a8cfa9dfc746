"""Flax drop-ins over the builder: ``nn.scan`` (``linen_scan``), ``nn.RNN`` and ``nnx.RNN``
(``rnn``: what both share; ``linen_rnn``), ``nnx.scan`` (``nnx_scan``) and ``remat_scans``
for NNX modules (``nnx_remat_scans``). The public faces are ``autoremat.linen`` and
``autoremat.nnx``."""
