"""Ray cluster tokens derived from the portal's key (``portal.ray.tokens``): the same for a
cluster every time, different for every cluster and key, and a key kept across restarts."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pydantic import SecretStr

from policies.errors import InvalidRequest
from portal.ray.tokens import KEY_FILE, RayTokens, key_for
from portal.settings import load_settings

KEY = "k" * 32


def test_a_clusters_token_depends_on_the_key_and_the_cluster_only() -> None:
    tokens = RayTokens(KEY)
    a, b = "a" * 32, "b" * 32
    assert tokens.token(a) == RayTokens(KEY).token(a)  # re-derived, never stored
    assert len(tokens.token(a)) == 64 and int(tokens.token(a), 16) >= 0
    assert tokens.token(a) != tokens.token(b)
    assert RayTokens(KEY + "x").token(a) != tokens.token(a)
    # Neither the id nor the key shows in the token (a tenant learns nothing from its own).
    assert a not in tokens.token(a) and KEY not in repr(tokens)


def test_a_short_key_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 32 characters"):
        RayTokens("k" * 31)
    with pytest.raises(InvalidRequest) as info:
        load_settings(ray_token_key="too short")
    assert "ray_token_key" in str(info.value) and "32" in str(info.value)


def test_a_generated_key_is_kept_private_and_the_configured_one_wins(tmp_path: Path) -> None:
    first = key_for(None, tmp_path)
    assert key_for(None, tmp_path) == first  # a restart derives the same tokens
    assert len(first) >= 32
    kept = tmp_path / KEY_FILE
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert key_for(SecretStr("c" * 40), tmp_path) == "c" * 40
    assert kept.read_text().strip() == first
