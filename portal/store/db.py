"""Engines for the two supported databases: SQLite (embedded default) and PostgreSQL.

SQLite runs in WAL mode with ``synchronous=NORMAL`` (a commit is durable against a process crash;
a power loss may lose the last commits but never corrupts the file), foreign keys on and a busy
timeout, so reader threads never block the writer and a second writer waits instead of failing.
The driver's own transaction handling is switched off and transactions begin explicitly: writes
with ``BEGIN IMMEDIATE`` (take the write lock up front, so a transaction that reads before it
writes cannot fail half way with "database is locked"), reads with a plain ``BEGIN``.

PostgreSQL is reached through psycopg 3.

``raw_write`` runs a write transaction on the bare DBAPI connection with statements compiled once
by ``compile_raw``: the allocator commits once per decision, and SQLAlchemy's per-statement
machinery (execution context, cache-key lookup, parameter construction, events) cost several times
what SQLite itself spends on a typical decision. Statements, parameter conversion (the column
types' own bind processors) and error classes stay SQLAlchemy's, so nothing but the cost changes.
"""

from __future__ import annotations

import operator
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

from sqlalchemy import DateTime, Dialect, Engine, TypeDecorator, create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    InterfaceError,
    OperationalError,
    StatementError,
)
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection, StaticPool
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeEngine

from policies.errors import InvalidRequest, Unavailable

SQLITE_BUSY_TIMEOUT_MS = 30_000

POSTGRES_CONNECT_TIMEOUT_S = 5
RETRY_AFTER_S = 5
"""What a client is told to wait (``Retry-After``) while the database is unreachable."""

SQLITE_SCHEMES = ("sqlite", "sqlite+pysqlite")
POSTGRES_SCHEMES = ("postgresql+psycopg", "postgresql")
VALID_SCHEMES = SQLITE_SCHEMES + POSTGRES_SCHEMES

# Execution option a caller sets on a Connection to make its next transaction a write.
WRITE_OPTION = "gpuportal_write"

# A parameter in the driver's named style (psycopg's): ``%(name)s``.
_NAMED = re.compile(r"%\((\w+)\)s")
MAX_ROW_PARAMETERS = 30_000
"""Most parameters in one many-row ``INSERT`` (the protocol allows 65,535)."""

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
        # A server that does not answer fails a request in seconds (503) instead of hanging it.
        connect_args = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}
        return create_engine(
            parsed, echo=echo, pool_size=5, max_overflow=5, connect_args=connect_args
        )
    raise InvalidRequest("database URL scheme", repr(scheme), _URL_HELP)


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def database_unreachable(err: DBAPIError) -> bool:
    """The error says the database cannot be reached (refused, dropped, shutting down), not
    that it rejected what was asked: retrying later may succeed."""
    if err.connection_invalidated or isinstance(err, InterfaceError):
        return True
    if not isinstance(err, OperationalError):
        return False
    # SQLite's OperationalError also means "no such table" or a syntax error: only a
    # lock timeout or an unreadable file is an outage there.
    text = str(err.orig).lower()
    if "sqlite" in type(err.orig).__module__:
        return "locked" in text or "unable to open" in text or "disk i/o" in text
    return True


def database_unavailable(err: DBAPIError) -> Unavailable:
    """The ``Unavailable`` a request answers while the database is unreachable."""
    first = (str(err.orig).strip().splitlines() or ["no answer"])[0]
    return Unavailable(
        f"the database is unreachable ({first}); nothing was changed, retry later",
        retry_after_s=RETRY_AFTER_S,
    )


def _sqlite_engine(url: str, *, in_memory: bool, echo: bool) -> Engine:
    connect_args: dict[str, Any] = {
        "check_same_thread": False,
        "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
    }
    if in_memory:
        # One shared connection, or every thread would see its own empty database.
        engine = create_engine(url, echo=echo, connect_args=connect_args, poolclass=StaticPool)
    else:
        # Every transaction ends in an explicit commit or rollback, so the pool need not roll
        # back again on each return (a measurable cost per decision on SQLite).
        engine = create_engine(url, echo=echo, connect_args=connect_args, pool_reset_on_return=None)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, record: ConnectionPoolEntry) -> None:
        # Autocommit at the driver level; transactions are begun in _on_begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if not in_memory:
                cursor.execute("PRAGMA journal_mode=WAL")
                # Checkpoints (copying the WAL into the database, with an fsync) would otherwise
                # run inside whichever commit crosses the threshold, adding ~10 ms to 1 in ~100
                # decisions; the store's checkpointer thread runs them off the hot path.
                cursor.execute("PRAGMA wal_autocheckpoint=0")
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


# -- write transactions on the DBAPI connection ------------------------------------------------

Params = Sequence[Any] | dict[str, Any]


class RawStatement:
    """A Core statement compiled once for one dialect, with its parameters' bind processors.

    ``bind`` turns a row (a mapping with a value for every name in ``names``) into what the
    DBAPI expects: a sequence in the statement's order for positional paramstyles, else a dict.
    """

    def __init__(
        self,
        sql: str,
        names: Sequence[str],
        sql_names: Sequence[str],
        processors: Sequence[Callable[[Any], Any] | None],
        *,
        positional: bool,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self.sql = sql
        self._defaults = dict(defaults or {})  # values fixed in the statement (LIMIT 6)
        self.names = tuple(names)  # row names, in the order ``bind_values`` takes them
        self.positional = positional
        self._sql_names = tuple(sql_names)
        self._converted = tuple((i, p) for i, p in enumerate(processors) if p is not None)
        # Positional with no conversions: rows go to the driver as they are.
        self.plain = positional and not self._converted
        self._values: Callable[[Mapping[str, Any]], Sequence[Any]] = (
            operator.itemgetter(*self.names)
            if len(self.names) > 1
            else lambda row: tuple(row[k] for k in self.names)
        )
        self._many: dict[int, tuple[str, tuple[str, ...]] | None] = {}

    def bind(self, row: Mapping[str, Any]) -> Params:
        if self._defaults:
            row = {**self._defaults, **row}
        return self.bind_values(self._values(row))

    def many_rows(self, n: int) -> tuple[str, tuple[str, ...]] | None:
        """This ``INSERT`` written for ``n`` rows in one ``VALUES`` list, with the parameter
        names each row takes in order (positional ``%s``); None where the statement is not
        a one-row ``INSERT ... VALUES`` in the named style."""
        found = self._many.get(n)
        if found is not None or n in self._many:
            return found
        span = None if self.positional else _values_row(self.sql)
        if span is None:
            self._many[n] = None
            return None
        start, end = span
        row = self.sql[start:end]
        names = tuple(_NAMED.findall(row))
        one = _NAMED.sub("%s", row)  # casts the dialect wrote (``::VARCHAR``) stay
        sql = self.sql[:start] + ", ".join([one] * n) + self.sql[end:]
        self._many[n] = (sql, names)
        return sql, names

    def bind_values(self, values: Sequence[Any]) -> Params:
        """Like ``bind`` for a row given as values in the order of ``names``."""
        if self._converted:
            converted = list(values)
            try:
                for i, process in self._converted:
                    converted[i] = process(converted[i])
            except Exception as err:
                # What Connection.execute raises when a parameter cannot be converted.
                raise StatementError(
                    f"({type(err).__module__}.{type(err).__name__}) {err}",
                    self.sql,
                    dict(zip(self.names, values, strict=True)),
                    err,
                ) from err
            values = converted
        if self.positional:
            return values
        return dict(zip(self._sql_names, values, strict=True))


def _values_row(sql: str) -> tuple[int, int] | None:
    """Where the one row of ``INSERT ... VALUES (...)`` is in ``sql`` (its parentheses
    included), or None for another statement."""
    if not sql.startswith("INSERT INTO "):
        return None
    start = sql.find(" VALUES (")
    if start < 0:
        return None
    start += len(" VALUES ")
    masked = _NAMED.sub(lambda m: "_" * len(m.group(0)), sql)  # a name's ")" is not the end
    depth = 0
    for i in range(start, len(masked)):
        if masked[i] == "(":
            depth += 1
        elif masked[i] == ")":
            depth -= 1
            if depth == 0:
                return start, i + 1
    return None


def compile_raw(
    stmt: ClauseElement, dialect: Dialect, column_keys: Iterable[str] | None = None
) -> RawStatement:
    """Compile ``stmt`` for ``dialect``; ``column_keys`` are the columns an INSERT/UPDATE sets.

    Parameters are taken from the row at execution, or else from the statement (``limit(6)``);
    expanding (post-compile) parameters such as ``in_([...])`` of plain values are refused.
    """
    compiled = cast(
        SQLCompiler,
        stmt.compile(
            dialect=dialect, column_keys=None if column_keys is None else list(column_keys)
        ),
    )
    binds = compiled.binds
    if compiled.positional:
        assert compiled.positiontup is not None  # set for positional paramstyles
        names = list(compiled.positiontup)
    else:
        names = list(binds)
    processors: list[Callable[[Any], Any] | None] = []
    defaults: dict[str, Any] = {}
    for name in names:
        bind = binds[name]
        if bind.expanding or bind.literal_execute:
            raise ValueError(f"bind parameter {name!r} of {compiled.string!r} is post-compiled")
        if not bind.required:
            defaults[name] = bind.effective_value
        processor: Callable[[Any], Any] | None
        processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if processor is not None and _is_datetime(bind.type):
            processor = _remember_last(processor)
        processors.append(processor)
    escaped = compiled.escaped_bind_names
    return RawStatement(
        compiled.string,
        names,
        [escaped.get(n, n) for n in names],
        processors,
        positional=bool(compiled.positional),
        defaults=defaults,
    )


def _is_datetime(type_: TypeEngine[Any]) -> bool:
    if isinstance(type_, TypeDecorator):
        type_ = type_.impl_instance
    return isinstance(type_, DateTime)


def _remember_last(processor: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``processor``, skipped when called again with the very same (immutable) value.

    One decision stamps most of its rows with the same datetime object, and converting a
    datetime costs more than binding the rest of a row.
    """
    last: list[tuple[Any, Any]] = [(object(), None)]  # one (input, output) pair, swapped whole

    def process(value: Any) -> Any:
        seen, result = last[0]
        if value is seen:
            return result
        result = processor(value)
        last[0] = (value, result)
        return result

    return process


class RawTransaction:
    """One transaction on a pooled DBAPI connection; see ``raw_write``.

    DBAPI errors are raised as SQLAlchemy's ``DBAPIError`` subclasses (``IntegrityError``, ...)
    with the driver's exception in ``.orig``, as ``Connection.execute`` would raise them.
    """

    def __init__(self, engine: Engine, connection: PoolProxiedConnection) -> None:
        self._dialect = engine.dialect
        self._dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        self._connection = connection
        self.cursor: Any = connection.cursor()
        self._pipeline: Any = None  # psycopg's pipeline while the transaction is pipelined
        self._checks: list[tuple[Any, Callable[[Any], None]]] = []
        self._last_sql = ""

    @property
    def pipelined(self) -> bool:
        """Whether statements are queued in a PostgreSQL pipeline (see ``raw_write``)."""
        return self._pipeline is not None

    def execute(self, stmt: RawStatement, row: Mapping[str, Any]) -> Any:
        """Run ``stmt`` with one row; returns the cursor (``rowcount``, ``fetchall``). In a
        pipeline this waits for every result so far (a round trip): use ``submit`` where the
        result can wait."""
        params = stmt.bind(row)
        self._run(self.cursor, stmt.sql, params)
        if self._pipeline is not None:
            self._sync()
        return self.cursor

    def submit(
        self, stmt: RawStatement, row: Mapping[str, Any], check: Callable[[Any], None]
    ) -> None:
        """Run ``stmt`` with one row and call ``check(cursor)`` with its result: at once, or in
        a pipeline once every result is in, before COMMIT (``check`` raises to roll back)."""
        self.submit_sql(stmt.sql, stmt.bind(row), check)

    def submit_sql(self, sql: str, params: Params, check: Callable[[Any], None]) -> None:
        """``submit`` for a statement written in the driver's own SQL."""
        if self._pipeline is None:
            self._run(self.cursor, sql, params)
            check(self.cursor)
            return
        cursor = self._connection.cursor()  # its own: the result stays there until checked
        self._run(cursor, sql, params)
        self._checks.append((cursor, check))

    def _run(self, cursor: Any, sql: str, params: Params) -> None:
        self._last_sql = sql
        try:
            cursor.execute(sql, params)
        except self._dbapi_error as err:
            raise self._wrap(err, sql, params, many=False) from err

    def _sync(self) -> None:
        try:
            self._pipeline.sync()
        except self._dbapi_error as err:
            raise self._wrap(err, self._last_sql, (), many=False) from err

    @contextmanager
    def _pipelined(self) -> Iterator[None]:
        """Queue every statement in a pipeline; leaving it waits for all their results (one
        round trip) and raises the first error, then the deferred checks run in order."""
        driver: Any = self._connection.driver_connection
        try:
            with driver.pipeline() as pipeline:
                self._pipeline = pipeline
                try:
                    yield
                finally:
                    self._pipeline = None
        except self._dbapi_error as err:
            # A statement failed: the server skipped the rest and the transaction is aborted.
            raise self._wrap(err, self._last_sql, (), many=False) from err
        checks, self._checks = self._checks, []
        for cursor, check in checks:
            check(cursor)

    def executemany(self, stmt: RawStatement, rows: Iterable[Mapping[str, Any]]) -> None:
        """Run ``stmt`` once per row, in one driver call."""
        params = [stmt.bind(row) for row in rows]
        self._last_sql = stmt.sql
        try:
            self.cursor.executemany(stmt.sql, params)
        except self._dbapi_error as err:
            raise self._wrap(err, stmt.sql, params, many=True) from err

    def insert_rows(self, stmt: RawStatement, rows: Sequence[Mapping[str, Any]]) -> None:
        """``executemany`` of an ``INSERT``; in a pipeline, as one statement of many rows
        (or a few, for thousands): each pipelined statement is a message the server reads
        and executes and a result our side processes, so this sends fewer of them for the
        same rows. ``stmt`` must not touch a row twice (an ``ON CONFLICT DO UPDATE`` may not
        update one row twice in one statement)."""
        if self._pipeline is None or len(rows) < 2 or stmt.many_rows(2) is None:
            self.executemany(stmt, rows)
            return
        width = max(1, len(stmt.names))
        step = max(1, MAX_ROW_PARAMETERS // width)
        for start in range(0, len(rows), step):
            chunk = rows[start : start + step]
            many = stmt.many_rows(len(chunk))
            assert many is not None  # one-row statements were sent above
            sql, names = many
            params: list[Any] = []
            for row in chunk:
                bound = stmt.bind(row)
                assert isinstance(bound, dict)  # the named style, as many_rows requires
                params.extend(bound[k] for k in names)
            self.submit_sql(sql, params, _nothing_to_check)

    def executemany_values(self, stmt: RawStatement, rows: Sequence[Sequence[Any]]) -> None:
        """``executemany`` with rows given as values in the order of ``stmt.names``."""
        params = rows if stmt.plain else [stmt.bind_values(row) for row in rows]
        self._last_sql = stmt.sql
        try:
            self.cursor.executemany(stmt.sql, params)
        except self._dbapi_error as err:
            raise self._wrap(err, stmt.sql, params, many=True) from err

    def _begin(self, sql: str | None) -> None:
        if sql is None:
            return  # the driver opens the transaction with the first statement
        try:
            self.cursor.execute(sql)
        except self._dbapi_error as err:
            raise self._wrap(err, sql, (), many=False) from err

    def _commit(self) -> None:
        try:
            self._connection.commit()
        except self._dbapi_error as err:
            raise self._wrap(err, "COMMIT", (), many=False) from err

    def _wrap(self, err: Exception, sql: str, params: Any, *, many: bool) -> BaseException:
        # As Connection does: a lost connection is dropped from the pool, not handed out again.
        lost = self._dialect.is_disconnect(
            cast(Any, err), self._connection.dbapi_connection, self.cursor
        )
        if lost:
            self._connection.invalidate(err)
        wrapped = DBAPIError.instance(
            sql,
            params,
            err,
            self._dbapi_error,
            connection_invalidated=lost,
            dialect=self._dialect,
            ismulti=many,
        )
        assert isinstance(wrapped, BaseException)  # a DBAPI error is never a DontWrapMixin
        return wrapped


def _nothing_to_check(cursor: Any) -> None:
    """A statement whose only possible failure is a database error (raised by itself)."""


@contextmanager
def raw_write(engine: Engine, *, pipeline: bool = False) -> Iterator[RawTransaction]:
    """A write transaction on a pooled DBAPI connection: committed when the block ends, rolled
    back when it raises. On SQLite it begins with ``BEGIN IMMEDIATE``, like ``WRITE_OPTION``.

    ``pipeline`` (PostgreSQL; ignored on SQLite): the block's statements are sent without
    waiting for each answer (psycopg's pipeline mode), results and errors come back together
    when the block ends, then the ``submit`` checks run and COMMIT follows: two round trips
    for the whole transaction instead of one per statement. A failed statement makes the
    server skip the rest, so the transaction still changes all or nothing."""
    connection = engine.raw_connection()
    try:
        tx = RawTransaction(engine, connection)
        tx._begin("BEGIN IMMEDIATE" if is_sqlite(engine) else None)
        try:
            if pipeline and not is_sqlite(engine):
                with tx._pipelined():
                    yield tx
            else:
                yield tx
        except BaseException:
            if connection.is_valid:
                connection.rollback()
            raise
        tx._commit()
    finally:
        connection.close()  # back to the pool, which rolls back whatever is left open
