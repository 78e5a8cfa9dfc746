"""The builder: ``scan`` (``lax.scan`` semantics under a schedule) over the step's one trace
(``step_trace``, its ``checkpoint_names``), recording what it stacks (``records``) and
holding a tuned schedule to the program it was measured in (``as_tuned``); the
readout fused into the step (``fuse``); ``remat_scans``: any function's long scans
rewritten from its jaxpr (``rewrite``), moving the readout after a scan into its step
(``fuse_readout``, by ``fuse_rules``, through calls ``fuse_calls`` and inlined
``fuse_inline``). Here JAX's and Flax's private names live in ``jax_internals`` only; below,
the binomial builder reads JAX's tracer classes itself (``_schedules/binomial_scan.py``,
which cannot import this stage).
"""
