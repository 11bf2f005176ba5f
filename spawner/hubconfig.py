"""The hub configuration a gpuportal spawner needs, as plain data: pure, for the demo, tests and
deployments.

- the portal as a hub-managed service (``portal_service``): its own process (``gpuportal
  serve``), its own database and inventory, reached by the spawner at its ``url``;
- the spawner's own hub service and role (``spawner_service``, ``spawner_role``): a token
  with exactly the portal scopes a spawner uses, for every tenant: request, read and release
  workloads and read offers (``queue:read``). The portal service's own role grants hub
  scopes only (``portal.hubroles``), so the two identities stay apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from portal.api.auth import Scope

PORTAL_SERVICE = "gpuportal"
SPAWNER_SERVICE = "gpuportal-spawner"
SPAWNER_SCOPES: tuple[Scope, ...] = (Scope.WORKLOADS_WRITE, Scope.WORKLOADS_READ, Scope.QUEUE_READ)


def portal_service(
    url: str,
    command: Sequence[str],
    *,
    environment: Mapping[str, str],
    cwd: Path,
    api_token: str | None = None,
    name: str = PORTAL_SERVICE,
) -> dict[str, object]:
    """An entry of ``c.JupyterHub.services`` running the portal as a hub-managed service."""
    svc: dict[str, object] = {
        "name": name,
        "url": url,
        "command": list(command),
        "environment": dict(environment),
        "cwd": str(cwd),
    }
    if api_token is not None:
        svc["api_token"] = api_token
    return svc


def spawner_service(api_token: str, name: str = SPAWNER_SERVICE) -> dict[str, object]:
    """An entry of ``c.JupyterHub.services`` holding the spawner's token (no process, no URL)."""
    return {"name": name, "api_token": api_token, "display": False}


def spawner_role(name: str = SPAWNER_SERVICE) -> dict[str, object]:
    """An entry of ``c.JupyterHub.load_roles`` granting the spawner service its scopes."""
    return {
        "name": name,
        "description": "the hub's spawner: request GPUs for users, read offers and the queue",
        "services": [name],
        "scopes": [s.value for s in SPAWNER_SCOPES],
    }
