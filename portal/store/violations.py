"""Clear errors for a commit the database refused with a constraint violation.

The transaction is already rolled back: the explanation reads the stored rows that the change
set collided with (a claimed device, a taken allocation id or idempotency key, a missing
workload) and names them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

from sqlalchemy import Connection, select, tuple_
from sqlalchemy.exc import IntegrityError

from policies.errors import Conflict, NotFound, PortalError
from portal.store.convert import Claim
from portal.store.reader import ALLOCATIONS, CLAIMS, WORKLOADS
from portal.store.records import ChangeSet


def explain_violation(
    read: Callable[[], AbstractContextManager[Connection]],
    changes: ChangeSet,
    new_claims: Mapping[str, list[Claim]],
    err: IntegrityError,
) -> PortalError:
    """Turn a constraint violation (the transaction is rolled back) into a clear error."""
    released = {alloc_id for alloc_id, _ in changes.released}
    wanted = {c: alloc_id for alloc_id, cs in new_claims.items() for c in cs}
    with read() as conn:
        if wanted:
            held = conn.execute(
                select(
                    CLAIMS.c.node,
                    CLAIMS.c.gpu,
                    CLAIMS.c.slot,
                    CLAIMS.c.allocation_id,
                    ALLOCATIONS.c.workload_id,
                )
                .join(ALLOCATIONS, ALLOCATIONS.c.id == CLAIMS.c.allocation_id)
                .where(
                    tuple_(CLAIMS.c.node, CLAIMS.c.gpu, CLAIMS.c.slot).in_(list(wanted)),
                    CLAIMS.c.allocation_id.not_in(list(released)),
                )
                .limit(1)
            ).first()
            if held is not None:
                node, gpu, slot, holder, workload = held
                return Conflict(
                    f"GPU {gpu} on {node} is already held by allocation {holder!r} "
                    f"(workload {workload!r}); allocation {wanted[(node, gpu, slot)]!r} "
                    "cannot claim it"
                )
        ids = [a.id for a in changes.allocations]
        if ids:
            taken = conn.execute(
                select(ALLOCATIONS.c.id).where(ALLOCATIONS.c.id.in_(ids)).limit(1)
            ).scalar_one_or_none()
            if taken is not None:
                return Conflict(f"allocation {taken!r} already exists; allocation ids are unique")
            known = set(
                conn.execute(
                    select(WORKLOADS.c.id).where(
                        WORKLOADS.c.id.in_({a.workload_id for a in changes.allocations})
                    )
                ).scalars()
            ) | {w.id for w in changes.workloads}
            for a in changes.allocations:
                if a.workload_id not in known:
                    return NotFound("workload", a.workload_id)
        for w in changes.workloads:
            if w.idempotency_key is None:
                continue
            other = conn.execute(
                select(WORKLOADS.c.id).where(
                    WORKLOADS.c.tenant == w.tenant,
                    WORKLOADS.c.owner == w.owner,
                    WORKLOADS.c.idempotency_key == w.idempotency_key,
                    WORKLOADS.c.id != w.id,
                )
            ).scalar_one_or_none()
            if other is not None:
                return Conflict(
                    f"idempotency key {w.idempotency_key!r} of {w.owner!r} in tenant "
                    f"{w.tenant!r} is already used by workload {other!r}; workload "
                    f"{w.id!r} needs another key"
                )
    return Conflict(f"the database rejected the change: {err.orig}")
