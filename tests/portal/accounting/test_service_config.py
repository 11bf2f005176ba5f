"""The service's accounting: prices from the pricing file setting, or none."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi import FastAPI

from policies.errors import InvalidRequest
from portal.accounting.telemetry import TelemetryUtilization
from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.api.cost import configure
from portal.settings import Settings
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx


@pytest.fixture
def app(tmp_path: Path) -> Iterator[FastAPI]:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([hgx("n1")])
    yield create_app(alloc, StaticAuthenticator({}))
    store.close()


def test_the_pricing_file_prices_the_cost_routes(app: FastAPI, tmp_path: Path) -> None:
    path = tmp_path / "pricing.yaml"
    path.write_text('currency: CHF\nprices: {H100-80GB: "3.50"}\n')
    acc = configure(app, Settings(state_dir=tmp_path, pricing_file=path))
    assert app.state.accounting is acc
    assert acc.prices.currency == "CHF"
    assert acc.prices.book.schedule("H100-80GB").price_at(0) == Decimal("3.50")
    assert isinstance(acc.utilization, TelemetryUtilization)


def test_without_a_pricing_file_nothing_is_priced(app: FastAPI, tmp_path: Path) -> None:
    acc = configure(app, Settings(state_dir=tmp_path))
    assert dict(acc.prices.book.schedules) == {}


def test_a_bad_pricing_file_stops_the_service_with_a_clear_error(
    app: FastAPI, tmp_path: Path
) -> None:
    path = tmp_path / "pricing.yaml"
    path.write_text("prices: {H100-80GB: 3.5}\n")
    with pytest.raises(InvalidRequest, match="price of H100-80GB"):
        configure(app, Settings(state_dir=tmp_path, pricing_file=path))
    with pytest.raises(InvalidRequest, match="pricing file"):
        configure(app, Settings(state_dir=tmp_path, pricing_file=tmp_path / "missing.yaml"))


def test_the_cost_gauges_join_the_apps_metrics(app: FastAPI, tmp_path: Path) -> None:
    configure(app, Settings(state_dir=tmp_path))
    names = {m.name for m in app.state.metrics.registry.collect()}
    assert "gpuportal_cost_month_to_date" in names
    assert "gpuportal_budget_projected_ratio" in names
