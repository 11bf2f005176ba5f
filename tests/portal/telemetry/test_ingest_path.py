"""The ingest path's cost-saving shortcuts keep their guarantees: values stored exactly,
a failed batch stores nothing, pooled connections stay transactional, and the reused
attribution snapshot follows every allocation change."""

from __future__ import annotations

from typing import Any, cast

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import QueuePool

from portal.telemetry.attribution import AllocatorIndexSource
from portal.telemetry.tables import DIRTY, SAMPLES, WORKLOAD_SAMPLES
from tests.portal.telemetry.conftest import T0, Portal, batch, sample

# Floats whose shortest decimal form has 16-17 digits, tiny and huge ones: a lossy encoding
# (a float4, a rounded decimal) would change them.
AWKWARD = [0.1 + 0.2, 33.333333333333336, 1e-7, 98.76543210987654]


def test_every_stored_value_is_exactly_what_the_agent_sent(portal: Portal) -> None:
    wid = portal.gpus("team-a", 1)
    device = portal.devices_of(wid)[0]
    sent = [
        sample(
            device,
            T0 + 10 * i + 0.123,
            util=u,
            power_w=u * 3,
            pcie_tx_bytes_s=1.2345678901234567e12,
            last_xid=None if i % 2 else 79,
        )
        for i, u in enumerate(AWKWARD)
    ]
    result = portal.telemetry.ingest(batch("n1", *sent), portal.index(), now=T0 + 60)
    assert (result.accepted, result.duplicates, result.rejected) == (4, 0, 0)

    with portal.store.engine.connect() as conn:
        rows = conn.execute(
            select(
                SAMPLES.c.at_ms,
                SAMPLES.c.utilization_pct,
                SAMPLES.c.power_w,
                SAMPLES.c.pcie_tx_bytes_s,
                SAMPLES.c.last_xid,
                SAMPLES.c.node,
                SAMPLES.c.source,
            ).order_by(SAMPLES.c.at_ms)
        ).all()
        attributed = conn.execute(
            select(WORKLOAD_SAMPLES.c.workload_id, WORKLOAD_SAMPLES.c.utilization_pct).order_by(
                WORKLOAD_SAMPLES.c.at_ms
            )
        ).all()
        dirty = conn.execute(select(DIRTY.c.step_s, DIRTY.c.bucket_ms)).all()
    xids = [None if i % 2 else 79 for i in range(len(AWKWARD))]
    assert [tuple(r) for r in rows] == [
        (round((T0 + 10 * i + 0.123) * 1000), u, u * 3, 1.2345678901234567e12, x, "n1", "nvml")
        for i, (u, x) in enumerate(zip(AWKWARD, xids, strict=True))
    ]
    assert [tuple(r) for r in attributed] == [(wid, u) for u in AWKWARD]
    assert [tuple(r) for r in dirty] == [(60, round(T0 * 1000))]


def _refuse_dirty_marks(portal: Portal) -> None:
    """Make every insert into the dirty table fail, as a database error would."""
    with portal.store.engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.execute(
                text(
                    "CREATE TRIGGER refuse BEFORE INSERT ON telemetry_dirty "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
                )
            )
        else:
            conn.execute(
                text(
                    "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
                )
            )
            conn.execute(
                text(
                    "CREATE TRIGGER refuse BEFORE INSERT ON telemetry_dirty "
                    "FOR EACH ROW EXECUTE FUNCTION refuse()"
                )
            )


def test_a_batch_that_fails_in_the_database_stores_nothing(portal: Portal) -> None:
    wid = portal.gpus("team-a", 1)
    device = portal.devices_of(wid)[0]
    _refuse_dirty_marks(portal)
    with pytest.raises(DBAPIError, match="refused by the test"):
        portal.telemetry.ingest(batch("n1", sample(device, T0 + 5)), portal.index(), T0 + 10)
    with portal.store.engine.connect() as conn:
        for table in (SAMPLES, WORKLOAD_SAMPLES, DIRTY):
            assert conn.execute(select(table)).all() == []


@pytest.mark.postgres
def test_pooled_connections_stay_transactional_after_ingest_on_postgresql(
    postgres_url: str,
) -> None:
    from tests.portal.telemetry.conftest import make_portal

    portal = make_portal(postgres_url)
    try:
        device = portal.devices_of(portal.gpus("team-a", 1))[0]
        engine = portal.store.engine
        for i in range(3):  # more batches than one connection serves
            portal.telemetry.ingest(batch("n1", sample(device, T0 + i)), portal.index(), T0 + 10)
        _refuse_dirty_marks(portal)
        with pytest.raises(DBAPIError):
            portal.telemetry.ingest(batch("n1", sample(device, T0 + 9)), portal.index(), T0 + 10)
        pooled = [engine.raw_connection() for _ in range(cast(QueuePool, engine.pool).checkedin())]
        try:
            assert pooled, "ingest returned its connections to the pool"
            modes = {cast(Any, c.driver_connection).autocommit for c in pooled}
            assert modes == {False}
        finally:
            for c in pooled:
                c.close()
        # And a rolled-back transaction on any of them still undoes its writes.
        for _ in range(len(pooled)):
            with engine.connect() as conn:
                conn.execute(text("DELETE FROM telemetry_samples"))
                conn.rollback()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM telemetry_samples")).scalar() == 3
    finally:
        portal.store.close()


def test_the_reused_attribution_snapshot_follows_every_allocation_change(portal: Portal) -> None:
    source = AllocatorIndexSource(portal.alloc, ttl_s=0)
    first = source()
    assert source() is first  # nothing changed: the snapshot is reused, not rebuilt

    wid = portal.gpus("team-a", 2)
    granted = source()
    assert granted is not first
    assert {h.workload_id for d in portal.devices_of(wid) for h in granted.holders[d]} == {wid}

    portal.alloc.release(wid)
    released = source()
    assert all(h.workload_id != wid for hs in released.holders.values() for h in hs)
    assert released.gpus is first.gpus  # the inventory did not change: its GPU map is kept
