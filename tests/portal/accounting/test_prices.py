"""Pricing configuration, periods and usage intervals' edge cases."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from policies.errors import InvalidRequest
from policies.pricing import Period
from portal.accounting import load_price_config, price_config
from portal.accounting.history import epoch_seconds
from portal.accounting.service import Step, month_of, periods


def test_a_config_with_a_price_change_and_a_flat_price_loads_exactly(tmp_path: Path) -> None:
    path = tmp_path / "pricing.yaml"
    path.write_text(
        "currency: eur\n"
        "prices:\n"
        "  H100-80GB:\n"
        '    - {per_gpu_hour: "4.10"}\n'
        '    - {from: 2026-11-02T13:00:00Z, per_gpu_hour: "3.00"}\n'
        "  T4: 1\n"
        "budgets: {ml: '250.50'}\n"
    )
    config = load_price_config(path)
    assert config.currency == "EUR"
    h100 = config.book.schedule("H100-80GB")
    change = epoch_seconds(datetime(2026, 11, 2, 13, tzinfo=UTC))
    assert h100.price_at(change - 1) == Decimal("4.10")
    assert h100.price_at(change) == Decimal("3.00")
    assert config.book.schedule("T4").price_at(0) == Decimal(1)
    assert config.budgets == {"ml": Decimal("250.50")}


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"currency": "euros"}, "currency"),
        ({"prices": {"T4": 0.35}}, "price of T4"),  # a float would round the price
        ({"prices": {"T4": "-1"}}, "price of T4"),
        ({"prices": {"T4": "cheap"}}, "price of T4"),
        ({"prices": {"T4": []}}, "prices of T4"),
        ({"prices": {"T4": [{"per_gpu_hour": "1"}, {"per_gpu_hour": "2"}]}}, "entry 2"),
        ({"prices": {"T4": [{"from": "yesterday", "per_gpu_hour": "1"}]}}, "'from'"),
        ({"prices": {"T4": [{"from": "2026-11-02T13:00:00", "per_gpu_hour": "1"}]}}, "'from'"),
        ({"prices": {"T4": [{"per_gpu_hour": "1", "colour": "red"}]}}, "entry 1"),
        ({"budgets": {"ml": "lots"}}, "budget of ml"),
        ({"discounts": {}}, "pricing key"),
    ],
)
def test_bad_pricing_config_names_the_value_and_what_is_valid(
    raw: dict[str, object], names: str
) -> None:
    with pytest.raises(InvalidRequest, match="expected") as err:
        price_config(raw)
    assert names in str(err.value)


def test_a_later_price_must_come_after_the_earlier_one() -> None:
    with pytest.raises(InvalidRequest, match="strictly increasing"):
        price_config(
            {
                "prices": {
                    "T4": [
                        {"per_gpu_hour": "1"},
                        {"from": "2026-11-02T13:00:00Z", "per_gpu_hour": "2"},
                        {"from": "2026-11-02T12:00:00Z", "per_gpu_hour": "3"},
                    ]
                }
            }
        )


def t(year: int, month: int, day: int, hour: int = 0) -> datetime:
    return datetime(year, month, day, hour, tzinfo=UTC)


def test_windows_split_at_utc_days_and_months_with_partial_ends() -> None:
    s = epoch_seconds
    assert periods(t(2026, 11, 2, 12), t(2026, 11, 4, 6), Step.DAY) == [
        Period(s(t(2026, 11, 2, 12)), s(t(2026, 11, 3))),
        Period(s(t(2026, 11, 3)), s(t(2026, 11, 4))),
        Period(s(t(2026, 11, 4)), s(t(2026, 11, 4, 6))),
    ]
    assert periods(t(2026, 11, 15), t(2027, 1, 2), Step.MONTH) == [
        Period(s(t(2026, 11, 15)), s(t(2026, 12, 1))),
        Period(s(t(2026, 12, 1)), s(t(2027, 1, 1))),
        Period(s(t(2027, 1, 1)), s(t(2027, 1, 2))),
    ]
    assert periods(t(2026, 11, 2), t(2026, 11, 3), Step.WHOLE) == [
        Period(s(t(2026, 11, 2)), s(t(2026, 11, 3)))
    ]
    assert month_of(t(2026, 2, 14, 5)) == Period(s(t(2026, 2, 1)), s(t(2026, 3, 1)))


def test_an_empty_or_too_finely_split_window_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="end after start"):
        periods(t(2026, 11, 3), t(2026, 11, 3), Step.DAY)
    with pytest.raises(InvalidRequest, match="at most 1000 periods"):
        periods(t(2020, 1, 1), t(2026, 1, 1), Step.DAY)


def test_epoch_seconds_floor_sub_second_times_exactly() -> None:
    assert epoch_seconds(datetime(1970, 1, 1, 0, 0, 1, 999_999, tzinfo=UTC)) == 1
    assert epoch_seconds(datetime(2026, 11, 2, 13, 0, 0, 500_000, tzinfo=UTC)) == 1_793_624_400
