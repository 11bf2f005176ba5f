"""The portal's REST API (``/api/v1``): thin routers over the allocator, one error mapping,
JupyterHub tokens and scopes for auth. Build it with ``create_app(allocator, authenticator)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from portal.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Imported on first use: ``portal.client`` reads ``portal.api.schemas`` without loading
    # FastAPI, the allocator and SQLAlchemy (seconds per CLI call otherwise).
    if name == "create_app":
        from portal.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
