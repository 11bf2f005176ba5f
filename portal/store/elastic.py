"""Per-tenant elastic-job settings in the store: records ↔ rows and the reads. Writes go
through ``Store.commit`` (``ChangeSet.elastic``), versioned like quotas."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import RowMapping, Table, select

from policies.elastic import ElasticLimits, ElasticSettings
from portal.store.models import metadata
from portal.store.records import ElasticSettingsRecord

if TYPE_CHECKING:
    from portal.store.writer import Store

ELASTIC: Table = metadata.tables["tenant_elastic"]


def elastic_row(r: ElasticSettingsRecord) -> dict[str, Any]:
    s, lim = r.settings, r.limits
    return {
        "tenant": r.tenant,
        "threshold": s.threshold,
        "window_s": s.window_s,
        "idle_s": s.idle_s,
        "idle_below": s.idle_below,
        "min_threshold": lim.min_threshold,
        "min_window_s": lim.min_window_s,
        "max_idle_s": lim.max_idle_s,
        "updated_at": r.updated_at,
        "version": r.version,
    }


def elastic_record(r: RowMapping) -> ElasticSettingsRecord:
    return ElasticSettingsRecord(
        tenant=r["tenant"],
        settings=ElasticSettings(
            threshold=r["threshold"],
            window_s=r["window_s"],
            idle_s=r["idle_s"],
            idle_below=r["idle_below"],
        ),
        limits=ElasticLimits(
            min_threshold=r["min_threshold"],
            min_window_s=r["min_window_s"],
            max_idle_s=r["max_idle_s"],
        ),
        updated_at=r["updated_at"],
        version=r["version"],
    )


def elastic_settings(store: Store, tenant: str | None = None) -> list[ElasticSettingsRecord]:
    """The stored settings of every tenant (or of one), by tenant name."""
    stmt = select(ELASTIC).order_by(ELASTIC.c.tenant)
    if tenant is not None:
        stmt = stmt.where(ELASTIC.c.tenant == tenant)
    with store.engine.connect() as conn:
        return [elastic_record(r) for r in conn.execute(stmt).mappings()]
