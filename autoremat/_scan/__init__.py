"""The builder: ``scan`` (``lax.scan`` semantics under a schedule) over the step's one trace
(``step_trace``, its ``checkpoint_names``), recording what it stacks (``records``) and
holding a tuned schedule to the program it was measured in (``as_tuned``); the
readout fused into the step (``fuse``); ``remat_scans``: any function's long scans
rewritten from its jaxpr (``rewrite``), moving the readout after a scan into its step
(``fuse_readout``, by ``fuse_rules``, through calls ``fuse_calls`` and inlined
``fuse_inline``). JAX's and Flax's internals are read through ``autoremat._jax`` only.
"""
