"""JupyterHub spawners for gpuportal.

``GPULocalSpawner`` (local processes) and ``GPUKubeSpawner`` (Kubernetes pods) share
``GPUPortalMixin``: the options form from live offers, server-side checks of ``user_options``,
visible queueing and the allocation's lifecycle. Registered as the ``jupyterhub.spawners``
entry points ``gpuportal-local`` and ``gpuportal-kube``. Imported lazily: the Kubernetes
spawner pulls in kubespawner.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "GPUPortalMixin": "spawner.mixin",
    "GPUAllocation": "spawner.mixin",
    "GPULocalSpawner": "spawner.local",
    "GPUSimpleLocalSpawner": "spawner.local",
    "GPUKubeSpawner": "spawner.kube",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'spawner' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
