"""Prices and money budgets from configuration (a YAML file or an already parsed mapping).

```yaml
currency: USD
prices:                       # per whole-GPU hour; MIG and shares are priced by their share
  H100-80GB:
    - {per_gpu_hour: "4.00"}                                  # from the beginning of time
    - {from: "2026-11-02T13:00:00Z", per_gpu_hour: "3.00"}    # a price change
  T4: "0.35"                  # one price, always
budgets:                      # optional money budget per tenant and calendar month (UTC)
  team-a: "5000.00"
```

Prices are strings (or integers) so that no binary float rounds them; ``from`` is an ISO 8601
time with a zone, and may be left out on the first entry only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path

import yaml

from policies.errors import InvalidRequest
from policies.pricing import PriceBook, PriceChange, PriceSchedule
from portal.accounting.history import epoch_seconds

_CURRENCY_LENGTH = 3
_VALID_PRICE = 'a price such as "4.00" (a string or integer, >= 0)'


@dataclass(frozen=True, slots=True)
class PriceConfig:
    """What accounting is configured with: prices, their currency, money budgets per tenant."""

    book: PriceBook = field(default_factory=lambda: PriceBook({}))
    currency: str = "USD"
    budgets: Mapping[str, Decimal] = field(default_factory=dict)


def _money(where: str, value: object) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidRequest(where, repr(value), _VALID_PRICE)
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise InvalidRequest(where, repr(value), _VALID_PRICE) from None
    if not amount.is_finite() or amount < 0:
        raise InvalidRequest(where, repr(value), _VALID_PRICE)
    return amount


def _time(where: str, value: object) -> int:
    # YAML turns an unquoted timestamp into a datetime already.
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            value = None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidRequest(
            where, repr(value), "an ISO 8601 time with a zone, e.g. 2026-11-02T13:00:00Z"
        )
    return epoch_seconds(value)


def _schedule(model: str, entries: object) -> PriceSchedule:
    if not isinstance(entries, list):
        return PriceSchedule(model, (PriceChange(0, _money(f"price of {model}", entries)),))
    if not entries:
        raise InvalidRequest(f"prices of {model}", "[]", "at least one price")
    changes = []
    for i, entry in enumerate(entries):
        where = f"prices of {model}, entry {i + 1}"
        if not isinstance(entry, dict) or not set(entry) <= {"from", "per_gpu_hour"}:
            raise InvalidRequest(where, repr(entry), "{from: <time>, per_gpu_hour: <price>}")
        if "from" not in entry and i > 0:
            raise InvalidRequest(where, repr(entry), "a 'from' time (only the first may omit it)")
        begin = _time(f"{where} 'from'", entry["from"]) if "from" in entry else 0
        changes.append(
            PriceChange(begin, _money(f"{where} 'per_gpu_hour'", entry.get("per_gpu_hour")))
        )
    return PriceSchedule(model, tuple(changes))


def price_config(raw: Mapping[str, object]) -> PriceConfig:
    """A ``PriceConfig`` from a parsed mapping; raises ``InvalidRequest`` naming the bad value."""
    unknown = set(raw) - {"currency", "prices", "budgets"}
    if unknown:
        raise InvalidRequest("pricing key", ", ".join(sorted(unknown)), "currency, prices, budgets")
    currency = raw.get("currency", "USD")
    if not isinstance(currency, str) or len(currency) != _CURRENCY_LENGTH or not currency.isalpha():
        raise InvalidRequest("currency", repr(currency), "a three-letter ISO 4217 code such as USD")
    prices = raw.get("prices") or {}
    if not isinstance(prices, dict):
        raise InvalidRequest("prices", repr(prices), "a mapping of GPU model to prices")
    budgets = raw.get("budgets") or {}
    if not isinstance(budgets, dict):
        raise InvalidRequest("budgets", repr(budgets), "a mapping of tenant to a monthly amount")
    return PriceConfig(
        book=PriceBook.of(*(_schedule(str(m), e) for m, e in prices.items())),
        currency=currency.upper(),
        budgets={str(t): _money(f"budget of {t}", v) for t, v in budgets.items()},
    )


def load_price_config(path: Path) -> PriceConfig:
    """Read a pricing YAML file (see the module docstring)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidRequest("pricing file", str(path), f"a readable YAML file ({exc})") from exc
    if not isinstance(raw, dict):
        raise InvalidRequest(
            "pricing file", str(path), "a YAML mapping with currency, prices, budgets"
        )
    return price_config(raw)
