"""What the allocator's start found wrong in the database, raised as alerts.

``Allocator.start`` resolves a database that contradicts itself by a rule (the newer of two
contradicting workloads fails with ``conflict-at-start``; tenants above a limit keep running)
and records each finding as an event in its first decision. Operators watch alerts, not the
event table, so each finding also becomes an alert: already resolved for a contradiction (start
ended it), firing-and-resolved alike for a tenant above a limit (reported once; lowering a
limit below usage is legal and reclaim takes its usual course). Either way the alert is stored
resolved, so the alert engine, which only resumes pending and firing alerts, never adopts a
rule it does not evaluate.
"""

from __future__ import annotations

import logging
from datetime import datetime

from policies.alerts import Alert, AlertKey, AlertState
from portal.alerting.store import AlertStore
from portal.store.writer import Store

log = logging.getLogger("portal.service")

RULES = {
    "store.contradiction": "store_contradiction",
    "quota.over-limit-at-start": "quota_over_limit_at_start",
}


def raise_alerts(store: Store, since: datetime) -> int:
    """Store one alert per start-up finding recorded at or after ``since``; returns how many."""
    alerts: list[Alert] = []
    for e in store.events(since, limit=10_000):
        rule = RULES.get(e.kind)
        if rule is None:
            continue
        subject = e.workload_id or f"{e.tenant}/{e.data.get('flavor', '')}"
        at = e.at.timestamp()
        alerts.append(
            Alert(
                key=AlertKey(rule, e.tenant or "platform", subject),
                state=AlertState.RESOLVED,
                tenant=e.tenant,
                owner=None,
                workloads=(e.workload_id,) if e.workload_id else (),
                summary=e.message,
                value=1.0,
                active_since=at,
                fired_at=at,
                resolved_at=at,
            )
        )
    AlertStore(store.engine).save(alerts)
    if alerts:
        log.error(
            "start-up found %d contradiction(s) in the database; see the %s alerts",
            len(alerts),
            " and ".join(sorted(RULES.values())),
        )
    return len(alerts)
