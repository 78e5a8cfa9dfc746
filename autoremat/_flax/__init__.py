"""Flax drop-ins over the builder: ``nn.scan``, ``nn.RNN``, ``nnx.scan``, ``nnx.RNN`` and
``remat_scans`` for NNX modules. The public faces are ``autoremat.linen`` and ``autoremat.nnx``."""
