"""One writer per database: the guard a serving process holds for as long as it writes.

The allocator keeps its state in memory and trusts it (see docs/decisions/0001), so two
processes writing one database would each decide on half the truth: shares oversubscribed,
quotas exceeded. The guard makes the second one refuse to start instead.

- **PostgreSQL**: a session-level advisory lock, taken on a dedicated connection kept open for
  the life of the process. The server frees it when that connection ends, so a writer killed
  with SIGKILL frees it at once (its socket closes; TCP keepalives cover a vanished host).
  Because a connection can be lost, every commit also checks *inside its transaction* that
  the guard connection's backend still holds the lock (``fence``): a writer that lost it
  cannot commit, whatever its threads believe. A monitor thread pings the guard connection
  every second; when it fails the guard is ``lost`` (commits answer 503, ``/ready`` fails) and
  the monitor takes the lock again once the server is back — unless another writer wrote in
  between (the ``meta`` row ``writer`` names the last one), or a commit's outcome is unknown
  (the connection dropped during COMMIT): memory may then differ from the database, so the
  guard is ``fenced`` for good and the process must restart to rebuild from the database.
- **SQLite**: an exclusive ``flock`` on ``<database>-writer.lock`` beside the file, freed by the
  kernel when the process dies. An in-memory database has no second process to guard against.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine, Table, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import OperationalError

from policies.errors import PortalError, Unavailable
from portal.store.db import POSTGRES_CONNECT_TIMEOUT_S, RETRY_AFTER_S, RawTransaction
from portal.store.models import metadata

log = logging.getLogger(__name__)

# pg_try_advisory_lock(int4, int4): shows in pg_locks as classid, objid with objsubid 2.
LOCK_CLASS = 0x67707075  # "gpup"
LOCK_OBJECT = 1  # the writer
MONITOR_INTERVAL_S = 1.0
WRITER_META_KEY = "writer"
META: Table = metadata.tables["meta"]


class WriterTaken(PortalError):
    """Another process holds the database's writer guard: this one may not write."""

    code = "writer_taken"


def describe_self(token: str) -> str:
    since = datetime.now(UTC).isoformat(timespec="seconds")
    return f"host {socket.gethostname()} pid {os.getpid()} since {since} (token {token})"


def make_guard(engine: Engine) -> Guard:
    """The guard for ``engine``'s database (none for an in-memory one)."""
    if engine.dialect.name == "postgresql":
        return AdvisoryLockGuard(engine)
    if engine.url.database in (None, "", ":memory:"):
        return NoGuard()
    return FileGuard(engine.url.database)


class Guard(Protocol):
    token: str

    def acquire(self) -> None: ...

    def check(self) -> None: ...

    def fence(self, tx: RawTransaction) -> None: ...

    def commit_unknown(self) -> None: ...

    def problem(self) -> str | None: ...

    def close(self) -> None: ...


class NoGuard:
    """No guard (an in-memory database, or a store opened by a tool or a test)."""

    token = ""

    def acquire(self) -> None:
        pass

    def check(self) -> None:
        pass

    def fence(self, tx: RawTransaction) -> None:
        pass

    def commit_unknown(self) -> None:
        pass

    def problem(self) -> str | None:
        return None

    def close(self) -> None:
        pass


class FileGuard(NoGuard):
    """SQLite: an exclusive ``flock`` on a file beside the database."""

    def __init__(self, database: str) -> None:
        self.path = Path(f"{database}-writer.lock")
        self.token = uuid.uuid4().hex[:12]
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise WriterTaken(
                f"another gpuportal serve is the writer of this database ({holder}); "
                f"stop it first (lock file {self.path})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, describe_self(self.token).encode(), 0)
        self._fd = fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # frees the lock


class AdvisoryLockGuard:
    """PostgreSQL: a session advisory lock on a dedicated connection (see the module doc)."""

    def __init__(self, engine: Engine, *, interval_s: float | None = None) -> None:
        self._engine = engine
        self._interval_s = MONITOR_INTERVAL_S if interval_s is None else interval_s
        self.token = uuid.uuid4().hex[:12]
        self._me = describe_self(self.token)
        self._conn: Any = None
        self._backend_pid = 0
        self._lock = threading.Lock()  # the guard connection is used by one thread at a time
        self._lost: str | None = None
        self._fenced: str | None = None
        self._unknown_commit = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_fenced: Callable[[str], None] | None = None

    # -- taking the lock -------------------------------------------------------------------

    def _connect(self) -> Any:
        # A DBAPI connection of the engine's own URL, outside its pool (which may drop it).
        dialect = self._engine.dialect
        cargs, cparams = dialect.create_connect_args(self._engine.url)
        try:
            conn = dialect.loaded_dbapi.connect(
                *cargs, **{"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S, **cparams}
            )
        except dialect.loaded_dbapi.Error as err:
            # As the engine raises it, so callers see one kind of "cannot connect".
            raise OperationalError("connect", None, err) from err
        conn.autocommit = True
        with conn.cursor() as cur:
            # Shown to a refused second writer (pg_stat_activity), with the connection's start.
            name = f"gpuportal writer on {socket.gethostname()} pid {os.getpid()}"
            cur.execute("SELECT set_config('application_name', %s, false)", (name[:63],))
            # The server notices a vanished client in ~10 s, not after hours.
            for name, value in (
                ("tcp_keepalives_idle", 5),
                ("tcp_keepalives_interval", 2),
                ("tcp_keepalives_count", 3),
            ):
                cur.execute(f"SET {name} = {value}")
        return conn

    def _try_lock(self, conn: Any) -> bool:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, LOCK_OBJECT))
            got = bool(cur.fetchone()[0])
            cur.execute("SELECT pg_backend_pid()")
            self._backend_pid = int(cur.fetchone()[0])
        return got

    def _holder(self, conn: Any) -> str:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT a.application_name, a.client_addr, a.backend_start FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
                "AND l.classid = %s AND l.objid = %s AND l.objsubid = 2 AND l.granted",
                (LOCK_CLASS, LOCK_OBJECT),
            )
            row = cur.fetchone()
        if row is None:
            return "a process that has just released it"
        name, addr, start = row
        since = start.isoformat(timespec="seconds") if start else "unknown time"
        return f"{name or 'a session'} from {addr or 'a local socket'}, connected since {since}"

    def acquire(self) -> None:
        """Take the lock, or raise ``WriterTaken`` naming who holds it."""
        conn = self._connect()
        if not self._try_lock(conn):
            holder = self._holder(conn)
            conn.close()
            raise WriterTaken(
                f"another gpuportal serve is the writer of this database: {holder}; stop it "
                "first (a killed writer frees the lock within seconds)"
            )
        self._conn = conn

    def start(self) -> None:
        """Record this process as the writer and watch the guard connection."""
        self._write_meta(self._me)
        self._thread = threading.Thread(target=self._monitor, name="writer-guard", daemon=True)
        self._thread.start()

    def _write_meta(self, who: str) -> None:
        row = {"key": WRITER_META_KEY, "value": who}
        with self._engine.begin() as conn:
            conn.execute(
                postgresql.insert(META)
                .values(row)
                .on_conflict_do_update(index_elements=["key"], set_={"value": who})
            )

    def _read_meta(self) -> str | None:
        with self._engine.connect() as conn:
            value: str | None = conn.execute(
                select(META.c.value).where(META.c.key == WRITER_META_KEY)
            ).scalar_one_or_none()
        return value

    # -- commits ---------------------------------------------------------------------------

    def problem(self) -> str | None:
        """Why this process may not write now (None: it may)."""
        return self._fenced or self._lost

    def check(self) -> None:
        """Raise ``Unavailable`` unless this process may write now."""
        reason = self.problem()
        if reason is not None:
            retry = None if self._fenced else RETRY_AFTER_S
            raise Unavailable(f"this portal may not write: {reason}", retry_after_s=retry)

    def fence(self, tx: RawTransaction) -> None:
        """Inside a write transaction: refuse it unless the guard connection still holds the
        lock at this moment (so a writer that lost its lock cannot commit). Checked with the
        transaction's other results, before its COMMIT."""
        tx.submit_sql(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND "
            "objid = %s AND objsubid = 2 AND granted AND pid = %s",
            (LOCK_CLASS, LOCK_OBJECT, self._backend_pid),
            self._fenced_in,
        )

    def _fenced_in(self, cursor: Any) -> None:
        if cursor.fetchone() is None:
            self._lose("the writer lock is no longer held by this process")
            self.check()

    def commit_unknown(self) -> None:
        """The connection dropped during COMMIT: whether it committed is unknown."""
        self._unknown_commit = True

    # -- the monitor -----------------------------------------------------------------------

    def _lose(self, reason: str) -> None:
        if self._lost is None:
            log.error("writer guard lost: %s; writes are refused until it is regained", reason)
        self._lost = reason

    def _fence_for_good(self, reason: str) -> None:
        self._fenced = f"{reason}; restart this portal so it rebuilds from the database"
        log.error("writer guard: %s", self._fenced)
        if self.on_fenced is not None:
            self.on_fenced(self._fenced)

    def _monitor(self) -> None:
        while not self._stop.wait(self._interval_s) and self._fenced is None:
            with self._lock:
                if self._lost is None:
                    self._ping()
                else:
                    self._regain()

    def _ping(self) -> None:
        try:
            with self._conn.cursor() as cur:
                cur.execute("SELECT 1")
                cur.fetchone()
        except Exception as err:  # any failure of the guard connection loses the lock
            first = (str(err).strip().splitlines() or ["no answer"])[0]
            self._lose(f"the database is unreachable ({first})")
            self._close_conn()

    def _regain(self) -> None:
        self._close_conn()  # the old connection, if still open, holds nothing now
        try:
            conn = self._connect()
        except Exception:
            return  # still unreachable: try again next round
        try:
            if not self._try_lock(conn):
                conn.close()
                self._fence_for_good("another writer took the database over")
                return
            # Pooled connections to the old server are dead: start the pool afresh.
            self._engine.dispose()
            last = self._read_meta()
        except Exception:
            conn.close()
            return
        if last != self._me:
            conn.close()
            self._fence_for_good(f"another writer ({last}) wrote while this one was cut off")
            return
        if self._unknown_commit:
            conn.close()
            self._fence_for_good("a commit's outcome is unknown (the connection dropped in it)")
            return
        self._conn = conn
        self._lost = None
        log.info("writer guard regained; writing again")

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a dead connection may fail; it is gone either way
                log.debug("closing the guard connection failed", exc_info=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self._close_conn()
