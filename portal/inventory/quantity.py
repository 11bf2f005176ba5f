"""Kubernetes resource quantities (``64``, ``500m``, ``512Gi``, ``1e3``) as exact numbers.

The grammar follows ``k8s.io/apimachinery/pkg/api/resource``: a signed decimal number followed
by a binary suffix (Ki … Ei), a decimal suffix (n, u, m, k, M, G, T, P, E) or a decimal
exponent (``e3``, ``E-2``).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from policies.errors import InvalidRequest

_RE = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_VALID = "a Kubernetes quantity such as '64', '500m', '1.5', '512Gi', '1e3'"
_MIB = 1024 * 1024


def parse(text: str | int | float, *, field: str = "quantity") -> Decimal:
    """The exact value of a quantity (``'500m'`` → ``Decimal('0.5')``)."""
    if isinstance(text, bool):
        raise InvalidRequest(field, repr(text), _VALID)
    if isinstance(text, int | float):
        text = str(text)
    m = _RE.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise InvalidRequest(field, repr(text), _VALID)
    try:
        number = Decimal(m.group("num"))
    except InvalidOperation:  # pragma: no cover - the regex only admits valid decimals
        raise InvalidRequest(field, repr(text), _VALID) from None
    suffix = m.group("suffix") or ""
    if suffix in _BINARY:
        return number * Decimal(1024 ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    return number.scaleb(int(suffix[1:]))


def cpu_milli(text: str | int | float, *, field: str = "cpu") -> int:
    """CPU quantity in millicores, rounded up as Kubernetes does (``'1.5'`` → 1500)."""
    value = parse(text, field=field)
    if value < 0:
        raise InvalidRequest(field, repr(text), "a CPU quantity >= 0")
    return math.ceil(value * 1000)


def memory_mib(text: str | int | float, *, field: str = "memory") -> int:
    """Memory quantity (bytes) in whole MiB, rounded down (``'512Gi'`` → 524288)."""
    value = parse(text, field=field)
    if value < 0:
        raise InvalidRequest(field, repr(text), "a memory quantity >= 0")
    return math.floor(value / _MIB)


def count(text: str | int | float, *, field: str = "count") -> int:
    """A whole, non-negative count (``'8'``, ``8``, ``'1e1'``)."""
    value = parse(text, field=field)
    if value < 0 or value != value.to_integral_value():
        raise InvalidRequest(field, repr(text), "a whole number >= 0")
    return int(value)
