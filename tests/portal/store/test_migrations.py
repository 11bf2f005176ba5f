"""The hand-written migrations build exactly the schema the models describe."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from policies.errors import Conflict
from portal.store import migrate
from portal.store.db import make_engine
from portal.store.models import metadata
from portal.telemetry import tables as _telemetry_tables  # noqa: F401  (its tables)


def test_migrated_schema_equals_the_models(db_url: str) -> None:
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            assert compare_metadata(context, metadata) == []
            indexes = {ix["name"] for ix in inspect(conn).get_indexes("workloads")}
            assert "uq_workloads_tenant_owner_idempotency_key" in indexes
    finally:
        engine.dispose()


def test_upgrade_is_idempotent_and_reaches_head(db_url: str) -> None:
    migrate.upgrade(db_url)
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    try:
        assert migrate.current(engine) == migrate.head() == "0003"
    finally:
        engine.dispose()


def test_upgrade_creates_every_table(db_url: str) -> None:
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    try:
        assert set(inspect(engine).get_table_names()) >= {
            "tenants",
            "quotas",
            "workloads",
            "allocations",
            "device_claims",
            "usage_history",
            "events",
            "meta",
        }
    finally:
        engine.dispose()


def test_a_database_from_a_newer_portal_is_refused(db_url: str) -> None:
    migrate.upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        with pytest.raises(Conflict, match=r"schema revision '9999'.*knows up to '0003'"):
            migrate.upgrade(engine)
    finally:
        engine.dispose()
