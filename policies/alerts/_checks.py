"""Validation shared by the rules' settings."""

from __future__ import annotations

import math

from policies.errors import InvalidRequest


def check_range(field: str, value: float, lo: float, hi: float = math.inf) -> None:
    """Raise unless ``lo <= value <= hi`` and ``value`` is a real number."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or math.isnan(value)
        or not lo <= value <= hi
    ):
        raise InvalidRequest(field, value, f"a number in [{lo}, {hi}]")
