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


def upgrade(target: str | Engine, revision: str = "head") -> None:
    """Migrate the database at ``target`` (a URL or an engine) to ``revision``.

    Raises:
        Conflict: the database is at a revision this version of the portal does not know
            (a newer portal migrated it).
    """
    engine = make_engine(target) if isinstance(target, str) else target
    try:
        at = current(engine)
        if at is not None and at not in known_revisions():
            raise Conflict(
                f"the database is at schema revision {at!r}, which this portal does not know "
                f"(it knows up to {head()!r}); run a portal at least as new as the one that "
                "migrated it"
            )
        config = _config()
        with engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
            config.attributes["connection"] = conn
            try:
                command.upgrade(config, revision)
            except CommandError as err:
                raise Conflict(f"cannot migrate the database to {revision!r}: {err}") from err
            conn.commit()
    finally:
        if isinstance(target, str):
            engine.dispose()
