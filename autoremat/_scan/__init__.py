"""The builder: ``autoremat.scan`` (``lax.scan`` semantics under a schedule), the step's
one trace, the readout fused into the step, and ``remat_scans`` (any function's long
scans rewritten from its jaxpr). JAX's private names live in ``jax_internals`` only."""
