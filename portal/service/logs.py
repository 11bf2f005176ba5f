"""Structured logs of the service: one JSON object per line on stderr, or plain text.

Fields beyond the message travel in ``extra={"fields": {...}}``; the JSON format writes them as
top-level keys (``method``, ``route``, ``status``, ``duration_ms``, ``caller`` for requests;
``workload``, ``tenant``, ``outcome`` for allocator decisions), the text format appends them
as ``key=value``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

FIELDS = "fields"
"""Name of the ``extra`` entry that carries a record's structured fields."""

LogFormat = Literal["json", "text"]


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    found = getattr(record, FIELDS, None)
    return dict(found) if isinstance(found, dict) else {}


class JsonLines(logging.Formatter):
    """``{"timestamp", "level", "logger", "message", ...fields}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in fields_of(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class PlainText(logging.Formatter):
    """``2026-01-01T00:00:00.000+00:00 INFO logger: message key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        extra = " ".join(f"{k}={v}" for k, v in fields_of(record).items())
        line = f"{stamp} {record.levelname} {record.name}: {record.getMessage()}"
        if extra:
            line += " " + extra
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(fmt: LogFormat, level: str, stream: TextIO | None = None) -> None:
    """Send every log record of the process (uvicorn's included) to ``stream`` (stderr) in
    ``fmt``. Replaces the root logger's handlers; uvicorn's loggers propagate to it."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLines() if fmt == "json" else PlainText())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # The service writes its own request log line (with route, caller and duration).
    logging.getLogger("uvicorn.access").disabled = True
    # httpx logs every request it sends at info: the gateway's forward of each call, every
    # health probe and metrics scrape, a second line per gateway request on its hot path.
    # Kept at debug, where one asks for everything.
    logging.getLogger("httpx").setLevel(
        logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING
    )
