"""Upgrades: `gpuportal migrate` brings a database to this portal's schema once, before the new
portal starts (the chart's pre-upgrade Job); an upgrade across a migration keeps every
allocation and the queue; a database a newer portal migrated is refused, unchanged. On SQLite
and PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text

from portal import cli
from portal.allocator import Allocator
from portal.store import migrate
from portal.store.db import make_engine
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, wl
from tests.portal.store.test_migrations import _downgrade

REPO = Path(__file__).resolve().parents[3]


def _rows(url: str, sql: str) -> list[tuple[object, ...]]:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            return [tuple(r) for r in conn.execute(text(sql)).all()]
    finally:
        engine.dispose()


def _revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        return migrate.current(engine)
    finally:
        engine.dispose()


def _previous_revision() -> str:
    """The revision before this portal's newest: what the release before it left."""
    script = ScriptDirectory.from_config(migrate._config())
    down = script.get_revision(migrate.head()).down_revision
    assert isinstance(down, str), down
    return down


def test_migrate_brings_an_empty_database_to_the_schema_once(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.run(["migrate", "--check", "--database-url", db_url]) == 1
    assert "no schema (empty)" in capsys.readouterr().out
    assert cli.run(["migrate", "--database-url", db_url]) == 0
    assert f"to {migrate.head()}" in capsys.readouterr().out
    assert _revision(db_url) == migrate.head()
    assert cli.run(["migrate", "--database-url", db_url]) == 0
    assert "nothing to migrate" in capsys.readouterr().out
    assert cli.run(["migrate", "--check", "--database-url", db_url]) == 0


def test_a_database_a_newer_portal_migrated_is_refused_and_left_unchanged(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(db_url) as store:
        a = Allocator(store, clock=ManualClock())
        a.start([hgx("n0")])
        a.set_tenant("t0")
        a.set_quota("t0", "H100-80GB", guaranteed=4, limit=4)
        a.request(wl("t0", gpus(2)))
    _rows(db_url, "UPDATE alembic_version SET version_num = '9999_future' RETURNING 1")
    before = _rows(db_url, "SELECT id, state FROM workloads ORDER BY id")
    for argv in (["migrate"], ["migrate", "--check"]):
        assert cli.run([*argv, "--database-url", db_url]) == 2
        err = capsys.readouterr().err
        assert "'9999_future'" in err and "downgrade across a migration is refused" in err
        assert f"knows up to '{migrate.head()}'" in err
    # The portal itself refuses to start on it, the same way.
    with pytest.raises(Exception, match="downgrade across a migration is refused"):
        Store(db_url)
    assert _revision(db_url) == "9999_future"
    assert _rows(db_url, "SELECT id, state FROM workloads ORDER BY id") == before


def test_an_upgrade_across_the_newest_migration_keeps_allocations_and_the_queue(
    db_url: str,
) -> None:
    nodes = [hgx("n0"), hgx("n1", rack="r2")]
    clock = ManualClock()
    with Store(db_url) as store:
        a = Allocator(store, clock=clock)
        a.start(nodes)
        for t in ("t0", "t1"):
            a.set_tenant(t)
            a.set_quota(t, "H100-80GB", guaranteed=8, limit=12)
        running = [a.request(wl("t0", gpus(4))), a.request(wl("t1", gpus(8)))]
        gang = a.request(wl("t0", gpus(2), name="gang", gang=2))
        queued = [a.request(wl("t1", gpus(4), name=f"wait-{i}")) for i in range(2)]
        assert [s.state for s in queued] == [WorkloadState.QUEUED] * 2
        assert all(s.state is WorkloadState.RUNNING for s in [*running, gang])
        before = a.snapshot()
        positions = {s.id: s.position for s in a.workloads() if s.state is WorkloadState.QUEUED}
    # The database as the release before this one left it: its schema, the same rows.
    engine = make_engine(db_url)
    try:
        _downgrade(engine, _previous_revision())
    finally:
        engine.dispose()
    assert _revision(db_url) == _previous_revision()

    # What the chart's pre-upgrade Job runs, as a process of its own.
    done = subprocess.run(
        [sys.executable, "-m", "portal.cli", "migrate", "--database-url", db_url],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"from {_previous_revision()} to {migrate.head()}" in done.stdout
    assert _revision(db_url) == migrate.head()

    with Store(db_url) as store:
        b = Allocator(store, clock=clock)
        b.start(nodes)
        assert b.snapshot() == before
        assert {
            s.id: s.position for s in b.workloads() if s.state is WorkloadState.QUEUED
        } == positions
        # And the upgraded portal goes on from there: a release admits the queue's head.
        b.release(running[1].id)
        assert b.status(queued[0].id).state is WorkloadState.RUNNING


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_two_migrators_at_once_migrate_once(db_url: str) -> None:
    """The pre-upgrade Job and a portal starting together (or a retried Job): PostgreSQL
    serialises them on an advisory lock, so the second finds the work done."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "portal.cli", "migrate", "--database-url", db_url],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    said = [o for o, _ in outs]
    assert sum("migrated the database" in o for o in said) == 1, said
    assert sum("nothing to migrate" in o for o in said) == 2, said
    assert _rows(db_url, "SELECT version_num FROM alembic_version") == [(migrate.head(),)]
