"""Alerts in the portal's database: one row per alert, updated as it moves through its states.

An alert's id is derived from its key and the time it became active, so writing the same
transition twice (a retried evaluation, a restart) updates the same row: no duplicates. The
pending and firing rows are the engine's state: ``active`` hands them back after a restart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.dialects import postgresql, sqlite

from policies.alerts import Alert, AlertKey, AlertState
from portal.telemetry.tables import ALERTS

ACTIVE = (AlertState.PENDING, AlertState.FIRING)


def alert_id(key: AlertKey, active_since: float) -> str:
    raw = f"{key.rule}\x00{key.scope}\x00{key.subject}\x00{round(active_since * 1000)}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class StoredAlert:
    """An alert as stored; times are epoch seconds."""

    id: str
    alert: Alert

    @property
    def state(self) -> AlertState:
        return self.alert.state


def _ms(t: float | None) -> int | None:
    return None if t is None else round(t * 1000)


def _s(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _row(a: Alert) -> dict[str, Any]:
    return {
        "id": alert_id(a.key, a.active_since),
        "rule": a.key.rule,
        "scope": a.key.scope,
        "subject": a.key.subject,
        "state": a.state.value,
        "tenant": a.tenant,
        "owner": a.owner,
        "workloads": list(a.workloads),
        "summary": a.summary,
        "value": a.value,
        "active_since_ms": _ms(a.active_since),
        "fired_at_ms": _ms(a.fired_at),
        "resolved_at_ms": _ms(a.resolved_at),
    }


def _alert(r: Any) -> StoredAlert:
    return StoredAlert(
        r.id,
        Alert(
            key=AlertKey(r.rule, r.scope, r.subject),
            state=AlertState(r.state),
            tenant=r.tenant,
            owner=r.owner,
            workloads=tuple(r.workloads),
            summary=r.summary,
            value=r.value,
            active_since=r.active_since_ms / 1000,
            fired_at=_s(r.fired_at_ms),
            resolved_at=_s(r.resolved_at_ms),
        ),
    )


class AlertStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._insert = sqlite.insert if engine.dialect.name == "sqlite" else postgresql.insert

    def save(self, alerts: Iterable[Alert]) -> None:
        """Insert or update each alert (by id) in one transaction."""
        rows = [_row(a) for a in alerts]
        if not rows:
            return
        stmt = self._insert(ALERTS)
        stmt = stmt.on_conflict_do_update(
            index_elements=["id"],
            set_={c: getattr(stmt.excluded, c) for c in rows[0] if c != "id"},
        )
        with self.engine.begin() as conn:
            conn.execute(stmt, rows)

    def alerts(
        self,
        *,
        states: Collection[AlertState] | None = None,
        tenants: Collection[str] | None = None,
        rule: str | None = None,
    ) -> list[StoredAlert]:
        """Alerts, newest first; ``tenants`` None means every tenant (and untenanted alerts)."""
        q = select(ALERTS)
        if states is not None:
            q = q.where(ALERTS.c.state.in_([s.value for s in states]))
        if tenants is not None:
            q = q.where(ALERTS.c.tenant.in_(sorted(tenants)))
        if rule is not None:
            q = q.where(ALERTS.c.rule == rule)
        q = q.order_by(ALERTS.c.active_since_ms.desc(), ALERTS.c.id)
        with self.engine.connect() as conn:
            return [_alert(r) for r in conn.execute(q)]

    def active(self) -> list[Alert]:
        """Pending and firing alerts: the engine's state after a restart."""
        return [s.alert for s in self.alerts(states=ACTIVE)]
