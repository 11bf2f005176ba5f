"""Engines: supported URLs only, and SQLite configured for one writer and many readers."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from policies.errors import InvalidRequest
from portal.store.db import SQLITE_BUSY_TIMEOUT_MS, make_engine


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("mysql://u@h/db", "'mysql'"),
        ("postgresql+psycopg2://u@h/db", "'postgresql+psycopg2'"),
        ("not a url", "'not a url'"),
    ],
)
def test_unsupported_urls_name_the_scheme_and_the_valid_ones(url: str, named: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        make_engine(url)
    assert named in err.value.message
    for valid in ("sqlite", "postgresql+psycopg", "postgresql"):
        assert valid in err.value.valid


def test_plain_postgresql_means_psycopg() -> None:
    engine = make_engine("postgresql://u@127.0.0.1:1/db")
    assert engine.dialect.driver == "psycopg"
    engine.dispose()


def test_sqlite_runs_in_wal_with_foreign_keys_and_a_busy_timeout(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/x.db")
    try:
        with engine.connect() as conn:
            pragmas = {
                name: conn.execute(text(f"PRAGMA {name}")).scalar()
                for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            }
        assert pragmas == {
            "journal_mode": "wal",
            "synchronous": 1,  # NORMAL
            "foreign_keys": 1,
            "busy_timeout": SQLITE_BUSY_TIMEOUT_MS,
        }
    finally:
        engine.dispose()


def test_the_engine_reaches_the_database(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()
