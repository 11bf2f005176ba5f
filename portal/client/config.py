"""Where the portal is and which token to send, from arguments or the environment.

Inside a JupyterHub single-user server (or a hub-managed service) the hub sets
``JUPYTERHUB_API_TOKEN`` and ``JUPYTERHUB_API_URL``; the portal runs as the hub service
``gpuportal``, so ``Portal()`` with no arguments works in a notebook.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from policies.errors import PortalError

URL_VAR = "GPUPORTAL_URL"
TOKEN_VARS = ("JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN")
HUB_API_URL_VAR = "JUPYTERHUB_API_URL"
SERVICE_NAME = "gpuportal"


class MissingConfiguration(PortalError):
    """The client was not told where the portal is, or which token to send."""

    code = "configuration"


def resolve_url(url: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The portal's base URL, ending in ``/``.

    In order: ``url``; ``GPUPORTAL_URL``; the hub's origin (and base URL) from
    ``JUPYTERHUB_API_URL`` plus ``services/gpuportal/``.
    """
    env = os.environ if env is None else env
    chosen = url or env.get(URL_VAR) or _from_hub_api_url(env.get(HUB_API_URL_VAR, ""))
    if not chosen:
        raise MissingConfiguration(
            f"no portal URL: pass url=..., set {URL_VAR} (e.g. "
            f"http://127.0.0.1:8000/services/{SERVICE_NAME}/), or run inside JupyterHub, which "
            f"sets {HUB_API_URL_VAR}"
        )
    parts = urlsplit(chosen)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise MissingConfiguration(
            f"invalid portal URL {chosen!r}: expected http:// or https:// with a host"
        )
    return chosen if chosen.endswith("/") else chosen + "/"


def resolve_token(token: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The API token: ``token``, else ``JUPYTERHUB_API_TOKEN``, else ``JPY_API_TOKEN``."""
    env = os.environ if env is None else env
    chosen = token or next((env[v] for v in TOKEN_VARS if env.get(v)), "")
    if not chosen:
        raise MissingConfiguration(
            f"no API token: pass token=..., or set {' or '.join(TOKEN_VARS)} (JupyterHub sets "
            "them in notebooks; get one at <hub>/hub/token)"
        )
    return chosen


def _from_hub_api_url(hub_api_url: str) -> str:
    """``http://hub:8081/prefix/hub/api`` -> ``http://hub:8081/prefix/services/gpuportal/``."""
    if not hub_api_url:
        return ""
    parts = urlsplit(hub_api_url)
    if not parts.scheme or not parts.netloc:
        return ""
    path = parts.path.rstrip("/")
    base = path.removesuffix("hub/api") if path.endswith("/hub/api") else "/"
    return f"{parts.scheme}://{parts.netloc}{base}services/{SERVICE_NAME}/"
