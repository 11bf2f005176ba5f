"""Telemetry storage: ingest, roll-ups (raw -> 1 min -> 1 h) and retention.

Ingest stores a batch in one transaction: the raw device rows, the rows attributed to
workloads, and a *dirty* mark for each minute the batch touched. ``roll_up(now)`` recomputes
every dirty, closed minute from the raw rows, marking its hour dirty, then every dirty, closed
hour from the minute rows. A bucket is always recomputed whole from the level below, never
incremented, so:

- re-running a roll-up changes nothing;
- a re-sent sample hits the raw table's primary key (device, time) and is counted as a
  duplicate, so it cannot be counted twice;
- a late (out-of-order) sample marks its minute dirty again, and the next roll-up corrects the
  minute and its hour.

``prune(now)`` deletes what is older than the retention of each level.

Every write or delete of workload roll-ups bumps, in the same transaction, the revision of
their hour and step (``telemetry_revisions``): the sum of the revisions of a range changes
exactly when its roll-ups may have, and costs an index read of a few rows where counting the
roll-ups themselves reads thousands (``portal.accounting.telemetry``). Revision rows are never
deleted (two per hour), so that sum only grows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Engine,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import ColumnElement

from policies.alerts.samples import ShareKind
from policies.errors import InvalidRequest
from policies.flavors import MILLI_PER_GPU
from portal.store.db import RawStatement, RawTransaction, compile_raw, raw_write
from portal.telemetry.attribution import AllocationIndex, Holder
from portal.telemetry.tables import (
    DIRTY,
    REVISIONS,
    ROLLUPS,
    SAMPLES,
    WORKLOAD_ROLLUPS,
    WORKLOAD_SAMPLES,
)
from portal.telemetry.wire import (
    MAX_REJECTIONS_LISTED,
    GpuSample,
    IngestResult,
    Rejection,
    SampleBatch,
)

MINUTE_S = 60
HOUR_S = 3600
DAY_S = 86_400

_SAMPLE_COLUMNS = [c.name for c in SAMPLES.columns]
_WORKLOAD_COLUMNS = [c.name for c in WORKLOAD_SAMPLES.columns]
_DIRTY_COLUMNS = [c.name for c in DIRTY.columns]


@dataclass(frozen=True, slots=True)
class Retention:
    """How long each level is kept, and how far ahead of the portal's clock a sample may be.

    Samples older than ``raw_s`` are rejected at ingest: they would be pruned at once.
    """

    raw_s: float = 2 * DAY_S
    minute_s: float = 31 * DAY_S
    hour_s: float = 400 * DAY_S
    max_skew_s: float = 60.0

    def __post_init__(self) -> None:
        for name, value in (
            ("raw retention", self.raw_s),
            ("1-minute retention", self.minute_s),
            ("1-hour retention", self.hour_s),
        ):
            if not value >= HOUR_S:
                raise InvalidRequest(name, value, f"seconds >= {HOUR_S}")
        if not self.raw_s <= self.minute_s <= self.hour_s:
            raise InvalidRequest(
                "retention",
                f"raw {self.raw_s}, 1m {self.minute_s}, 1h {self.hour_s}",
                "raw <= 1-minute <= 1-hour",
            )
        if not 0 <= self.max_skew_s <= HOUR_S:
            raise InvalidRequest("maximum clock skew", self.max_skew_s, f"0..{HOUR_S} seconds")


def _ms(t: float) -> int:
    return round(t * 1000)


class _Batch:
    """Rows of one batch, with its rejections and duplicates counted."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.workload_rows: list[tuple[Any, ...]] = []
        self.minutes: set[int] = set()
        self.rejections: list[Rejection] = []
        self.rejected = 0
        self.duplicates = 0

    def reject(self, index: int, device: str, reason: str) -> None:
        self.rejected += 1
        if len(self.rejections) < MAX_REJECTIONS_LISTED:
            self.rejections.append(Rejection(index=index, device=device, reason=reason))


class TelemetryStore:
    """Samples and roll-ups in the portal's database (the store's engine, migrated)."""

    def __init__(self, engine: Engine, retention: Retention | None = None) -> None:
        self.engine = engine
        self.retention = retention or Retention()
        dialect = engine.dialect
        insert = sqlite.insert if dialect.name == "sqlite" else postgresql.insert
        self._insert = insert

        def ignore(table: Table, columns: Sequence[str]) -> RawStatement:
            stmt = insert(table).on_conflict_do_nothing(
                index_elements=[c.name for c in table.primary_key.columns]
            )
            return compile_raw(stmt, dialect, columns)

        self._insert_samples = ignore(SAMPLES, _SAMPLE_COLUMNS)
        self._insert_workload_samples = ignore(WORKLOAD_SAMPLES, _WORKLOAD_COLUMNS)
        self._insert_dirty = ignore(DIRTY, ["step_s", "bucket_ms"])
        # PostgreSQL: one statement per batch, each table's rows as one JSON parameter, the
        # three inserts as data-modifying CTEs: one round trip where executemany costs one (and
        # a pipeline sync) per row.
        self._pg_insert = _json_inserts() if dialect.name == "postgresql" else None

    # -- ingest ------------------------------------------------------------------------------

    def ingest(self, batch: SampleBatch, index: AllocationIndex, now: float) -> IngestResult:
        """Store ``batch`` as of ``now`` (epoch s); see ``portal.telemetry.wire`` for what is
        rejected, stored or counted as a duplicate."""
        b = _Batch()
        newest = _ms(now + self.retention.max_skew_s)
        oldest = _ms(now - self.retention.raw_s)
        seen: set[tuple[str, int]] = set()
        for i, s in enumerate(batch.samples):
            device = s.device
            gpu = index.gpus.get(s.gpu_uuid)
            at_ms = _ms(s.at)
            if gpu is None:
                b.reject(i, device, f"unknown GPU {s.gpu_uuid}: not in the portal's inventory")
            elif gpu.node != batch.node:
                b.reject(i, device, f"GPU {s.gpu_uuid} is on node {gpu.node}, not {batch.node}")
            elif at_ms > newest:
                b.reject(
                    i,
                    device,
                    f"sample time {s.at} is {s.at - now:.0f} s ahead of the portal's clock "
                    f"{now} (at most {self.retention.max_skew_s:.0f} s): check the node's clock",
                )
            elif at_ms < oldest:
                b.reject(
                    i,
                    device,
                    f"sample time {s.at} is older than the raw retention "
                    f"({self.retention.raw_s:.0f} s before {now})",
                )
            elif (device, at_ms) in seen:
                b.duplicates += 1
            else:
                seen.add((device, at_ms))
                b.rows.append(_sample_row(batch, s, device, at_ms))
                b.workload_rows.extend(_attribute(s, device, at_ms, index))
                b.minutes.add(at_ms - at_ms % (MINUTE_S * 1000))
        inserted = 0
        if b.rows:
            dirty = [(MINUTE_S, m) for m in sorted(b.minutes)]
            if self._pg_insert is not None:
                inserted = self._pg_ingest(b.rows, b.workload_rows, dirty)
            else:
                with raw_write(self.engine) as tx:
                    tx.executemany_values(self._insert_samples, b.rows)
                    inserted = max(tx.cursor.rowcount, 0)
                    if b.workload_rows:
                        tx.executemany_values(self._insert_workload_samples, b.workload_rows)
                    tx.executemany_values(self._insert_dirty, dirty)
        b.duplicates += len(b.rows) - inserted
        return IngestResult(
            accepted=inserted,
            duplicates=b.duplicates,
            rejected=b.rejected,
            rejections=b.rejections,
        )

    def _pg_ingest(
        self,
        rows: list[tuple[Any, ...]],
        workload_rows: list[tuple[Any, ...]],
        dirty: list[tuple[int, int]],
    ) -> int:
        """Insert a batch's rows with one PostgreSQL statement; returns the new raw rows.

        The statement runs in autocommit mode: being a single statement, it is its own
        transaction (all three inserts or none), and it costs one round trip where BEGIN,
        the statement and COMMIT cost three. The rows travel as three JSON texts, which
        ``json.dumps`` writes in C, where the driver's array adapters spend Python time on
        every value of every column.
        """
        from psycopg.pq import TransactionStatus  # the postgres extra, present on this path

        assert self._pg_insert is not None
        params = {
            "samples": _json_rows(_SAMPLE_COLUMNS, rows),
            "workloads": _json_rows(_WORKLOAD_COLUMNS, workload_rows),
            "dirty": _json_rows(_DIRTY_COLUMNS, dirty),
        }
        connection = self.engine.raw_connection()
        try:
            driver: Any = connection.driver_connection
            driver.autocommit = True
            try:
                tx = RawTransaction(self.engine, connection)
                return int(tx.execute(self._pg_insert, params).fetchone()[0])
            finally:
                # Back to what the pool hands out; a connection left in a transaction (it
                # should not be) or lost is dropped rather than returned.
                if connection.is_valid and driver.info.transaction_status == TransactionStatus.IDLE:
                    driver.autocommit = False
                elif connection.is_valid:
                    connection.invalidate()
        finally:
            connection.close()

    # -- roll-ups and retention -------------------------------------------------------------

    def roll_up(self, now: float) -> int:
        """Recompute every dirty bucket that closed by ``now``; returns how many."""
        done = self._roll(MINUTE_S, now)
        done += self._roll(HOUR_S, now)
        return done

    def _roll(self, step_s: int, now: float) -> int:
        step_ms = step_s * 1000
        closed_before = _ms(now) - step_ms
        with self.engine.begin() as conn:
            buckets = sorted(
                conn.execute(
                    delete(DIRTY)
                    .where(DIRTY.c.step_s == step_s, DIRTY.c.bucket_ms <= closed_before)
                    .returning(DIRTY.c.bucket_ms)
                ).scalars()
            )
            for bucket in buckets:
                for stmt in self._rollup_statements(step_s):
                    conn.execute(stmt, {"lo": bucket, "hi": bucket + step_ms})
                if step_s == MINUTE_S:
                    hour = bucket - bucket % (HOUR_S * 1000)
                    conn.execute(
                        self._insert(DIRTY)
                        .values(step_s=HOUR_S, bucket_ms=hour)
                        .on_conflict_do_nothing(index_elements=["step_s", "bucket_ms"])
                    )
            hours = sorted({b - b % (HOUR_S * 1000) for b in buckets})
            if hours:
                rows = [{"step_s": step_s, "hour_ms": h, "revision": 1} for h in hours]
                conn.execute(self._bump(self._insert(REVISIONS).values(rows)))
        return len(buckets)

    def _bump(self, stmt: Any) -> Any:
        """``stmt`` (an insert of revision rows at 1) adding 1 to the rows already there."""
        return stmt.on_conflict_do_update(
            index_elements=["step_s", "hour_ms"], set_={"revision": REVISIONS.c.revision + 1}
        )

    def _rollup_statements(self, step_s: int) -> list[Any]:
        lo: ColumnElement[int] = bindparam("lo", type_=BigInteger())
        hi: ColumnElement[int] = bindparam("hi", type_=BigInteger())
        if step_s == MINUTE_S:
            s, w = SAMPLES, WORKLOAD_SAMPLES
            device = select(
                literal(MINUTE_S).label("step_s"),
                s.c.device,
                lo.label("bucket_ms"),
                func.count().label("samples"),
                func.avg(s.c.utilization_pct),
                func.min(s.c.utilization_pct),
                func.max(s.c.utilization_pct),
                func.avg(s.c.activity_pct),
                func.avg(s.c.memory_used_mib),
                func.max(s.c.memory_used_mib),
                func.avg(s.c.power_w),
                func.max(s.c.power_w),
                func.max(s.c.temperature_c),
            ).where(s.c.at_ms >= lo, s.c.at_ms < hi)
            device = device.group_by(s.c.device)
            workload = (
                select(
                    literal(MINUTE_S).label("step_s"),
                    w.c.workload_id,
                    lo.label("bucket_ms"),
                    func.max(w.c.tenant),
                    *workload_aggregates(),
                )
                .where(w.c.at_ms >= lo, w.c.at_ms < hi)
                .group_by(w.c.workload_id)
            )
        else:
            r, q = ROLLUPS, WORKLOAD_ROLLUPS
            n = r.c.samples
            device = (
                select(
                    literal(HOUR_S).label("step_s"),
                    r.c.device,
                    lo.label("bucket_ms"),
                    func.sum(n),
                    _weighted(r.c.utilization_avg, n),
                    func.min(r.c.utilization_min),
                    func.max(r.c.utilization_max),
                    _weighted(r.c.activity_avg, n),
                    _weighted(r.c.memory_used_avg, n),
                    func.max(r.c.memory_used_max),
                    _weighted(r.c.power_avg, n),
                    func.max(r.c.power_max),
                    func.max(r.c.temperature_max),
                )
                .where(r.c.step_s == MINUTE_S, r.c.bucket_ms >= lo, r.c.bucket_ms < hi)
                .group_by(r.c.device)
            )
            m = q.c.samples
            workload = (
                select(
                    literal(HOUR_S).label("step_s"),
                    q.c.workload_id,
                    lo.label("bucket_ms"),
                    func.max(q.c.tenant),
                    func.sum(m),
                    _weighted(q.c.utilization_avg, m),
                    func.min(q.c.utilization_min),
                    func.max(q.c.utilization_max),
                    _weighted(q.c.memory_used_avg, m),
                    func.max(q.c.memory_used_max),
                )
                .where(q.c.step_s == MINUTE_S, q.c.bucket_ms >= lo, q.c.bucket_ms < hi)
                .group_by(q.c.workload_id)
            )
        return [
            self._upsert(ROLLUPS, device, ["step_s", "device", "bucket_ms"]),
            self._upsert(WORKLOAD_ROLLUPS, workload, ["step_s", "workload_id", "bucket_ms"]),
        ]

    def _upsert(self, table: Table, source: Any, key: list[str]) -> Any:
        columns = [c.name for c in table.columns]
        stmt = self._insert(table).from_select(columns, source)
        return stmt.on_conflict_do_update(
            index_elements=key,
            set_={c: getattr(stmt.excluded, c) for c in columns if c not in key},
        )

    def prune(self, now: float) -> int:
        """Delete rows past their level's retention; returns how many."""
        r = self.retention
        raw_before, minute_before, hour_before = (
            _ms(now - r.raw_s),
            _ms(now - r.minute_s),
            _ms(now - r.hour_s),
        )
        deleted = 0
        with self.engine.begin() as conn:
            for step_s, before in ((MINUTE_S, minute_before), (HOUR_S, hour_before)):
                conn.execute(self._bump_pruned(step_s, before))
            for stmt in (
                delete(SAMPLES).where(SAMPLES.c.at_ms < raw_before),
                delete(WORKLOAD_SAMPLES).where(WORKLOAD_SAMPLES.c.at_ms < raw_before),
                *(
                    delete(t).where(
                        (t.c.step_s == MINUTE_S) & (t.c.bucket_ms < minute_before)
                        | (t.c.step_s == HOUR_S) & (t.c.bucket_ms < hour_before)
                    )
                    for t in (ROLLUPS, WORKLOAD_ROLLUPS)
                ),
            ):
                deleted += conn.execute(stmt).rowcount
        return deleted

    def _bump_pruned(self, step_s: int, before_ms: int) -> Any:
        """Bump the revision of every hour holding workload roll-ups of ``step_s`` older than
        ``before_ms`` (about to be pruned): usually one hour, read from the roll-ups' index."""
        r = WORKLOAD_ROLLUPS.c
        hour = (r.bucket_ms - r.bucket_ms % (HOUR_S * 1000)).label("hour_ms")
        pruned = (
            select(literal(step_s).label("step_s"), hour, literal(1).label("revision"))
            .where(r.step_s == step_s, r.bucket_ms < before_ms)
            .distinct()
        )
        return self._bump(
            self._insert(REVISIONS).from_select(["step_s", "hour_ms", "revision"], pruned)
        )


def _json_inserts() -> RawStatement:
    """One PostgreSQL statement inserting raw, workload and dirty rows, each table's rows given
    as one JSON array of objects keyed by column, skipping rows already there; it returns how
    many raw rows were new."""
    parts = []
    for alias, table in (("s", SAMPLES), ("w", WORKLOAD_SAMPLES), ("d", DIRTY)):
        names = ", ".join(c.name for c in table.columns)
        key = ", ".join(c.name for c in table.primary_key.columns)
        parts.append(
            f"{alias} AS (INSERT INTO {table.name} ({names}) SELECT {names} FROM "
            f"json_populate_recordset(NULL::{table.name}, %s::json) "
            f"ON CONFLICT ({key}) DO NOTHING RETURNING 1)"
        )
    params = ["samples", "workloads", "dirty"]
    sql = "WITH " + ", ".join(parts) + " SELECT count(*) FROM s"
    return RawStatement(sql, params, params, [None, None, None], positional=True)


def _json_rows(columns: Sequence[str], rows: list[tuple[Any, ...]]) -> str:
    """Rows (in ``columns``' order) as a JSON array of objects; floats keep every digit."""
    return json.dumps([dict(zip(columns, row, strict=True)) for row in rows])


def _weighted(avg: ColumnElement[Any], n: ColumnElement[Any]) -> ColumnElement[Any]:
    """The average of averages weighted by their sample counts, ignoring NULL averages."""
    counted = func.sum(case((avg.is_not(None), n), else_=0))
    return func.sum(avg * n) / func.nullif(counted, 0)


def _sample_row(batch: SampleBatch, s: GpuSample, device: str, at_ms: int) -> tuple[Any, ...]:
    # In the order of the table's columns (_SAMPLE_COLUMNS).
    return (
        device,
        at_ms,
        batch.node,
        s.gpu_uuid,
        batch.source.value,
        s.utilization_pct,
        s.activity_pct,
        s.memory_used_mib,
        s.memory_total_mib,
        s.power_w,
        s.temperature_c,
        s.throttle_reasons,
        s.xid_count,
        s.last_xid,
        s.ecc_uncorrectable,
        s.ecc_correctable,
        s.pcie_tx_bytes_s,
        s.pcie_rx_bytes_s,
        s.nvlink_tx_bytes_s,
        s.nvlink_rx_bytes_s,
    )


def holders_of_sample(s: GpuSample, index: AllocationIndex) -> list[Holder]:
    """The exclusive holder of a whole GPU or MIG instance sample, or the GPU's share holders."""
    holders = index.holders.get(s.gpu_uuid, ())
    if s.gpu_instance_id is None:
        whole = [h for h in holders if h.share is ShareKind.WHOLE]
        return whole[:1] if whole else [h for h in holders if h.share is ShareKind.MILLI]
    migs = [h for h in holders if h.share is ShareKind.MIG]
    gpu = index.gpus.get(s.gpu_uuid)
    placed = gpu.mig_instances.get(s.mig_uuid) if gpu is not None and s.mig_uuid else None
    if placed is not None:
        return [h for h in migs if (h.mig_profile, h.mig_start) == placed][:1]
    named = {index.workload_of_process(p.workload_id, p.user, p.server) for p in s.processes} - {
        None
    }
    by_process = [h for h in migs if h.workload_id in named]
    if by_process:
        return by_process[:1]
    return migs if len(migs) == 1 else []


def _attribute(
    s: GpuSample, device: str, at_ms: int, index: AllocationIndex
) -> Iterable[tuple[Any, ...]]:
    """Rows of ``telemetry_workload_samples`` for one sample (columns' order)."""
    holders = holders_of_sample(s, index)
    if not holders:
        return []
    if holders[0].share is not ShareKind.MILLI:
        h = holders[0]
        return [(h.workload_id, device, at_ms, h.tenant, s.utilization_pct, 1.0, s.memory_used_mib)]
    # A shared GPU: each share holder's part, from its own processes.
    util: dict[str, float] = {}
    memory: dict[str, float] = {}
    measured = False
    for p in s.processes:
        wid = index.workload_of_process(p.workload_id, p.user, p.server)
        if wid is None:
            continue
        memory[wid] = memory.get(wid, 0.0) + p.memory_used_mib
        if p.sm_util_pct is not None:
            measured = True
            util[wid] = util.get(wid, 0.0) + p.sm_util_pct
    return [
        (
            h.workload_id,
            device,
            at_ms,
            h.tenant,
            min(100.0, util.get(h.workload_id, 0.0)) if measured else None,
            h.milli / MILLI_PER_GPU,
            memory.get(h.workload_id, 0.0),
        )
        for h in holders
    ]


def of_allocation() -> ColumnElement[float]:
    """A workload sample's utilization in % of its allocation (at most 100)."""
    w = WORKLOAD_SAMPLES
    part = w.c.utilization_pct / w.c.allocated_fraction
    return case((part > 100.0, 100.0), else_=part)


def workload_aggregates() -> tuple[ColumnElement[Any], ...]:
    """Over a group of workload samples: count, utilization of the allocation (avg, min, max),
    memory used (avg, max) — the columns of a roll-up bucket and of a raw series point."""
    w = WORKLOAD_SAMPLES
    share = of_allocation()
    return (
        func.count(),
        func.avg(share),
        func.min(share),
        func.max(share),
        func.avg(w.c.memory_used_mib),
        func.max(w.c.memory_used_mib),
    )


def between(column: ColumnElement[int], start_ms: int, end_ms: int) -> ColumnElement[bool]:
    """``start_ms <= column < end_ms``."""
    return and_(column >= start_ms, column < end_ms)
