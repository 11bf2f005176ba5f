"""Ray clusters' authentication tokens, derived from the portal's key instead of stored.

Every RayCluster on Kubernetes runs with Ray's token authentication, its token in a Secret
of the cluster. The portal creates that Secret but may not read Secrets back (least
privilege), yet it must present the token to read the head (idleness, unmet demand) and
hand it to the cluster's owner. So the token is a function of the cluster that only the
portal can compute: an HMAC-SHA256 of the cluster's id under the portal's key. Knowing one
cluster's token (and every id) tells nothing about another's without the key, which never
leaves the portal (docs/decisions/0016-ray-tokens-derived-from-a-portal-key.md).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from pydantic import SecretStr

MIN_KEY_LENGTH = 32
"""Characters a configured key must have at least (as many bytes of entropy for a random
one: the generated key is 64 hex characters)."""

KEY_FILE = "ray-token-key"
"""Where the embedded deployment keeps a generated key, under the state directory."""

_CONTEXT = b"gpuportal ray cluster token v1\x00"
"""Kept apart from any other use of the same key, and versioned for a change of scheme."""


class RayTokens:
    """Each cluster's token from ``key``."""

    def __init__(self, key: str) -> None:
        if len(key) < MIN_KEY_LENGTH:
            raise ValueError(f"a Ray token key has at least {MIN_KEY_LENGTH} characters")
        self._key = key.encode()

    def token(self, cluster_id: str) -> str:
        """The token of cluster ``cluster_id`` (64 hex characters)."""
        return hmac.new(self._key, _CONTEXT + cluster_id.encode(), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:
        return "RayTokens(<key>)"


def key_for(configured: SecretStr | None, state_dir: Path) -> str:
    """The configured key, or one generated once and kept in ``<state_dir>/ray-token-key``
    (readable by the portal's user only), so the tokens stay the same across restarts."""
    if configured is not None:
        return configured.get_secret_value()
    stored = state_dir / KEY_FILE
    if stored.is_file():
        kept = stored.read_text(encoding="utf-8").strip()
        if len(kept) >= MIN_KEY_LENGTH:
            return kept
    key = secrets.token_hex(32)
    state_dir.mkdir(parents=True, exist_ok=True)
    stored.touch(mode=0o600)
    stored.chmod(0o600)
    stored.write_text(key + "\n", encoding="utf-8")
    return key
