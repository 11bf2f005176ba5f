"""Engines for the two supported databases: SQLite (embedded default) and PostgreSQL.

SQLite runs in WAL mode with ``synchronous=NORMAL`` (a commit is durable against a process crash;
a power loss may lose the last commits but never corrupts the file), foreign keys on and a busy
timeout, so reader threads never block the writer and a second writer waits instead of failing.
The driver's own transaction handling is switched off and transactions begin explicitly: writes
with ``BEGIN IMMEDIATE`` (take the write lock up front, so a transaction that reads before it
writes cannot fail half way with "database is locked"), reads with a plain ``BEGIN``.

PostgreSQL is reached through psycopg 3.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

from policies.errors import InvalidRequest

SQLITE_BUSY_TIMEOUT_MS = 30_000

SQLITE_SCHEMES = ("sqlite", "sqlite+pysqlite")
POSTGRES_SCHEMES = ("postgresql+psycopg", "postgresql")
VALID_SCHEMES = SQLITE_SCHEMES + POSTGRES_SCHEMES

# Execution option a caller sets on a Connection to make its next transaction a write.
WRITE_OPTION = "gpuportal_write"

_URL_HELP = (
    "a URL with scheme "
    + ", ".join(VALID_SCHEMES)
    + " (for example sqlite:///portal.db or postgresql+psycopg://user@host/db)"
)


def make_engine(url: str, *, echo: bool = False) -> Engine:
    """Create an engine for ``url``, configured for the portal's single-writer use.

    ``postgresql://`` means psycopg 3 (the only PostgreSQL driver the portal ships with).

    Raises:
        InvalidRequest: the URL is malformed or its scheme is not one of ``VALID_SCHEMES``.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InvalidRequest("database URL", repr(url), _URL_HELP) from None
    scheme = parsed.drivername
    if scheme in SQLITE_SCHEMES:
        return _sqlite_engine(url, in_memory=parsed.database in (None, "", ":memory:"), echo=echo)
    if scheme in POSTGRES_SCHEMES:
        parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(parsed, echo=echo, pool_size=5, max_overflow=5)
    raise InvalidRequest("database URL scheme", repr(scheme), _URL_HELP)


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def _sqlite_engine(url: str, *, in_memory: bool, echo: bool) -> Engine:
    connect_args: dict[str, Any] = {
        "check_same_thread": False,
        "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
    }
    if in_memory:
        # One shared connection, or every thread would see its own empty database.
        engine = create_engine(url, echo=echo, connect_args=connect_args, poolclass=StaticPool)
    else:
        engine = create_engine(url, echo=echo, connect_args=connect_args)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, record: ConnectionPoolEntry) -> None:
        # Autocommit at the driver level; transactions are begun in _on_begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if not in_memory:
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine
