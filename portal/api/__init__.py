"""The portal's REST API (``/api/v1``): thin routers over the allocator, one error mapping,
JupyterHub tokens and scopes for auth. Build it with ``create_app(allocator, authenticator)``."""

from portal.api.app import create_app

__all__ = ["create_app"]
