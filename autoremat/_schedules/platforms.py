"""Platform names, in one place: ``jax.Device.platform`` as ``Measurement.platform``
records it, grouped by what a schedule or the search does differently there.

JAX names a GPU's platform ``"gpu"``; its CUDA and ROCm plugins say ``"cuda"`` and
``"rocm"``. Any platform not named here is treated as a CPU.
"""

from __future__ import annotations

from typing import Final

#: GPUs, CUDA or ROCm: the host reads a loop's test back every iteration there (the
#: binomial kind's seeds and ``backward`` choice), and the time model's GPU prior.
GPU_PLATFORMS: Final = frozenset({"gpu", "cuda", "rocm"})
#: GPUs with CUDA's command buffers: the search's ``compiler`` choice (no ROCm).
CUDA_PLATFORMS: Final = frozenset({"gpu", "cuda"})
#: Accelerators with host memory to offload to: the ``offload_*`` policies.
OFFLOAD_PLATFORMS: Final = GPU_PLATFORMS | {"tpu"}
#: Platforms whose runtime books a program's temporaries as a reservation
#: (``bytes_reserved``), not in ``bytes_in_use`` (``autoremat._measure.device_memory``).
RESERVING_PLATFORMS: Final = frozenset({"tpu"})
