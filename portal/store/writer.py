"""The store the allocator writes its decisions to and rebuilds its state from.

Concurrency model: the allocator is the single writer; readers (API, dashboards) may call the
read methods from other threads. ``commit`` applies a whole ``ChangeSet`` in one transaction or
nothing of it. Tenants, quotas and workloads carry a version: a record in a change set holds the
*new* version, and the row must be at ``version - 1`` (or absent, for version 1), otherwise the
store raises ``Conflict`` and rolls everything back. Device claims are guarded by the database
itself (see ``portal.store.models.DeviceClaim``), so even a buggy or second writer cannot hand a
GPU or MIG slice out twice.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from importlib import metadata as importlib_metadata
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    bindparam,
    delete,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError, StatementError

from policies.errors import Conflict, NotFound, PortalError
from portal.store import convert
from portal.store import elastic as elastic_rows
from portal.store import jobs as job_rows
from portal.store import ray as ray_rows
from portal.store import services as service_rows
from portal.store.checkpoint import Checkpointer
from portal.store.convert import Claim
from portal.store.db import (
    WRITE_OPTION,
    RawStatement,
    RawTransaction,
    compile_raw,
    database_unavailable,
    database_unreachable,
    make_engine,
    raw_write,
)
from portal.store.guard import AdvisoryLockGuard, Guard, NoGuard, make_guard
from portal.store.migrate import upgrade
from portal.store.reader import (
    ACTIVE_STATES,
    ALLOCATIONS,
    CLAIMS,
    EVENTS,
    META,
    QUOTAS,
    TENANTS,
    USAGE,
    WORKLOADS,
    StoreReader,
)
from portal.store.records import AllocationRecord, ChangeSet
from portal.store.violations import explain_violation


def _written_columns(table: Table) -> list[str]:
    """The columns ``commit`` writes: all but an auto-incremented key (``events.id``)."""
    return [c.name for c in table.columns if c is not table.autoincrement_column]


def _app_version() -> str:
    try:
        return importlib_metadata.version("gpuportal")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


# PostgreSQL, pipelined commits: the claims of a change set in one statement each way.
_PG_INSERT_CLAIMS = (
    f"INSERT INTO {CLAIMS.name} (node, gpu, slot, allocation_id) "
    "SELECT * FROM unnest(%s::text[], %s::int[], %s::int[], %s::text[])"
)
_PG_DELETE_CLAIMS = f"DELETE FROM {CLAIMS.name} WHERE allocation_id = ANY(%s::text[])"


def _no_check(cursor: Any) -> None:
    """A statement whose only possible failure is a database error (raised by itself)."""


def _one_row(missing: PortalError, cursor: Any) -> None:
    """The check of a statement that must change exactly one row."""
    if cursor.rowcount != 1:
        raise missing


def _merged(work: list[ChangeSet]) -> ChangeSet:
    """One change set holding every row of ``work`` (to explain a batch's constraint error)."""
    out = ChangeSet()
    for c in work:
        out.workloads.extend(c.workloads)
        out.allocations.extend(c.allocations)
        out.released.extend(c.released)
    return out


def _merged_claims(claims: list[dict[str, list[Claim]]]) -> dict[str, list[Claim]]:
    return {alloc_id: cs for per in claims for alloc_id, cs in per.items()}


class Store(StoreReader):
    """Durable state of the portal in SQLite or PostgreSQL.

    ``Store(url)`` connects and migrates the database to the newest schema. Every method is
    safe to call from several threads.
    """

    def __init__(self, url: str, *, writer_guard: bool = False) -> None:
        self.url = url
        self.engine: Engine = make_engine(url)
        self.guard: Guard = make_guard(self.engine) if writer_guard else NoGuard()
        try:
            # Before the migration: a second writer must not even migrate.
            self.guard.acquire()
            upgrade(self.engine)
            self._insert_factory = (
                sqlite.insert if self.engine.dialect.name == "sqlite" else postgresql.insert
            )
            with self._write() as conn:
                conn.execute(
                    self._insert_factory(META)
                    .values(key="app_version", value=_app_version())
                    .on_conflict_do_update(index_elements=["key"], set_={"value": _app_version()})
                )
            if isinstance(self.guard, AdvisoryLockGuard):
                self.guard.start()
        except BaseException:
            self.guard.close()
            self.engine.dispose()
            raise
        self._prepare()
        self._checkpointer = Checkpointer.start_for(self.engine)
        self._generations = itertools.count(1)
        self._generation = 0

    def writer_problem(self) -> str | None:
        """Why this store may not write now (the writer guard is lost), or None."""
        return self.guard.problem()

    @property
    def generation(self) -> int:
        """Bumped after every change this store committed: while it stays the same, nothing
        the allocator writes has changed (it is the database's only writer)."""
        return self._generation

    @classmethod
    def open(cls, url: str) -> Store:
        """Connect to ``url`` and migrate it to the newest schema."""
        return cls(url)

    def close(self) -> None:
        """Close every pooled connection. The store is unusable afterwards."""
        if self._checkpointer is not None:
            self._checkpointer.stop()
        self.guard.close()
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- statements, compiled once and reused for speed ------------------------------------

    def _prepare(self) -> None:
        # commit() runs these on the DBAPI cursor (portal.store.db.raw_write): per statement,
        # SQLAlchemy's execution machinery cost more than SQLite's own work. They are still
        # built and compiled by SQLAlchemy, for this engine's dialect.
        dialect = self.engine.dialect

        def raw(stmt: Any, table: Table | None = None) -> RawStatement:
            return compile_raw(stmt, dialect, None if table is None else _written_columns(table))

        self._insert_new: dict[str, RawStatement] = {}
        self._update_versioned: dict[str, RawStatement] = {}
        self._current_version: dict[str, RawStatement] = {}
        for table in (
            TENANTS,
            QUOTAS,
            WORKLOADS,
            job_rows.JOBS,
            service_rows.SERVICES,
            ray_rows.CLUSTERS,
            ray_rows.JOBS,
            elastic_rows.ELASTIC,
        ):
            key = table.primary_key.columns
            self._insert_new[table.name] = raw(
                # RETURNING, not rowcount: drivers disagree on rowcount for ON CONFLICT inserts.
                self._insert_factory(table)
                .on_conflict_do_nothing(index_elements=[c.name for c in key])
                .returning(table.c.version),
                table,
            )
            self._update_versioned[table.name] = compile_raw(
                update(table).where(
                    *(c == bindparam(f"key_{c.name}") for c in key),
                    table.c.version == bindparam("old_version", type_=table.c.version.type),
                ),
                dialect,
                # The key is not SET (the WHERE fixes it): SQLite would rewrite the key's index
                # entry for every key column named in SET, even with the value unchanged.
                [name for name in _written_columns(table) if name not in key],
            )
            self._current_version[table.name] = raw(
                select(table.c.version).where(*(c == bindparam(f"key_{c.name}") for c in key))
            )
        self._insert_allocation = raw(ALLOCATIONS.insert(), ALLOCATIONS)
        self._insert_claim = raw(CLAIMS.insert(), CLAIMS)
        # Claim rows are built as (node, gpu, slot, allocation_id) tuples; see _apply.
        assert self._insert_claim.names == ("node", "gpu", "slot", "allocation_id")
        self._insert_event = raw(EVENTS.insert(), EVENTS)
        self._release = raw(
            update(ALLOCATIONS)
            .where(ALLOCATIONS.c.id == bindparam("key_id"), ALLOCATIONS.c.released_at.is_(None))
            .values(released_at=bindparam("at", type_=ALLOCATIONS.c.released_at.type))
        )
        self._released_at = raw(
            select(ALLOCATIONS.c.released_at).where(ALLOCATIONS.c.id == bindparam("key_id"))
        )
        self._released_at_type = ALLOCATIONS.c.released_at.type.dialect_impl(dialect)
        self._delete_claims = raw(
            delete(CLAIMS).where(CLAIMS.c.allocation_id == bindparam("key_id"))
        )
        self._delete_quota = raw(
            delete(QUOTAS).where(
                QUOTAS.c.tenant == bindparam("key_tenant"),
                QUOTAS.c.flavor == bindparam("key_flavor"),
            )
        )
        self._busy_workloads = raw(
            select(WORKLOADS.c.id)
            .where(
                WORKLOADS.c.tenant == bindparam("key_tenant"),
                WORKLOADS.c.state.in_(
                    [
                        bindparam(f"active_{i}", type_=WORKLOADS.c.state.type)
                        for i in range(len(ACTIVE_STATES))
                    ]
                ),
            )
            .order_by(WORKLOADS.c.id)
            .limit(6)
        )
        self._delete_tenant_row = raw(
            delete(TENANTS).where(TENANTS.c.name == bindparam("key_name"))
        )
        self._delete_usage = raw(delete(USAGE).where(USAGE.c.tenant == bindparam("key_tenant")))

        def upsert(table: Table) -> RawStatement:
            """Insert a row, or overwrite every non-key column of the one with its key."""
            insert = self._insert_factory(table)
            keys = [c.name for c in table.primary_key.columns]
            rest = {c.name: insert.excluded[c.name] for c in table.columns if not c.primary_key}
            return raw(insert.on_conflict_do_update(index_elements=keys, set_=rest), table)

        self._upsert_attempt = upsert(job_rows.ATTEMPTS)
        self._upsert_replica = upsert(service_rows.REPLICAS)
        self._upsert_slice = upsert(ray_rows.SLICES)
        usage_insert = self._insert_factory(USAGE)
        self._upsert_usage = raw(
            usage_insert.on_conflict_do_update(
                index_elements=["tenant"],
                set_={
                    "value": usage_insert.excluded.value,
                    "updated_at": usage_insert.excluded.updated_at,
                },
            ),
            USAGE,
        )

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with (
            self.engine.connect().execution_options(**{WRITE_OPTION: True}) as conn,
            conn.begin(),
        ):
            yield conn

    # -- writing ---------------------------------------------------------------------------

    def commit(self, changes: ChangeSet) -> None:
        """Apply everything in ``changes`` in one transaction, or nothing of it.

        Raises:
            Conflict: a version moved, a device is already claimed, an idempotency key is
                taken, a released allocation was already released, or a deleted tenant still
                has non-terminal workloads.
            NotFound: a released allocation, deleted tenant or quota, or the workload of a new
                allocation does not exist.
            InvalidRequest: a record is malformed (naive timestamp, bad flavor or MIG slot).
            Unavailable: the database is unreachable, or this store lost its writer guard
                (nothing was written).
        """
        self.commit_all([changes])

    def commit_all(self, batch: Iterable[ChangeSet]) -> None:
        """Apply several change sets, each as ``commit`` would and in order, in one
        transaction, or nothing of any of them (the allocator's group commit: one COMMIT, so
        one WAL flush, for many decisions). Raises what ``commit`` raises."""
        work = [c for c in batch if not c.empty()]
        if not work:
            return
        self.guard.check()
        now = datetime.now(UTC)
        claims = [self._new_claims(c.allocations) for c in work]
        try:
            # Pipelined on PostgreSQL: the batch's statements travel together and their
            # results come back together before COMMIT (portal.store.db.raw_write).
            with raw_write(self.engine, pipeline=True) as tx:
                self.guard.fence(tx)
                for changes, new_claims in zip(work, claims, strict=True):
                    self._apply(tx, changes, new_claims, now)
            self._generation = next(self._generations)
        except IntegrityError as err:
            if len(work) == 1:
                raise explain_violation(self._read, work[0], claims[0], err) from err
            raise explain_violation(self._read, _merged(work), _merged_claims(claims), err) from err
        except DBAPIError as err:
            if not database_unreachable(err):
                raise
            if err.statement == "COMMIT":
                self.guard.commit_unknown()
            raise database_unavailable(err) from err
        except StatementError as err:
            if isinstance(err.orig, PortalError):
                raise err.orig from None
            raise

    def _apply(
        self,
        tx: RawTransaction,
        changes: ChangeSet,
        new_claims: Mapping[str, list[Claim]],
        now: datetime,
    ) -> None:
        # Order matters: releases come before new allocations, so a preemption that frees a
        # GPU and hands it to another workload in the same decision is accepted.
        for t in changes.tenants:
            self._versioned(tx, TENANTS, convert.tenant_row(t), f"tenant {t.name!r}")
        for q in changes.quotas:
            self._versioned(tx, QUOTAS, convert.quota_row(q), f"quota {q.tenant}/{q.flavor}")
        for w in changes.workloads:
            self._versioned(tx, WORKLOADS, convert.workload_row(w), f"workload {w.id!r}")
        if changes.released:
            self._apply_releases(tx, changes.released)
        if changes.allocations:
            tx.insert_rows(
                self._insert_allocation,
                [convert.allocation_row(a, now) for a in changes.allocations],
            )
            rows = [(*c, alloc_id) for alloc_id, cs in new_claims.items() for c in cs]
            if rows:
                if tx.pipelined:
                    # One statement for every claim (an 8-GPU allocation has 8 per GPU on
                    # MIG-capable models): the rows travel as four array literals.
                    nodes, gpus, slots, ids = zip(*rows, strict=True)
                    columns = [
                        convert.pg_text_array(nodes),
                        convert.pg_int_array(gpus),
                        convert.pg_int_array(slots),
                        convert.pg_text_array(ids),
                    ]
                    tx.submit_sql(_PG_INSERT_CLAIMS, columns, _no_check)
                else:
                    tx.executemany_values(self._insert_claim, rows)
        for tenant, flavor in changes.deleted_quotas:
            tx.submit(
                self._delete_quota,
                {"key_tenant": tenant, "key_flavor": flavor},
                partial(_one_row, NotFound("quota", f"{tenant}/{flavor}")),
            )
        for name in changes.deleted_tenants:
            self._delete_tenant(tx, name)
        # Jobs before their attempts (the attempts' foreign key).
        for j in changes.jobs:
            self._versioned(tx, job_rows.JOBS, job_rows.job_row(j), f"job {j.id!r}")
        if changes.attempts:
            tx.executemany(
                self._upsert_attempt, [job_rows.attempt_row(a) for a in changes.attempts]
            )
        # Services before their replicas (the replicas' foreign key).
        for sv in changes.services:
            self._versioned(
                tx, service_rows.SERVICES, service_rows.service_row(sv), f"service {sv.id!r}"
            )
        if changes.replicas:
            tx.executemany(
                self._upsert_replica, [service_rows.replica_row(r) for r in changes.replicas]
            )
        # Clusters before their slices (the slices' foreign key).
        for c in changes.ray_clusters:
            self._versioned(tx, ray_rows.CLUSTERS, ray_rows.cluster_row(c), f"Ray cluster {c.id!r}")
        if changes.ray_slices:
            tx.executemany(self._upsert_slice, [ray_rows.slice_row(r) for r in changes.ray_slices])
        # After their clusters (the foreign key).
        for rj in changes.ray_jobs:
            self._versioned(tx, ray_rows.JOBS, ray_rows.job_row(rj), f"Ray job {rj.id!r}")
        for es in changes.elastic:
            row = elastic_rows.elastic_row(es)
            self._versioned(tx, elastic_rows.ELASTIC, row, f"elastic settings of {es.tenant!r}")
        if changes.events:
            tx.insert_rows(self._insert_event, [convert.event_row(e) for e in changes.events])
        if changes.usage_history:
            # One row per tenant (a mapping): the upsert touches no row twice.
            tx.insert_rows(
                self._upsert_usage,
                [
                    {"tenant": tenant, "value": value, "updated_at": at}
                    for tenant, (value, at) in changes.usage_history.items()
                ],
            )

    def _versioned(self, tx: RawTransaction, table: Table, row: dict[str, Any], what: str) -> None:
        version = row["version"]
        if version < 1:
            raise Conflict(f"{what} carries version {version}; versions start at 1")
        keys = {f"key_{c.name}": row[c.name] for c in table.primary_key.columns}

        def check(cursor: Any) -> None:
            done = bool(cursor.fetchall()) if version == 1 else cursor.rowcount == 1
            if not done:
                self._stale(tx, table, keys, version, what)

        if version == 1:
            tx.submit(self._insert_new[table.name], row, check)
        else:
            params = {**row, **keys, "old_version": version - 1}
            tx.submit(self._update_versioned[table.name], params, check)

    def _stale(
        self, tx: RawTransaction, table: Table, keys: dict[str, Any], version: int, what: str
    ) -> None:
        found = tx.execute(self._current_version[table.name], keys).fetchone()
        expected = (
            "no stored row (version 1 creates one)"
            if version == 1
            else (f"stored version {version - 1}")
        )
        stored = "no stored row" if found is None else f"stored version {found[0]}"
        raise Conflict(
            f"stale {what}: writing version {version} needs {expected}, found {stored}; "
            "reload it and retry"
        )

    def _apply_releases(self, tx: RawTransaction, released: list[tuple[str, datetime]]) -> None:
        for alloc_id, at in released:
            tx.submit(
                self._release,
                {"key_id": alloc_id, "at": at},
                partial(self._released_once, tx, alloc_id),
            )
        if tx.pipelined:
            ids = convert.pg_text_array(alloc_id for alloc_id, _ in released)
            tx.submit_sql(_PG_DELETE_CLAIMS, (ids,), _no_check)
        else:
            tx.executemany(self._delete_claims, [{"key_id": alloc_id} for alloc_id, _ in released])

    def _released_once(self, tx: RawTransaction, alloc_id: str, cursor: Any) -> None:
        """The check of one release: it must have ended exactly one active allocation."""
        if cursor.rowcount == 1:
            return
        found = tx.execute(self._released_at, {"key_id": alloc_id}).fetchone()
        if found is None:
            raise NotFound("allocation", alloc_id)
        # The stored value as SQLAlchemy would hand it back: an aware UTC datetime.
        to_python = self._released_at_type.result_processor(self.engine.dialect, None)
        when = found[0] if to_python is None else to_python(found[0])
        assert when is not None  # the row exists and the UPDATE skipped it: it is released
        raise Conflict(
            f"allocation {alloc_id!r} was already released at {when.isoformat()}; "
            "only active allocations can be released"
        )

    def _delete_tenant(self, tx: RawTransaction, name: str) -> None:
        active = {f"active_{i}": s for i, s in enumerate(ACTIVE_STATES)}
        busy = [
            r[0]
            for r in tx.execute(self._busy_workloads, {"key_tenant": name, **active}).fetchall()
        ]
        if busy:
            shown = ", ".join(busy[:5]) + (", …" if len(busy) > 5 else "")
            raise Conflict(
                f"tenant {name!r} still has non-terminal workloads ({shown}); cancel or "
                "release them before deleting the tenant"
            )
        if tx.execute(self._delete_tenant_row, {"key_name": name}).rowcount != 1:
            raise NotFound("tenant", name)
        tx.execute(self._delete_usage, {"key_tenant": name})

    @staticmethod
    def _new_claims(allocations: Iterable[AllocationRecord]) -> dict[str, list[Claim]]:
        """Claims per new allocation; two new allocations that overlap are a Conflict."""
        owner: dict[Claim, str] = {}
        result: dict[str, list[Claim]] = {}
        for a in allocations:
            cs = convert.claims(a)
            for c in cs:
                other = owner.setdefault(c, a.id)
                if other != a.id:
                    raise Conflict(
                        f"GPU {c[1]} on {c[0]} is claimed twice in one change, by allocations "
                        f"{other!r} and {a.id!r}"
                    )
            result[a.id] = cs
        return result
