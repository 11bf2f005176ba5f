"""One error root, one table: every portal error has its HTTP status and exit code in
``portal.errors.ERRORS``, the API answers with that status, and the client raises the same
class back from the answer."""

from __future__ import annotations

import inspect
import json

import httpx
import pytest

import policies.errors
import portal.errors
from portal.api.errors import body_of
from portal.client.errors import ApiError, error_from_response
from portal.errors import ERRORS, PortalError, PortalUnreachable


def _defined(module: object) -> set[type[PortalError]]:
    return {
        cls
        for _name, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, PortalError) and cls.__module__ == getattr(module, "__name__", "")
    }


ALL = _defined(policies.errors) | _defined(portal.errors)


def test_every_error_class_has_its_own_row() -> None:
    assert {cls for cls, _status, _exit in ERRORS} == ALL


def test_no_row_is_hidden_behind_a_row_of_its_base() -> None:
    for i, (cls, _status, _exit) in enumerate(ERRORS):
        earlier = [base for base, _s, _e in ERRORS[:i] if issubclass(cls, base)]
        assert earlier == [], f"{cls.__name__} comes after its base {earlier}"


def _instance(cls: type[PortalError]) -> PortalError:
    if issubclass(cls, policies.errors.InvalidRequest):
        return cls("count", -1, "a whole number from 1")  # type: ignore[call-arg]
    if issubclass(cls, policies.errors.NotFound):
        return cls("tenant", "team-z", ["team-a"])  # type: ignore[call-arg]
    if cls is PortalUnreachable:
        return PortalUnreachable("http://portal", OSError("refused"))
    return cls("something was wrong")


@pytest.mark.parametrize(
    ("cls", "status"),
    [(cls, status) for cls, status, _exit in ERRORS if cls not in (PortalError, PortalUnreachable)],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_the_client_raises_the_class_the_api_answered_with(
    cls: type[PortalError], status: int
) -> None:
    sent = _instance(cls)
    body = body_of(sent)
    assert body.status == status
    request = httpx.Request("GET", "http://portal/api/v1/x")
    answer = httpx.Response(
        status, content=json.dumps(body.model_dump(exclude_none=True)), request=request
    )
    raised = error_from_response(answer)
    assert isinstance(raised, cls) and isinstance(raised, ApiError)
    assert (raised.status, raised.code, raised.message) == (status, sent.code, sent.message)
