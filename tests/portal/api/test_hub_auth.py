"""``HubAuthenticator`` against a hub answering over HTTP (an ``httpx`` transport here; the
``hub``-marked test in ``test_hub_integration.py`` uses a real JupyterHub)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from portal.api.auth import MISS, CallerKind, HubAuthenticator, Scope, token_from_header
from portal.api.deps import authenticate
from portal.errors import Unauthorized, Unavailable

ALICE = {
    "kind": "user",
    "name": "alice",
    "groups": ["team-a"],
    "scopes": [f"{Scope.QUOTAS_READ}!group=team-a", "read:users!user=alice"],
}


class FakeHub:
    def __init__(self) -> None:
        self.asked: list[str] = []
        self.down = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/hub/api/user"
        self.asked.append(request.headers["Authorization"])
        if self.down:
            return httpx.Response(502)
        if request.headers["Authorization"] == "token good":
            return httpx.Response(200, json=ALICE)
        return httpx.Response(403, json={"status": 403, "message": "Forbidden"})


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def make(hub: FakeHub, clock: Clock) -> HubAuthenticator:
    client = httpx.Client(transport=httpx.MockTransport(hub))
    return HubAuthenticator("http://hub/hub/api/", ttl_s=30, client=client, clock=clock)


def test_the_hub_model_becomes_a_caller_and_is_cached_for_the_ttl() -> None:
    hub, clock = FakeHub(), Clock()
    auth = make(hub, clock)
    caller = auth("good")
    assert caller is not None
    assert (caller.name, caller.kind, caller.groups) == ("alice", CallerKind.USER, {"team-a"})
    assert caller.can(Scope.QUOTAS_READ, "team-a") and not caller.can(Scope.QUOTAS_READ, "team-b")
    assert auth("good") == caller and hub.asked == ["token good"]
    clock.now = 31
    assert auth("good") == caller and len(hub.asked) == 2


def test_unknown_tokens_are_none_and_cached_too() -> None:
    hub, clock = FakeHub(), Clock()
    auth = make(hub, clock)
    assert auth("bad") is None and auth("bad") is None
    assert hub.asked == ["token bad"]


def test_a_hub_that_does_not_answer_is_unavailable_not_unauthorized() -> None:
    hub, clock = FakeHub(), Clock()
    hub.down = True
    with pytest.raises(Unavailable):
        make(hub, clock)("good")


@pytest.mark.parametrize("header", [None, "", "token", "Basic x", "token   "])
def test_a_missing_or_malformed_header_is_unauthorized(header: str | None) -> None:
    with pytest.raises(Unauthorized):
        token_from_header(header)


@pytest.mark.parametrize("header", ["token abc", "Bearer abc", "bearer  abc "])
def test_token_and_bearer_headers_carry_the_token(header: str) -> None:
    assert token_from_header(header) == "abc"


def test_only_a_fresh_cached_answer_is_given_from_memory_and_the_rest_asks_the_hub() -> None:
    hub, clock = FakeHub(), Clock()
    auth = make(hub, clock)
    assert auth.remembered("good") is MISS and auth.remembered("bad") is MISS
    assert hub.asked == []  # remembering never asks
    assert asyncio.run(authenticate(auth, "good")) == auth("good")
    assert asyncio.run(authenticate(auth, "bad")) is None
    assert len(hub.asked) == 2
    # From memory now: alice, and "nobody" for the unknown token, without asking again.
    known = auth.remembered("good")
    assert known is not MISS and known is not None and known.name == "alice"
    assert auth.remembered("bad") is None
    assert asyncio.run(authenticate(auth, "good")) == known and len(hub.asked) == 2
    # Stale after the TTL: the event loop's path misses, and the hub is asked again.
    clock.now = 31
    assert auth.remembered("good") is MISS
    assert asyncio.run(authenticate(auth, "good")) == known and len(hub.asked) == 3
