"""Measurement of any ``Problem`` (it knows no model: the built-in ones are
``autoremat._models``'s).

``problem`` (a train step built for a schedule; ``from_loss``: one from an unmodified
loss), ``measure`` (compile, ``memory_analysis()``), ``timing`` (run, time) and their
record ``measurement`` (of the records in ``figures``); compiles paid once
(``compile_cache``: JAX's persistent cache in a study's folder); a failure as data (``failure``);
where the memory goes and the floor, as records (``breakdown``); the device (``device``), its
allocator (``allocator``) and a step's own need on it (``device_memory``), a run within a
budget and the least that suffices (``within``); many devices (``mesh``) and the other
processes of a lockstep tune (``peers``); is a saved
schedule stale (``stale``), and does it compile to its tuned total here (``parity``).
"""
