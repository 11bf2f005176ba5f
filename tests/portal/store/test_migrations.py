"""The hand-written migrations build exactly the schema the models describe."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import IntegrityError

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
        assert migrate.current(engine) == migrate.head() == "0012"
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
        with pytest.raises(Conflict, match=r"schema revision '9999'.*knows up to '0012'"):
            migrate.upgrade(engine)
    finally:
        engine.dispose()


SAMPLE_ROW = (
    "INSERT INTO telemetry_samples (device, at_ms, node, gpu_uuid, source, utilization_pct, "
    "memory_used_mib, memory_total_mib, throttle_reasons, xid_count, ecc_uncorrectable, "
    "ecc_correctable) VALUES (:device, :at_ms, 'n1', 'GPU-0', 'nvml', :util, 100, 1000, 0, 0, 0, 0)"
)
ROLLUP_ROW = (
    "INSERT INTO telemetry_rollups (step_s, device, bucket_ms, samples, utilization_avg, "
    "utilization_min, utilization_max, memory_used_avg, memory_used_max) "
    "VALUES (60, :device, 0, 1, :util, :util, :util, 100, 100)"
)


def _downgrade(engine: Engine, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(migrate.MIGRATIONS))
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)
        conn.commit()


def test_0004_makes_utilization_optional_keeping_rows_keys_and_indexes(db_url: str) -> None:
    migrate.upgrade(db_url, "0003")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(SAMPLE_ROW), {"device": "GPU-0", "at_ms": 1000, "util": 42.0})
            conn.execute(text(ROLLUP_ROW), {"device": "GPU-0", "util": 42.0})
            with pytest.raises(IntegrityError, match=r"(?i)null"), conn.begin_nested():
                conn.execute(text(SAMPLE_ROW), {"device": "GPU-0", "at_ms": 2000, "util": None})
        migrate.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text(SAMPLE_ROW), {"device": "GPU-0/gi1", "at_ms": 1000, "util": None})
            conn.execute(text(ROLLUP_ROW), {"device": "GPU-0/gi1", "util": None})
            samples = conn.execute(
                text("SELECT device, utilization_pct FROM telemetry_samples ORDER BY device")
            ).all()
            rollups = conn.execute(
                text("SELECT device, utilization_avg FROM telemetry_rollups ORDER BY device")
            ).all()
            # The primary key survived the table copy.
            with pytest.raises(IntegrityError, match=r"(?i)unique|duplicate"), conn.begin_nested():
                conn.execute(text(SAMPLE_ROW), {"device": "GPU-0", "at_ms": 1000, "util": 1})
        assert [tuple(r) for r in samples] == [("GPU-0", 42.0), ("GPU-0/gi1", None)]
        assert [tuple(r) for r in rollups] == [("GPU-0", 42.0), ("GPU-0/gi1", None)]
        names = {ix["name"] for ix in inspect(engine).get_indexes("telemetry_rollups")}
        assert "ix_telemetry_rollups_step_s_bucket_ms" in names

        # Back to 0003: the unmeasured rows go (NOT NULL again), the measured ones stay.
        _downgrade(engine, "0003")
        with engine.connect() as conn:
            kept = conn.execute(text("SELECT device FROM telemetry_samples")).scalars().all()
            kept_rollups = conn.execute(text("SELECT device FROM telemetry_rollups")).scalars()
            assert (kept, list(kept_rollups)) == (["GPU-0"], ["GPU-0"])
        assert migrate.current(engine) == "0003"
    finally:
        engine.dispose()


def test_0005_gives_existing_quotas_their_values_as_ceilings(db_url: str) -> None:
    migrate.upgrade(db_url, "0004")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tenants (name, cohort, weight, pools, version) "
                    "VALUES ('team-a', NULL, 1.0, '[]', 1)"
                )
            )
            conn.execute(
                text(
                    'INSERT INTO quotas (tenant, flavor, guaranteed, "limit", budget_gpu_hours, '
                    "version) VALUES ('team-a', 'H100-80GB', 3, 5, NULL, 2)"
                )
            )
        migrate.upgrade(engine)
        with engine.connect() as conn:
            row = conn.execute(
                text("SELECT guaranteed, ceiling_guaranteed, ceiling_limit, version FROM quotas")
            ).one()
        assert tuple(row) == (3, 3, 5, 2)
        _downgrade(engine, "0004")
        columns = {c["name"] for c in inspect(engine).get_columns("quotas")}
        assert "ceiling_limit" not in columns
    finally:
        engine.dispose()
