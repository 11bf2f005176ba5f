"""Schemathesis over every operation of the generated OpenAPI, with valid (positive) and
invalid (negative) inputs, on SQLite and on PostgreSQL (which refuses text SQLite stores, such
as NUL bytes): no 5xx, every answer matches the documented schema, status codes, content types
and headers."""

from __future__ import annotations

from typing import Any, cast

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from tests.portal.api.conftest import auth

pytestmark = pytest.mark.slow

# Two checks do not fit this API, on purpose:
# - negative_data_rejection: unknown query parameters are ignored, as FastAPI does, and
#   schemathesis counts that as "invalid data accepted";
# - positive_data_acceptance: rules across fields (a request's shape, guaranteed <= limit,
#   If-Match or If-None-Match) are the domain's, answered with the documented 422/428, which
#   schemathesis counts as "valid data rejected".
# Everything else holds for every case: no 5xx, documented status codes, content types and
# headers, bodies matching their schema (the error body included).
EXCLUDED = [
    schemathesis.checks.negative_data_rejection,
    schemathesis.checks.positive_data_acceptance,
]


EXAMPLES = {"sqlite": 25, "postgres": 10}
"""Examples per operation and mode. Fewer on PostgreSQL, where each request costs more: the
boundary checks it exercises are the same code, and the full set runs on SQLite."""


@pytest.fixture
def store_url(db_url: str) -> str:
    return db_url


def _cases() -> list[tuple[str, GenerationMode]]:
    """Every operation, from the same app factory (the schema needs no allocator), with valid
    inputs, and with invalid ones where it takes any input at all."""
    paths = create_app(cast(Allocator, None), StaticAuthenticator({})).openapi()["paths"]
    out = []
    for path, ops in paths.items():
        for method, op in ops.items():
            label = f"{method.upper()} {path}"
            out.append((label, GenerationMode.POSITIVE))
            if op.get("parameters") or op.get("requestBody"):
                out.append((label, GenerationMode.NEGATIVE))
    return out


@pytest.mark.parametrize(("label", "mode"), _cases())
def test_every_operation_answers_within_its_schema(
    app: FastAPI, store_url: str, label: str, mode: GenerationMode
) -> None:
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)
    method, path = label.split(" ", 1)
    operation = schema[path][method]
    strategy: st.SearchStrategy[Any] = operation.as_strategy(generation_mode=mode)

    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES["sqlite" if store_url.startswith("sqlite") else "postgres"],
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(headers=auth("root"), excluded_checks=EXCLUDED)

    run()
