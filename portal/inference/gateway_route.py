"""The gateway's three routes served ahead of FastAPI's router (``GatewayRoute``).

Each gateway request would otherwise walk FastAPI's route table (about 120 routes, a regular
expression each) and solve the route's dependencies; at hundreds of requests a second that
is CPU the gateway's budget (2 ms added per request) cannot spare. ``GatewayRoute`` is the
router's first route: it recognizes ``GET .../v1/models``, ``POST .../v1/chat/completions``
and ``POST .../v1/completions`` under ``/gateway/{tenant}/{service}`` by splitting the path,
and calls the same code the FastAPI routes in ``portal.inference.gateway`` call, in the same
order: authentication and the ``services:call`` scope (``portal.api.deps.Requires``), then
the path's tenant and service name checked by the same rules (a 422 naming the field), then
``Gateway.resolve``/``forward`` (the tenant's scope, the hold, the metrics). Its errors are
raised, so the app's error handlers answer them as for any route, and the request
middleware (metrics, access line) sees it like any other.

Anything else under ``/gateway`` (another method, another path) is left to FastAPI's
routes, which stay registered: they document the API (OpenAPI, the API reference) and answer
what this route does not take (405, 404) as before.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError
from starlette.routing import BaseRoute, Match
from starlette.types import Receive, Scope, Send

from portal.api.auth import Scope as PortalScope
from portal.api.deps import Requires
from portal.api.inputs import KEY, Label, bounded
from portal.inference.gateway import Gateway, models_answer

PREFIX = "/gateway/"


class Operation(Enum):
    MODELS = "/v1/models"
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", "models"): Operation.MODELS,
    ("POST", "chat/completions"): Operation.CHAT,
    ("POST", "completions"): Operation.COMPLETIONS,
}
"""(method, the path after ``/v1/``) -> operation."""

CALLER = Requires(PortalScope.SERVICES_CALL)
TENANT = TypeAdapter(Label)
SERVICE = TypeAdapter(Annotated[str, bounded(KEY, 63)])


def _route_path(scope: Scope) -> str:
    """The path inside the app (a mount's ``root_path`` taken off), as the router matches."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :]
    return path


class GatewayRoute(BaseRoute):
    """The gateway's routes, without the route walk and the dependency solving."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http":
            return Match.NONE, {}
        path = _route_path(scope)
        if not path.startswith(PREFIX):
            return Match.NONE, {}
        # "", "gateway", tenant, service, "v1", rest...
        parts = path.split("/", 5)
        if len(parts) != 6 or parts[4] != "v1" or not parts[2] or not parts[3]:
            return Match.NONE, {}
        op = OPERATIONS.get((scope["method"], parts[5]))
        if op is None:
            return Match.NONE, {}
        return Match.FULL, {"path_params": {"tenant": parts[2], "service": parts[3]},
                            "gateway_operation": op}  # fmt: skip

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        app = request.app
        token = request.headers.get("authorization")
        caller = await CALLER(request, token, app.state.authenticator)
        tenant, service = _checked(scope["path_params"])
        gateway: Gateway = app.state.gateway
        op: Operation = scope["gateway_operation"]
        response: Response
        if op is Operation.MODELS:
            await gateway.resolve(caller, tenant, service)
            response = models_answer(tenant, service)
        else:
            response = await gateway.forward(request, caller, tenant, service, op.value)
        await response(scope, receive, send)


def _checked(params: dict[str, str]) -> tuple[str, str]:
    """The tenant and service name, or the 422 FastAPI's path validation gives (every
    offending parameter, under ``path``)."""
    errors: list[dict[str, object]] = []
    out: list[str] = []
    for name, adapter in (("tenant", TENANT), ("service", SERVICE)):
        try:
            out.append(adapter.validate_python(params[name]))
        except ValidationError as exc:
            errors += [{**e, "loc": ("path", name, *e["loc"])} for e in exc.errors()]
    if errors:
        raise RequestValidationError(errors)
    return out[0], out[1]
