"""Bad input at the API boundary answers 422 naming the field, the value and what is valid, and
changes nothing, on SQLite and PostgreSQL alike (PostgreSQL refuses NUL bytes in text, so an
unchecked one used to answer 500 and drop the connection)."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from pydantic import BaseModel

from policies.quota import MAX_WEIGHT
from portal.allocator import Allocator
from portal.api.inputs import rule_of
from tests.portal.api.conftest import auth, gpu_request

NUL = "a\x00b"

# A real value for every path parameter any route uses; a new one must be added here.
PATH_VALUES = {
    "tenant": "team-a",
    "flavor": "H100-80GB",
    "node": "n1",
    "workload_id": "",
    "service_id": "none",
    "service": "none",
}
# A valid body for the routes that take one, so the only error is the parameter under test.
BODIES: dict[tuple[str, str], dict[str, object]] = {
    ("PUT", "/api/v1/tenants/{tenant}"): {"weight": 1.0},
    ("PUT", "/api/v1/tenants/{tenant}/quotas/{flavor}"): {"guaranteed": 1, "limit": 2},
    ("POST", "/api/v1/workloads"): gpu_request(),
    ("POST", "/api/v1/telemetry/samples"): {"node": "n1", "source": "nvml", "samples": []},
}


@pytest.fixture
def store_url(db_url: str) -> str:
    return db_url


@pytest.fixture
def workload_id(client: TestClient) -> str:
    r = client.post("/api/v1/workloads", json=gpu_request(), headers=auth("alice"))
    assert r.status_code == 201, r.text
    wid: str = r.json()["id"]
    return wid


def _holds_str(annotation: Any) -> bool:
    """Whether a parameter's type is, or holds, a string (``str | None``, ``list[str]``)."""
    if isinstance(annotation, type):
        return issubclass(annotation, str)
    return any(_holds_str(a) for a in typing.get_args(annotation))


def string_parameters(app: FastAPI) -> list[tuple[str, str, str, str]]:
    """(method, path, "path" or "query", name) for every string parameter of every route in
    the app's route table, dependencies' included."""
    out = []
    for route in iter_route_contexts(app.routes):
        if not isinstance(route.original_route, APIRoute):
            continue
        pending = [route.dependant]
        while pending:
            dep = pending.pop()
            pending += dep.dependencies
            for where, params in (("path", dep.path_params), ("query", dep.query_params)):
                for p in params:
                    if _holds_str(p.field_info.annotation):
                        for method in sorted(route.methods or ()):
                            out.append((method, route.path_format, where, p.alias))
    return sorted(set(out))


def test_the_route_table_lists_the_string_parameters_that_answered_500(app: FastAPI) -> None:
    found = set(string_parameters(app))
    for case in [
        ("GET", "/api/v1/workloads/{workload_id}", "path", "workload_id"),
        ("DELETE", "/api/v1/workloads/{workload_id}", "path", "workload_id"),
        ("GET", "/api/v1/cost", "query", "tenant"),
        ("GET", "/api/v1/cost/chargeback", "query", "tenant"),
        ("GET", "/api/v1/telemetry/series", "query", "device"),
        ("GET", "/api/v1/telemetry/series", "query", "workload_id"),
        ("GET", "/api/v1/alerts", "query", "rule"),
        ("POST", "/api/v1/workloads", "query", "owner"),
    ]:
        assert case in found
    assert len(found) >= 25


def test_every_string_parameter_with_a_nul_byte_answers_422_naming_it(
    app: FastAPI, client: TestClient, allocator: Allocator, workload_id: str
) -> None:
    version = client.get("/api/v1/nodes", headers=auth("root")).headers["Inventory-Version"]
    required = {("GET", "/api/v1/inventory/changes"): {"since": version}}
    wrong = []
    for method, path, where, name in string_parameters(app):
        values = {**PATH_VALUES, "workload_id": workload_id}
        query: dict[str, str] = dict(required.get((method, path), {}))
        if where == "path":
            values[name] = NUL
        else:
            query[name] = NUL
        url = path.format(**{k: quote(v, safe="/") for k, v in values.items()})
        r = client.request(
            method,
            url,
            params=query,
            json=BODIES.get((method, path)),
            headers={**auth("root"), "If-Match": '"1"'},
        )
        body = r.json()
        if (
            r.status_code != 422
            or body.get("field") not in (name, f"{name}.0")  # a list's first item
            or "'a\\x00b'" not in body.get("message", "")
        ):
            wrong.append(f"{method} {path} {where} {name}: {r.status_code} {body}")
    assert wrong == []
    # Nothing reached the database: the connection is fine and nothing changed.
    assert [t.version for t in allocator.tenants()] == [1, 1]
    r = client.get(f"/api/v1/workloads/{workload_id}", headers=auth("alice"))
    assert r.status_code == 200 and r.json()["state"] == "running"


def _unruled_strings(tp: Any, metadata: list[Any], where: str) -> Iterator[str]:
    """Places under ``where`` holding a string without a ``StringRule``."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        for name, f in tp.model_fields.items():
            yield from _unruled_strings(f.annotation, list(f.metadata), f"{where}.{name}")
        return
    if typing.get_origin(tp) is typing.Annotated:
        yield from _unruled_strings(tp.__origin__, [*metadata, *tp.__metadata__], where)
        return
    if tp is str:
        if rule_of(metadata) is None:
            yield where
        return
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            yield from _unruled_strings(arg, metadata, where)
    elif origin in (list, tuple, set, frozenset):
        for arg in typing.get_args(tp):
            yield from _unruled_strings(arg, [], f"{where}[]")


# The telemetry ingest body is the telemetry package's wire format; it keeps its own patterns.
OWN_RULES = {"POST /api/v1/telemetry/samples"}


def test_every_string_of_every_request_body_follows_a_string_rule(app: FastAPI) -> None:
    unruled = []
    for route in iter_route_contexts(app.routes):
        if not isinstance(route.original_route, APIRoute):
            continue
        for method in route.methods or ():
            if f"{method} {route.path_format}" in OWN_RULES:
                continue
            for b in route.dependant.body_params:
                unruled += _unruled_strings(b.field_info.annotation, [], f"{method} {b.name}")
    assert unruled == []


def test_a_nul_byte_in_a_body_string_answers_422_and_creates_nothing(
    client: TestClient, allocator: Allocator
) -> None:
    for body, field in [
        (gpu_request(name=NUL), "name"),
        ({**gpu_request(), "devices": {"kind": "gpu", "count": 1, "models": [NUL]}}, "models"),
    ]:
        r = client.post("/api/v1/workloads", json=body, headers=auth("alice"))
        assert r.status_code == 422, r.text
        assert r.json()["field"].startswith(("name", "devices.models.0")), r.json()
        assert "'a\\x00b'" in r.json()["message"], field
    lone_surrogate = b'{"tenant": "team-a", "name": "\\ud800", "devices": {}}'
    r = client.post(
        "/api/v1/workloads",
        content=lone_surrogate,
        headers={**auth("alice"), "Content-Type": "application/json"},
    )
    assert r.status_code == 422 and r.json()["field"] == "name", r.text
    assert allocator.workloads() == []


@pytest.mark.parametrize("pool", ["", "../../etc", "gpu pool", "🚀", "x" * 10_000, NUL])
def test_a_pool_that_is_not_a_label_value_is_refused(
    client: TestClient, allocator: Allocator, pool: str
) -> None:
    r = client.put(
        "/api/v1/tenants/team-a",
        json={"pools": ["ok", pool]},
        headers={**auth("root"), "If-Match": '"1"'},
    )
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["field"] == "pools.1" and "Kubernetes label value" in err["valid"]
    assert len(err["message"]) < 400  # a 10,000-character value is cut
    assert [(t.pools, t.version) for t in allocator.tenants()] == [((), 1), ((), 1)]


@pytest.mark.parametrize("flavor", ["B200-192GB", "A100-80GB/share", "H100-80GB/3g.40gb"])
def test_a_quota_for_a_flavor_the_inventory_does_not_offer_is_refused(
    client: TestClient, allocator: Allocator, flavor: str
) -> None:
    r = client.put(
        f"/api/v1/tenants/team-a/quotas/{flavor}",
        json={"guaranteed": 0, "limit": 1},
        headers={**auth("root"), "If-None-Match": "*"},
    )
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["field"] == "flavor" and err["valid"] == "a flavor the inventory offers: H100-80GB"
    assert flavor in err["message"]
    assert [q.flavor for q in allocator.quotas("team-a")] == ["H100-80GB"]


def test_a_quota_whose_nodes_left_stays_editable(client: TestClient, allocator: Allocator) -> None:
    # Set while T4 nodes were there; now there is none (capacity 0): an over-commit.
    allocator.set_quota("team-a", "T4", guaranteed=1, limit=1, overcommit=True)
    r = client.put(
        "/api/v1/tenants/team-a/quotas/T4",
        json={"guaranteed": 0, "limit": 0},
        headers={**auth("root"), "If-Match": '"1"'},
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("count", [True, "2", 1.0])
def test_a_count_that_is_not_an_integer_is_refused_not_coerced(
    client: TestClient, allocator: Allocator, count: object
) -> None:
    body = {**gpu_request(), "devices": {"kind": "gpu", "count": count}}
    r = client.post("/api/v1/workloads", json=body, headers=auth("alice"))
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["field"] == "devices.count" and repr(count) in err["message"]
    assert allocator.workloads() == []


def test_numbers_and_strings_in_every_body_are_strict(client: TestClient) -> None:
    cases = [
        ("PUT", "/api/v1/tenants/team-a", {"weight": "2"}, "weight"),
        ("PUT", "/api/v1/tenants/team-a", {"weight": True}, "weight"),
        ("PUT", "/api/v1/tenants/team-a/quotas/H100-80GB", {"guaranteed": "1", "limit": 2}, None),
        ("POST", "/api/v1/workloads", {**gpu_request(), "gang_size": "1"}, "gang_size"),
        ("POST", "/api/v1/workloads", {**gpu_request(), "name": 7}, "name"),
    ]
    for method, url, body, field in cases:
        r = client.request(method, url, json=body, headers={**auth("root"), "If-Match": '"1"'})
        assert r.status_code == 422, (body, r.text)
        assert r.json()["field"] == (field or "guaranteed")


def test_if_none_match_star_on_an_existing_tenant_says_it_exists(
    client: TestClient, allocator: Allocator
) -> None:
    r = client.put(
        "/api/v1/tenants/team-a", json={"weight": 2}, headers={**auth("root"), "If-None-Match": "*"}
    )
    assert r.status_code == 412
    assert r.json()["message"] == (
        "tenant team-a exists already (version 1): If-None-Match: * only creates; "
        'to change it, send If-Match: "1" (its ETag)'
    )
    assert [t.weight for t in allocator.tenants()] == [1.0, 1.0]


@pytest.mark.parametrize(
    ("content", "where"),
    [
        (b'{"tenant": "team-a", "name": x}', "line 1, column 30"),
        (b'{\n  "tenant": "team-a",\n  "name": }', "line 3, column 11"),
    ],
)
def test_a_body_that_is_not_json_names_the_line_and_column(
    client: TestClient, content: bytes, where: str
) -> None:
    r = client.post(
        "/api/v1/workloads",
        content=content,
        headers={**auth("alice"), "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    err = r.json()
    assert (err["field"], err["valid"]) == ("body", "a JSON object")
    assert err["message"].startswith("invalid body: not JSON: ") and where in err["message"]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused_as_not_finite(client: TestClient, number: str) -> None:
    r = client.put(
        "/api/v1/tenants/team-a",
        content=f'{{"weight": {number}}}'.encode(),
        headers={**auth("root"), "If-Match": '"1"', "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["field"] == "weight" and "finite number" in err["valid"]


def test_the_documented_weight_bound_is_the_servers(app: FastAPI, client: TestClient) -> None:
    weight = app.openapi()["components"]["schemas"]["TenantIn"]["properties"]["weight"]
    assert weight["maximum"] == MAX_WEIGHT
    edit = {**auth("root"), "If-Match": '"1"'}
    r = client.put("/api/v1/tenants/team-a", json={"weight": MAX_WEIGHT}, headers=edit)
    assert r.status_code == 200, r.text
    over = client.put("/api/v1/tenants/team-a", json={"weight": MAX_WEIGHT + 1}, headers=edit)
    assert over.status_code == 422 and over.json()["field"] == "weight"


def test_documented_string_bounds_are_the_rules(app: FastAPI) -> None:
    params = app.openapi()["paths"]["/api/v1/workloads/{workload_id}"]["get"]["parameters"]
    (wid,) = [p["schema"] for p in params if p["name"] == "workload_id"]
    assert (wid["pattern"], wid["maxLength"]) == ("^[!-~]+$", 64)


def test_the_same_idempotency_key_with_another_body_is_refused(
    client: TestClient, allocator: Allocator
) -> None:
    headers = {**auth("alice"), "Idempotency-Key": "spawn-7"}
    first = client.post("/api/v1/workloads", json=gpu_request(), headers=headers)
    assert first.status_code == 201
    again = client.post("/api/v1/workloads", json=gpu_request(), headers=headers)
    assert again.json()["id"] == first.json()["id"]
    other = client.post("/api/v1/workloads", json=gpu_request(n=2, name="big"), headers=headers)
    assert other.status_code == 422, other.text
    err = other.json()
    assert (err["code"], err["field"]) == ("idempotency_mismatch", "Idempotency-Key")
    assert "'spawn-7'" in err["message"] and first.json()["id"] in err["message"]
    assert "name, devices" in err["message"]
    assert [w.id for w in allocator.workloads()] == [first.json()["id"]]
