"""Run the store's Alembic migrations from code; no ``alembic.ini`` is needed at runtime."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Engine

from policies.errors import Conflict
from portal.store.db import WRITE_OPTION, make_engine
from portal.store.guard import LOCK_CLASS

MIGRATIONS = Path(__file__).parent / "migrations"


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head() -> str:
    """The newest revision this version of the portal knows."""
    revision = ScriptDirectory.from_config(_config()).get_current_head()
    if revision is None:
        raise RuntimeError("the store ships no migrations")
    return revision


def known_revisions() -> frozenset[str]:
    """Every schema revision this version of the portal can migrate from."""
    return frozenset(s.revision for s in ScriptDirectory.from_config(_config()).walk_revisions())


def current(engine: Engine) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


# pg_advisory_xact_lock(int4, int4) taken by every migration on PostgreSQL, so two portals (or
# a pre-upgrade Job and a portal) starting together migrate one after the other; the writer
# guard's lock is another key: a migration never waits for the running writer.
MIGRATION_LOCK = (LOCK_CLASS, 2)


def refuse_unknown(at: str | None) -> None:
    """Raise ``Conflict`` when the database is at a revision this portal does not know."""
    if at is not None and at not in known_revisions():
        raise Conflict(
            f"the database is at schema revision {at!r}, which this portal does not know "
            f"(it knows up to {head()!r}): a newer portal migrated it, and a downgrade across "
            "a migration is refused; run a portal at least as new as that one, or restore a "
            "backup taken before the upgrade"
        )


def upgrade(target: str | Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate the database at ``target`` (a URL or an engine) to ``revision``; returns the
    revision it was at (None: empty) and the one it is at now.

    Raises:
        Conflict: the database is at a revision this version of the portal does not know
            (a newer portal migrated it).
    """
    engine = make_engine(target) if isinstance(target, str) else target
    try:
        refuse_unknown(current(engine))
        config = _config()
        with engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
            if engine.dialect.name == "postgresql":
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%s, %s)", MIGRATION_LOCK)
            # Read again under the lock: another migrator may have gone first.
            at = MigrationContext.configure(conn).get_current_revision()
            refuse_unknown(at)
            config.attributes["connection"] = conn
            try:
                command.upgrade(config, revision)
            except CommandError as err:
                raise Conflict(f"cannot migrate the database to {revision!r}: {err}") from err
            now = MigrationContext.configure(conn).get_current_revision()
            conn.commit()
        return at, now
    finally:
        if isinstance(target, str):
            engine.dispose()
