"""The root of every error gpuportal raises on purpose.

Each error names what was wrong, with which value, and what would be valid. The portal adds the
errors of requests and services (``Unauthorized``, ``Expired``, ``Unavailable``...) below this
root and maps every class once to an HTTP status and a CLI exit code (``portal.errors.ERRORS``).
"""

from __future__ import annotations


class PortalError(Exception):
    """Base class. ``code`` is a stable machine-readable identifier."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(PortalError):
    """An input value is malformed or out of range."""

    code = "invalid"

    def __init__(self, field: str, value: object, valid: str) -> None:
        super().__init__(f"invalid {field} {value!s}: expected {valid}")
        self.field = field
        self.value = value
        self.valid = valid


class NotFound(PortalError):
    """A named thing (tenant, flavor, workload, node) does not exist."""

    code = "not_found"

    def __init__(self, kind: str, name: str, known: list[str] | None = None) -> None:
        hint = ""
        if known is not None:
            shown = ", ".join(sorted(known)[:10]) or "none"
            hint = f"; known {kind}s: {shown}"
        super().__init__(f"unknown {kind} {name!r}{hint}")
        self.kind = kind
        self.name = name


class Conflict(PortalError):
    """The change conflicts with the current state (stale version, duplicate, in use)."""

    code = "conflict"


class Forbidden(PortalError):
    """The caller may not do this (quota, scope, tenant membership)."""

    code = "forbidden"


class Unavailable(PortalError):
    """Something the portal depends on (the database, the hub, the inventory) did not answer,
    or this process may not write right now; retry later. ``retry_after_s``, when known, is
    how long to wait before retrying."""

    code = "unavailable"

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
