"""Validation shared by the rules' settings."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeVar

from policies.errors import InvalidRequest

S = TypeVar("S")


def check_range(field: str, value: float, lo: float, hi: float = math.inf) -> None:
    """Raise unless ``lo <= value <= hi`` and ``value`` is a real number."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or math.isnan(value)
        or not lo <= value <= hi
    ):
        raise InvalidRequest(field, value, f"a number in [{lo}, {hi}]")


def of_tenant(default: S, tenants: Mapping[str, S], tenant: str | None) -> S:
    """The settings of ``tenant``: its own when it has some, else ``default``."""
    return tenants.get(tenant, default) if tenant is not None else default
