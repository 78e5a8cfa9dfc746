"""``tune --coordinator``: join a multi-controller job before the problem is built.

Every process of the job runs the same ``autoremat tune`` command; with ``--coordinator``
each first calls ``jax.distributed.initialize`` (``join``), so the built-in problem's
``--mesh`` spans every process's devices and ``tune`` runs in lockstep
(``autoremat._search.lockstep``). ``auto`` leaves everything to JAX, which reads the
cluster's environment (a Cloud TPU pod slice, SLURM, Open MPI, Kubernetes; the
coordinator from the environment variable JAX_COORDINATOR_ADDRESS where set); ``HOST:PORT,PROCESSES,INDEX``
gives it all (a multi-node GPU job started by hand).
"""

from __future__ import annotations

from typing import Any, Final

#: ``--coordinator``'s help.
COORDINATOR_HELP: Final = (
    "tune on every process of a multi-controller job (the same command on each): 'auto' "
    "(jax.distributed.initialize() reads the cluster's environment: a TPU pod slice, SLURM, "
    "Open MPI) or HOST:PORT,PROCESSES,INDEX (process INDEX of PROCESSES, process 0 serving "
    "HOST:PORT); process 0 alone writes the study and the schedule")
_FORM: Final = "'auto' or HOST:PORT,PROCESSES,INDEX such as 10.0.0.2:8476,2,0"


def parse_coordinator(text: str) -> tuple[str | None, int | None, int | None]:
    """``(address, processes, index)`` for ``jax.distributed.initialize`` (``None``: JAX
    finds it).

    Raises:
      ValueError: not ``auto`` nor ``HOST:PORT,PROCESSES,INDEX`` with ``0 <= INDEX <
        PROCESSES``.
    """
    text = text.strip()
    if text == "auto":
        return None, None, None
    parts = [p.strip() for p in text.split(",")]
    if (len(parts) != 3 or ":" not in parts[0] or not parts[0].rpartition(":")[2].isdigit()
            or not parts[1].isdigit() or not parts[2].isdigit()):
        raise ValueError(f"expected {_FORM}, got {text!r}")
    processes, index = int(parts[1]), int(parts[2])
    if processes < 1 or index >= processes:
        raise ValueError(f"INDEX {index} is not one of the {processes} processes (0 to "
                         f"{processes - 1}); expected {_FORM}")
    return parts[0], processes, index


def check_coordinator(value: Any) -> str | None:
    """The setting's check: ``None`` when ``value`` reads, else what it should be."""
    try:
        parse_coordinator(value if isinstance(value, str) else "")
    except ValueError:
        return _FORM
    return None


def join(coordinator: str | None) -> str:
    """Join the job (``jax.distributed.initialize``; Gloo for CPU collectives); a line
    saying which process this is (``""`` without ``coordinator``)."""
    if coordinator is None:
        return ""
    import jax

    address, processes, index = parse_coordinator(coordinator)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices only
    jax.distributed.initialize(address, processes, index)
    role = "decides, writes the study and the schedule" if jax.process_index() == 0 else \
        "compiles and runs what process 0 measures"
    return (f"process {jax.process_index()} of {jax.process_count()}: "
            f"{jax.local_device_count()} of {jax.device_count()} devices here; {role}")


def deciding() -> bool:
    """This process decides (process 0 of a job, or the only one)."""
    import jax

    return jax.process_index() == 0


def written_line(out: str) -> str:
    """What ``tune`` prints where the schedule was written: ``wrote OUT`` on process 0
    (and alone), on another process where it is."""
    if deciding():
        return f"wrote {out}"
    import jax

    return f"process {jax.process_index()}: process 0 wrote {out} on its host"
