"""The ``gpuportal backup``, ``restore`` and ``migrate`` subcommands (``portal.store``).

They work on the database itself, like ``serve``, not through the REST API: the database URL
comes from ``--database-url`` or ``GPUPORTAL_DATABASE_URL`` (the state directory's SQLite file
by default). Imports stay lazy so other subcommands start fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(commands: Any) -> None:
    """Add ``backup``, ``restore`` and ``migrate`` to the CLI's subcommands."""
    back = commands.add_parser(
        "backup",
        help="write a consistent copy of the portal's database to a file (online)",
        description=(
            "Copy the database while the portal keeps running: SQLite through its online "
            "backup API, PostgreSQL with pg_dump (custom format). The file must not exist."
        ),
    )
    back.add_argument("file", type=Path, metavar="FILE", help="the backup file to write")
    _common(back)
    back.set_defaults(handler=_backup)

    rest = commands.add_parser(
        "restore",
        help="make the portal's database what a backup holds (the portal must be stopped)",
        description=(
            "Restore a backup written by `gpuportal backup`, all or nothing, then migrate it to "
            "this portal's schema. Refused while a portal writes to the database, for a backup "
            "a newer portal wrote, and over a database with workloads unless --replace."
        ),
    )
    rest.add_argument("file", type=Path, metavar="FILE", help="the backup file to read")
    rest.add_argument(
        "--replace", action="store_true", help="replace a database that holds workloads"
    )
    _common(rest)
    rest.set_defaults(handler=_restore)

    mig = commands.add_parser(
        "migrate",
        help="migrate the portal's database to this portal's schema, once (before an upgrade)",
        description=(
            "Bring the database to the newest schema this portal knows, while the older "
            "portal may still run on it (every migration keeps the previous release working: "
            "see docs/helm.md, Upgrades). Safe to run twice or from two places at once. "
            "Refused, changing nothing, for a database a newer portal migrated. --check "
            "changes nothing and exits 1 when a migration is due."
        ),
    )
    mig.add_argument("--check", action="store_true", help="only say whether a migration is due")
    mig.add_argument(
        "--database-url", default=None, help="SQLAlchemy URL (default: GPUPORTAL_DATABASE_URL)"
    )
    mig.set_defaults(handler=_migrate)


def _common(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--database-url", default=None, help="SQLAlchemy URL (default: GPUPORTAL_DATABASE_URL)"
    )
    cmd.add_argument(
        "--pg-bin-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where pg_dump, pg_restore and psql are (default: PATH)",
    )


def _url(args: argparse.Namespace) -> str:
    from portal.settings import load_settings

    return load_settings(database_url=args.database_url).database_url


def _backup(args: argparse.Namespace) -> int:
    from portal.store.backup import backup

    backup(_url(args), args.file, pg_bin_dir=args.pg_bin_dir)
    print(f"backup written to {args.file}")
    return 0


def _restore(args: argparse.Namespace) -> int:
    from portal.store.backup import restore

    done = restore(_url(args), args.file, replace=args.replace, pg_bin_dir=args.pg_bin_dir)
    migrated = ", then migrated to this portal's schema" if done.migrated else ""
    print(f"restored {args.file} (schema revision {done.revision}){migrated}")
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from portal.store import migrate
    from portal.store.db import make_engine

    head = migrate.head()
    if args.check:
        engine = make_engine(_url(args))
        try:
            at = migrate.current(engine)
        finally:
            engine.dispose()
        migrate.refuse_unknown(at)
        if at == head:
            print(f"the database is at {head}, this portal's schema: nothing to migrate")
            return 0
        print(f"the database is at {at or 'no schema (empty)'}; this portal migrates it to {head}")
        return 1
    before, after = migrate.upgrade(_url(args))
    if before == after:
        print(f"the database is at {after}, this portal's schema: nothing to migrate")
    else:
        print(f"migrated the database from {before or 'no schema (empty)'} to {after}")
    return 0
