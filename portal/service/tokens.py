"""Who may call the service: static tokens from a file, then the hub.

Tokens file (``GPUPORTAL_TOKENS_FILE``), for operators, Prometheus and tests::

    tokens:
      "<a long random token>":
        name: prometheus
        kind: service            # or user
        scopes: [custom:gpuportal:metrics:read]
        groups: []               # a user's tenants

A hub-managed service asks the hub about every other token (``HubAuthenticator``). Without a
tokens file and without a hub the service refuses to start: it never serves an open API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from policies.errors import InvalidRequest
from portal.api.auth import Authenticator, Caller, CallerKind, HubAuthenticator, StaticAuthenticator

TOKENS_SETTING = "GPUPORTAL_TOKENS_FILE"
MIN_TOKEN_LENGTH = 16


class FirstThatKnows:
    """Asks each authenticator in turn; the first that knows the token answers."""

    def __init__(self, authenticators: Sequence[Authenticator]) -> None:
        self._chain = tuple(authenticators)

    def __call__(self, token: str) -> Caller | None:
        for authenticate in self._chain:
            caller = authenticate(token)
            if caller is not None:
                return caller
        return None


def hub_api_url(setting: str | None, environ: Mapping[str, str]) -> str | None:
    """The hub API to check tokens with: the setting, else the hub's service environment."""
    if setting:
        return setting
    if environ.get("JUPYTERHUB_API_TOKEN") and environ.get("JUPYTERHUB_API_URL"):
        return environ["JUPYTERHUB_API_URL"]
    return None


def build(tokens_file: Path | None, hub_url: str | None) -> Authenticator:
    """The service's authenticator.

    Raises:
        InvalidRequest: neither a tokens file nor a hub is configured, or the file is bad.
    """
    chain: list[Authenticator] = []
    if tokens_file is not None:
        chain.append(StaticAuthenticator(load(tokens_file)))
    if hub_url is not None:
        chain.append(HubAuthenticator(hub_url))
    if not chain:
        raise InvalidRequest(
            f"setting {TOKENS_SETTING}",
            "unset (and no hub: JUPYTERHUB_API_URL/JUPYTERHUB_API_TOKEN unset)",
            "a tokens file, or run the service under JupyterHub (or set GPUPORTAL_HUB_API_URL)"
            "; the API is never served without authentication",
        )
    return chain[0] if len(chain) == 1 else FirstThatKnows(chain)


def load(path: Path) -> dict[str, Caller]:
    """Read a tokens file; raises ``InvalidRequest`` naming the bad entry."""
    where = f"{TOKENS_SETTING} {path}"
    try:
        doc = yaml.safe_load(Path(path).expanduser().read_text())
    except OSError as exc:
        raise InvalidRequest(where, str(path), f"a readable file ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise InvalidRequest(where, str(path), f"valid YAML ({exc})") from exc
    if not isinstance(doc, Mapping) or not isinstance(doc.get("tokens"), Mapping):
        raise InvalidRequest(where, repr(doc)[:80], "a mapping with key tokens: {token: owner}")
    out: dict[str, Caller] = {}
    for token, owner in doc["tokens"].items():
        here = f"{where}: owner {owner.get('name') if isinstance(owner, Mapping) else owner!r}"
        if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
            raise InvalidRequest(
                f"{here} token", "<hidden>", f"a string of {MIN_TOKEN_LENGTH}+ characters"
            )
        out[token] = _caller(owner, here)
    return out


def _caller(owner: object, here: str) -> Caller:
    if not isinstance(owner, Mapping) or not isinstance(owner.get("name"), str):
        raise InvalidRequest(here, repr(owner)[:80], "{name, kind, scopes, groups}")
    kind = owner.get("kind", "service")
    if kind not in ("user", "service"):
        raise InvalidRequest(f"{here} kind", repr(kind), "user or service")
    lists: dict[str, frozenset[str]] = {}
    for key in ("scopes", "groups"):
        raw = owner.get(key) or []
        if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
            raise InvalidRequest(f"{here} {key}", repr(raw)[:80], "a list of strings")
        lists[key] = frozenset(raw)
    return Caller(owner["name"], CallerKind(kind), lists["scopes"], lists["groups"])
