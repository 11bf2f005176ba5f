"""Log lines: JSON objects with the structured fields on top, or plain text."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from portal.service import logs


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("uvicorn.access").disabled = False
    logging.getLogger("httpx").setLevel(logging.NOTSET)


def test_json_lines_carry_the_fields_at_the_top_level(restore_root: None) -> None:
    out = io.StringIO()
    logs.configure("json", "info", out)
    logging.getLogger("portal.x").info(
        "GET %s", "/q", extra={"fields": {"route": "/q", "status": 200, "duration_ms": 1.5}}
    )
    logging.getLogger("portal.x").debug("not written at info")
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "GET /q"
    assert (record["level"], record["logger"]) == ("info", "portal.x")
    assert (record["route"], record["status"], record["duration_ms"]) == ("/q", 200, 1.5)
    assert record["timestamp"].endswith("+00:00")


def test_text_lines_append_the_fields(restore_root: None) -> None:
    out = io.StringIO()
    logs.configure("text", "debug", out)
    logging.getLogger("portal.x").warning("hello", extra={"fields": {"tenant": "team-a"}})
    assert out.getvalue().rstrip().endswith("WARNING portal.x: hello tenant=team-a")


def test_the_requests_httpx_sends_are_logged_at_debug_only(restore_root: None) -> None:
    out = io.StringIO()
    logs.configure("json", "info", out)
    logging.getLogger("httpx").info("HTTP Request: POST http://127.0.0.1:1/v1/completions")
    logging.getLogger("httpx").warning("a warning still shows")
    assert [json.loads(line)["message"] for line in out.getvalue().splitlines()] == [
        "a warning still shows"
    ]
    logs.configure("json", "debug", out)
    logging.getLogger("httpx").info("shown at debug")
    assert json.loads(out.getvalue().splitlines()[-1])["message"] == "shown at debug"
