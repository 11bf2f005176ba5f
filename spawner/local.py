"""``GPULocalSpawner``: JupyterHub's local-process spawner, pinned to the allocated devices.

The server process gets ``CUDA_VISIBLE_DEVICES`` (and ``NVIDIA_VISIBLE_DEVICES``) with the
allocated GPU or MIG UUIDs (GPU indices where the inventory has no UUIDs; empty for CPU only, so
the process sees no GPU), MPS limits for a fractional share
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` from the share, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` from
its memory), and ``GPUPORTAL_*`` variables describing the allocation.

``GPUSimpleLocalSpawner`` does the same as the hub's own user, in a home directory per user from
a template (like JupyterHub's ``SimpleLocalProcessSpawner``): for demos and tests only.
"""

from __future__ import annotations

import math
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner

from policies.flavors import MILLI_PER_GPU
from spawner.mixin import GPUAllocation, GPUPortalMixin, allocation_env


def device_env(a: GPUAllocation) -> dict[str, str]:
    """The CUDA variables that confine a process to ``a``'s devices."""
    known = a.gpu_uuids and all(a.gpu_uuids)  # some inventories (Kubernetes labels) lack UUIDs
    visible = ",".join(a.gpu_uuids) if known else ",".join(map(str, a.gpus))
    env = {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible or "void"}
    if a.workload_id and 0 < a.milli < MILLI_PER_GPU:
        # MPS: the share of the GPU's SMs, and its memory on the one visible device (ordinal 0).
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(math.ceil(a.milli * 100 / MILLI_PER_GPU))
        if a.gpu_memory_mib:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={a.gpu_memory_mib}M"
    return env


class GPULocalSpawner(GPUPortalMixin, LocalProcessSpawner):  # type: ignore[misc]
    """Local server processes on the devices the portal allocated (see the module docstring)."""

    def get_env(self) -> dict[str, Any]:
        env: dict[str, Any] = super().get_env()
        if self.allocation is not None:
            env.update(device_env(self.allocation))
            env.update(allocation_env(self.allocation))
        return env


class GPUSimpleLocalSpawner(GPULocalSpawner, SimpleLocalProcessSpawner):  # type: ignore[misc]
    """``GPULocalSpawner`` as the hub's own user with per-user home directories (demo, tests)."""
