"""The security contexts that pass Pod Security ``restricted``, which every tenant namespace
enforces (``namespace.POD_SECURITY_LEVEL``): one definition for every pod the portal writes
(training members, inference replicas, Ray nodes) and for the checks on pods users bring.
"""

from __future__ import annotations

from typing import Any

RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}


def restricted_container_context(*, read_only_root: bool = False) -> dict[str, Any]:
    """A container's context: no privilege, no escalation, every capability dropped; a
    read-only root file system where the program needs none of it writable."""
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    if read_only_root:
        context["readOnlyRootFilesystem"] = True
    return context


def restricted_pod_context(uid: int, gid: int, *, fs_group: bool = True) -> dict[str, Any]:
    """A pod's context: a non-root user and group, the runtime's default seccomp profile, and
    (``fs_group``) volumes owned by the group so a non-root program can write them."""
    context: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid}
    if fs_group:
        context["fsGroup"] = gid
    context["seccompProfile"] = dict(RUNTIME_DEFAULT_SECCOMP)
    return context
