"""Who is looking: the viewer's hub identity and token, per Panel session.

Production is ``HubOAuthIdentity``: the dashboards run as a JupyterHub service; Bokeh's auth
hook sends people without a login through the hub's OAuth, the callback stores the viewer's
OAuth token in a signed cookie, and each session reads that token back and asks the hub who
owns it (name, groups, scopes). The *viewer's* token is what the dashboards send to the portal,
so the portal, not the dashboards, decides what each person may see.

For the service's OAuth tokens to carry the portal's scopes, grant them to the service's OAuth
clients (``oauth_client_allowed_scopes`` of the service, see ``docs/dashboards.md``).

``TokenArgIdentity`` is the development and test setting: the token comes from the page's
``?token=`` argument and its owner from a fixed table. It is off unless the app is started
with one (``gpuportal dashboards --dev-identities FILE``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from policies.errors import InvalidRequest
from portal.api.auth import Caller, CallerKind, caller_from_hub_model


@dataclass(frozen=True, slots=True)
class Identity:
    """A viewer and the hub token the dashboards act with on their behalf."""

    viewer: Caller
    token: str


class SessionRequest(Protocol):
    """What a Bokeh session knows of the page request (``session_context.request``)."""

    @property
    def cookies(self) -> Mapping[str, str]: ...

    @property
    def arguments(self) -> Mapping[str, list[bytes]]: ...


class Identify(Protocol):
    """Turns a session's request into the viewer, or None (the page then says to log in)."""

    def __call__(self, request: SessionRequest) -> Identity | None: ...


class TokenArgIdentity:
    """Development and tests only: ``?token=T`` names the viewer ``tokens[T]``."""

    def __init__(self, tokens: Mapping[str, Caller]) -> None:
        self._tokens = dict(tokens)

    def __call__(self, request: SessionRequest) -> Identity | None:
        raw = request.arguments.get("token") or [b""]
        token = raw[0].decode("utf-8", "replace")
        viewer = self._tokens.get(token)
        return Identity(viewer, token) if viewer is not None else None

    @classmethod
    def from_file(cls, path: Path) -> TokenArgIdentity:
        """Read ``{"<token>": {"name": ..., "scopes": [...], "groups": [...]}}``."""
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            problem = f"readable JSON ({exc})"
            raise InvalidRequest("dev identities file", str(path), problem) from exc
        if not isinstance(raw, dict):
            raise InvalidRequest("dev identities file", str(path), "a JSON object of tokens")
        tokens: dict[str, Caller] = {}
        for token, model in raw.items():
            if not isinstance(model, dict) or not isinstance(model.get("name"), str):
                raise InvalidRequest(
                    "dev identity", str(token), '{"name": str, "scopes": [...], "groups": [...]}'
                )
            tokens[str(token)] = caller_from_hub_model(model)
        return cls(tokens)


class HubOAuthIdentity:
    """The viewer from the hub's OAuth cookie (set by ``HubOAuthCallbackHandler``).

    Args:
        hub_auth: a ``jupyterhub.services.auth.HubOAuth`` (configured from the service's
            environment variables).
        cookie_secret: the secret the Tornado application signs cookies with.
    """

    def __init__(self, hub_auth: Any, cookie_secret: str) -> None:
        self._hub_auth = hub_auth
        self._secret = cookie_secret

    def __call__(self, request: SessionRequest) -> Identity | None:
        from tornado.web import decode_signed_value

        name = self._hub_auth.cookie_name
        raw = request.cookies.get(name)
        if not raw:
            return None
        token = decode_signed_value(self._secret, name, raw)
        if token is None:
            return None
        token_text = token.decode("utf-8") if isinstance(token, bytes) else str(token)
        model = self._hub_auth.user_for_token(token_text)
        if not model:
            return None
        viewer = caller_from_hub_model(model)
        if viewer.kind is not CallerKind.USER:
            return None
        return Identity(viewer, token_text)
