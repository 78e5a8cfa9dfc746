"""Measurement: a ``Problem`` (a train step built for a schedule), compiled memory
(``memory_analysis()``) and step time as a ``Measurement``, where the memory goes, the
devices and mesh it was measured on, and whether a saved schedule is stale."""
