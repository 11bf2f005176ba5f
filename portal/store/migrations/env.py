"""Alembic environment for the portal's store.

Run programmatically by ``portal.store.migrate``, which passes an open connection in
``config.attributes["connection"]``; no ``alembic.ini`` is needed. For ``alembic revision
--autogenerate`` during development, pass ``-x url=sqlite:///scratch.db``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from portal.store.db import make_engine
from portal.store.models import metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise RuntimeError("pass the database with -x url=<database URL>")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
