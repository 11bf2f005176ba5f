"""Waiting on a condition in tests instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(probe: Callable[[], T | None], what: str, timeout_s: float = 30.0) -> T:
    """``probe()``'s first value that is not None, polled every 0.1 s; fails naming ``what``
    when none came within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = probe()
        if result is not None:
            return result
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")
