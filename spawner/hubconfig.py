"""The hub configuration a gpuportal spawner needs, as plain data: pure, for the demo, tests and
deployments.

- the portal as a hub-managed service (``portal_service``): its own process (``gpuportal
  serve``), its own database and inventory, reached by the spawner at its ``url``;
- the spawner's own hub service and role (``spawner_service``, ``spawner_role``): a token
  with exactly the portal scopes a spawner uses, for every tenant: request, read and release
  workloads and read offers (``queue:read``). The portal service's own role grants hub
  scopes only (``portal.hubroles``), so the two identities stay apart;
- the scopes of each server's own token (``server_token_scopes``, for
  ``c.Spawner.server_token_scopes``): the hub's defaults plus every portal scope a tenant admin
  may hold, of which the hub gives each server the part its user holds, tenant filters kept, so
  ``Portal()`` and ``gpuportal`` work inside a notebook as that user.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from portal.api.auth import Scope
from portal.hubroles import TENANT_ADMIN_SCOPES

PORTAL_SERVICE = "gpuportal"
SPAWNER_SERVICE = "gpuportal-spawner"
SPAWNER_SCOPES: tuple[Scope, ...] = (Scope.WORKLOADS_WRITE, Scope.WORKLOADS_READ, Scope.QUEUE_READ)
# What JupyterHub's `server` role gives a server's token; asking for scopes replaces it.
_SERVER_DEFAULT_SCOPES = ("users:activity!user", "access:servers!server")


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


def server_token_scopes() -> list[str]:
    """``c.Spawner.server_token_scopes``: the server role's scopes plus the portal's, unfiltered
    here; the hub intersects them with the user's own (``!group=<tenant>`` filters included),
    so nobody gains a scope by them. ``custom:gpuportal:admin`` is not asked for: a notebook's
    token never carries it."""
    return [*_SERVER_DEFAULT_SCOPES, *(s.value for s in TENANT_ADMIN_SCOPES)]
