"""Backups of the portal's database, and restoring one (``gpuportal backup`` / ``restore``).

- **SQLite**: the online backup API copies the database page by page while the portal keeps
  writing (a reader of a WAL database blocks nobody), as one consistent snapshot; restoring
  copies it back the same way, in one write transaction of the target: all or nothing.
- **PostgreSQL**: ``pg_dump`` in its custom format (one consistent snapshot of a repeatable-read
  transaction; the portal keeps running). Restoring drops the portal's tables and replays the
  archive (``pg_restore`` into ``psql``) in one transaction: a failure rolls all of it back,
  and what is restored is exactly the backup, whatever schema the target had.

A restore is refused while a portal writes to the target (its writer guard is held: its
memory would disagree with the restored tables), for a backup of a schema this portal does not
know (a newer portal wrote it: a downgrade), and over a database that holds workloads unless
``replace`` is given. A backup of an older schema is migrated to this portal's schema after the
restore. Passwords go to the client tools through ``PGPASSWORD``, never on a command line.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, func, inspect, select
from sqlalchemy.engine import URL, make_url

from policies.errors import Conflict, InvalidRequest, Unavailable
from portal.store import migrate
from portal.store.db import POSTGRES_SCHEMES, SQLITE_SCHEMES, make_engine
from portal.store.guard import make_guard
from portal.store.models import metadata

PG_TIMEOUT_S = 3600.0
"""The longest a dump or restore may take before it is abandoned."""

_VERSION_TABLE = "alembic_version"


@dataclass(frozen=True, slots=True)
class Restored:
    """What a restore did: the backup's schema revision and whether it was migrated after."""

    revision: str
    migrated: bool


def _kind(url: str) -> str:
    scheme = url.split("://", 1)[0]
    if scheme in SQLITE_SCHEMES:
        return "sqlite"
    if scheme in POSTGRES_SCHEMES:
        return "postgresql"
    raise InvalidRequest(
        "database url", scheme, f"one of {', '.join(SQLITE_SCHEMES + POSTGRES_SCHEMES)}"
    )


def _sqlite_path(url: str) -> Path:
    path = make_url(url).database
    if path in (None, "", ":memory:"):
        raise InvalidRequest("database url", url, "a SQLite database file (not in memory)")
    return Path(path)


def backup(url: str, to: Path, *, pg_bin_dir: Path | None = None) -> None:
    """Write a consistent copy of the database at ``url`` to ``to`` (a new file)."""
    if to.exists():
        raise Conflict(f"{to} exists: a backup is never written over another file")
    to.parent.mkdir(parents=True, exist_ok=True)
    if _kind(url) == "sqlite":
        source = _sqlite_path(url)
        if not source.is_file():
            raise InvalidRequest("database url", url, "an existing SQLite database file")
        partial = to.with_name(to.name + ".partial")
        try:
            with _sqlite(source) as src, _sqlite(partial) as dst:
                src.backup(dst)
            partial.replace(to)
        finally:
            partial.unlink(missing_ok=True)
        return
    pg = make_url(url)
    _run(
        _tool("pg_dump", pg_bin_dir),
        ["--format=custom", "--no-owner", f"--file={to}", f"--dbname={_libpq(pg)}"],
        pg,
    )


def restore(
    url: str, source: Path, *, replace: bool = False, pg_bin_dir: Path | None = None
) -> Restored:
    """Make the database at ``url`` what the backup ``source`` holds, then migrate it to this
    portal's schema. Refused (nothing changed) while a portal writes to it, for a backup of an
    unknown (newer) schema, and over a database with workloads unless ``replace``."""
    if not source.is_file():
        raise InvalidRequest("backup", str(source), "an existing backup file")
    kind = _kind(url)
    revision = _sqlite_revision(source) if kind == "sqlite" else _dump_revision(source, pg_bin_dir)
    known = migrate.known_revisions()
    if revision not in known:
        raise Conflict(
            f"the backup is at schema revision {revision!r}, which this portal does not know "
            f"(it knows up to {migrate.head()!r}); restore it with a portal at least as new as "
            "the one that wrote it"
        )
    engine = make_engine(url)
    guard = make_guard(engine)
    try:
        guard.acquire()  # refused while a portal writes here: WriterTaken names it
        try:
            if not replace and _holds_workloads(engine):
                raise Conflict(
                    "the database holds workloads: restoring would replace them; pass "
                    "--replace to do so"
                )
            engine.dispose()  # no connection of ours may hold the tables a restore replaces
            if kind == "sqlite":
                with _sqlite(source) as src, _sqlite(_sqlite_path(url)) as dst:
                    src.backup(dst)
            else:
                _restore_postgres(make_url(url), source, pg_bin_dir)
            migrated = revision != migrate.head()
            if migrated:
                migrate.upgrade(engine)
        finally:
            guard.close()
    finally:
        engine.dispose()
    return Restored(revision, migrated)


def _holds_workloads(engine: Engine) -> bool:
    if "workloads" not in inspect(engine).get_table_names():
        return False
    table = metadata.tables["workloads"]
    with engine.connect() as conn:
        return bool(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _sqlite(path: Path) -> closing[sqlite3.Connection]:
    """A plain sqlite3 connection, closed on exit (the backup API wants the driver's own)."""
    return closing(sqlite3.connect(path, timeout=30.0))


def _sqlite_revision(path: Path) -> str:
    try:
        with _sqlite(path) as conn:
            row = conn.execute(f"SELECT version_num FROM {_VERSION_TABLE}").fetchone()
    except sqlite3.DatabaseError as err:
        raise InvalidRequest("backup", str(path), f"a SQLite backup of the portal ({err})") from err
    if row is None:
        raise InvalidRequest("backup", str(path), "a backup with a schema revision")
    return str(row[0])


def _dump_revision(path: Path, pg_bin_dir: Path | None) -> str:
    """The schema revision inside a ``pg_dump`` archive, read without a database: the data of
    its version table as ``pg_restore`` prints it."""
    done = subprocess.run(
        [
            _tool("pg_restore", pg_bin_dir),
            "--data-only",
            f"--table={_VERSION_TABLE}",
            "--file=-",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=PG_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise InvalidRequest("backup", str(path), f"a pg_dump archive ({done.stderr.strip()})")
    copied = re.search(
        r"^COPY [^\n]*alembic_version[^\n]*FROM stdin;\n([^\n]+)\n", done.stdout, re.M
    )
    if copied is None:
        raise InvalidRequest("backup", str(path), "a backup with a schema revision")
    return copied.group(1).strip()


def _tool(name: str, bin_dir: Path | None) -> str:
    found = str(bin_dir / name) if bin_dir is not None else shutil.which(name)
    if found is None or not Path(found).is_file():
        where = bin_dir if bin_dir is not None else "PATH"
        raise Unavailable(
            f"{name} is not installed (looked in {where}); install the PostgreSQL client"
        )
    return found


def _restore_postgres(url: URL, source: Path, pg_bin_dir: Path | None) -> None:
    """Drop the portal's tables and replay the archive, in one transaction of ``psql``."""
    tables = [*metadata.tables, _VERSION_TABLE]
    drop = "".join(f'DROP TABLE IF EXISTS "{t}" CASCADE; ' for t in tables)
    env = _env(url)
    script = subprocess.Popen(
        [_tool("pg_restore", pg_bin_dir), "--no-owner", "--no-privileges", "--file=-", str(source)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert script.stdout is not None
    try:
        replay = subprocess.run(
            [
                _tool("psql", pg_bin_dir),
                "--no-psqlrc",
                "--quiet",
                "--set=ON_ERROR_STOP=1",
                "--single-transaction",
                f"--command={drop}",
                "--file=-",
                f"--dbname={_libpq(url)}",
            ],
            stdin=script.stdout,
            capture_output=True,
            text=True,
            env=env,
            timeout=PG_TIMEOUT_S,
            check=False,
        )
    finally:
        script.stdout.close()
        _, err = script.communicate(timeout=PG_TIMEOUT_S)
    if script.returncode != 0:
        raise Unavailable(f"pg_restore failed: {err.decode(errors='replace').strip()}")
    if replay.returncode != 0:
        raise Unavailable(f"restore failed, nothing changed: {replay.stderr.strip()}")


def _env(url: URL) -> dict[str, str]:
    env = dict(os.environ)
    if url.password is not None:
        env["PGPASSWORD"] = str(url.password)
    return env


def _libpq(url: URL) -> str:
    """The URL as libpq reads it: no driver suffix, no password (given by the environment)."""
    return url.set(drivername="postgresql", password=None).render_as_string(hide_password=False)


def _run(tool: str, args: list[str], url: URL) -> None:
    done = subprocess.run(
        [tool, *args],
        capture_output=True,
        text=True,
        env=_env(url),
        timeout=PG_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise Unavailable(f"{Path(tool).name} failed: {done.stderr.strip() or done.returncode}")
