"""``gpuportal backup`` / ``restore`` on SQLite and PostgreSQL: a restored database holds every
row of the one backed up and an allocator rebuilt on it has the same state; a restore is
all-or-nothing and refused while a portal writes, for a newer schema, and over workloads unless
told to replace them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, select, text

from policies.errors import Conflict, InvalidRequest
from portal import cli
from portal.allocator import Allocator
from portal.store import migrate
from portal.store.backup import backup, restore
from portal.store.db import make_engine
from portal.store.guard import WriterTaken
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, wl
from tests.support.postgres import PostgresServer


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def second_url(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """Another empty database of the same kind as ``db_url``."""
    if db_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'restored.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = server.create_database("restored")
    try:
        yield server.url(name)
    finally:
        server.drop_database(name)


@pytest.fixture
def bin_dir(db_url: str, request: pytest.FixtureRequest) -> Path | None:
    """The test server's client tools (pg_dump, pg_restore, psql) for PostgreSQL."""
    if db_url.startswith("sqlite"):
        return None
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.bindir


def rows(url: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table the database has (as it is, whatever its schema), in
    primary-key order."""
    engine = make_engine(url)
    try:
        found = MetaData()
        found.reflect(engine)
        with engine.connect() as conn:
            out = {}
            for table in found.sorted_tables:
                order = list(table.primary_key.columns) or list(table.columns)
                out[table.name] = [
                    dict(r) for r in conn.execute(select(table).order_by(*order)).mappings()
                ]
            return out
    finally:
        engine.dispose()


def populate(url: str, clock: ManualClock) -> dict[str, object]:
    """Tenants, quotas, running, queued and ended workloads and their events; returns the
    allocator's state snapshot."""
    store = Store(url)
    try:
        a = Allocator(store, clock=clock)
        a.start([hgx("n1"), hgx("n2", rack="r2")])
        for t in ("team-a", "team-b"):
            a.set_tenant(t, cohort="c")
            a.set_quota(t, "H100-80GB", guaranteed=8, limit=12)
        done = a.request(wl("team-a", gpus(2), name="done"), expected_duration_s=60)
        clock.advance(seconds=90)
        a.release(done.id)
        a.request(wl("team-a", gpus(8), name="big", gang=1))
        a.request(wl("team-b", gpus(4), name="mid"), expected_duration_s=600)
        a.request(wl("team-b", gpus(8), name="waits"))
        return a.snapshot()
    finally:
        store.close()


def test_a_restored_backup_holds_every_row_and_the_same_state(
    db_url: str, second_url: str, bin_dir: Path | None, tmp_path: Path, clock: ManualClock
) -> None:
    before = populate(db_url, clock)
    file = tmp_path / "portal.backup"
    backup(db_url, file, pg_bin_dir=bin_dir)
    done = restore(second_url, file, pg_bin_dir=bin_dir)
    assert (done.revision, done.migrated) == (migrate.head(), False)
    original, restored = rows(db_url), rows(second_url)
    assert original["workloads"] and original["allocations"] and original["events"]
    assert restored == original

    store = Store(second_url)
    try:
        rebuilt = Allocator(store, clock=clock)
        rebuilt.start([hgx("n1"), hgx("n2", rack="r2")])
        assert rebuilt.snapshot() == before
    finally:
        store.close()
    with pytest.raises(Conflict, match="exists"):
        backup(db_url, file, pg_bin_dir=bin_dir)  # never over another file


def test_a_restore_over_workloads_needs_replace_and_is_then_exact(
    db_url: str, second_url: str, bin_dir: Path | None, tmp_path: Path, clock: ManualClock
) -> None:
    populate(second_url, clock)  # the backup: one history
    file = tmp_path / "portal.backup"
    backup(second_url, file, pg_bin_dir=bin_dir)
    wanted = rows(second_url)
    populate(db_url, clock)  # the target: another history, later
    kept = rows(db_url)
    with pytest.raises(Conflict, match="--replace"):
        restore(db_url, file, pg_bin_dir=bin_dir)
    assert rows(db_url) == kept  # refused: nothing changed
    restore(db_url, file, replace=True, pg_bin_dir=bin_dir)
    assert rows(db_url) == wanted


def test_a_restore_is_refused_while_a_portal_writes(
    db_url: str, second_url: str, bin_dir: Path | None, tmp_path: Path, clock: ManualClock
) -> None:
    populate(db_url, clock)
    file = tmp_path / "portal.backup"
    backup(db_url, file, pg_bin_dir=bin_dir)
    serving = Store(second_url, writer_guard=True)  # what `gpuportal serve` holds
    try:
        with pytest.raises(WriterTaken, match="stop it first"):
            restore(second_url, file, replace=True, pg_bin_dir=bin_dir)
    finally:
        serving.close()
    assert rows(second_url)["workloads"] == []


def test_a_backup_of_a_newer_schema_is_refused_and_an_older_one_migrated(
    db_url: str, second_url: str, bin_dir: Path | None, tmp_path: Path
) -> None:
    older = sorted(migrate.known_revisions() - {migrate.head()})[0]
    migrate.upgrade(db_url, older)
    file = tmp_path / "older.backup"
    backup(db_url, file, pg_bin_dir=bin_dir)
    done = restore(second_url, file, pg_bin_dir=bin_dir)
    assert (done.revision, done.migrated) == (older, True)
    engine = make_engine(second_url)
    try:
        assert migrate.current(engine) == migrate.head()
        with engine.begin() as conn:  # as a newer portal would leave it
            conn.execute(text("UPDATE alembic_version SET version_num = 'from_the_future'"))
    finally:
        engine.dispose()
    newer = tmp_path / "newer.backup"
    backup(second_url, newer, pg_bin_dir=bin_dir)
    target = rows(db_url)
    with pytest.raises(Conflict, match="'from_the_future', which this portal does not know"):
        restore(db_url, newer, replace=True, pg_bin_dir=bin_dir)
    assert rows(db_url) == target


def test_a_sqlite_backup_taken_while_the_portal_writes_is_consistent(
    tmp_path: Path, clock: ManualClock
) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    store = Store(url)
    stop = threading.Event()
    a = Allocator(store)
    a.start([hgx("n1")])
    a.set_tenant("team-a")
    a.set_quota("team-a", "H100-80GB", guaranteed=8, limit=8)

    def churn() -> None:
        while not stop.is_set():
            w = a.request(wl("team-a", gpus(1), name="churn"))
            a.release(w.id)

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        files = [tmp_path / f"b{i}.backup" for i in range(3)]
        for f in files:
            backup(url, f)
    finally:
        stop.set()
        writer.join()
        store.close()
    for i, f in enumerate(files):
        copy = f"sqlite:///{tmp_path / f'copy{i}.db'}"
        restore(copy, f)
        got = rows(copy)
        # Every allocation of the snapshot belongs to a workload of it, and none is held by
        # a workload that ended: one consistent moment, not two halves.
        ids = {w["id"]: w for w in got["workloads"]}
        assert got["workloads"]
        for alloc in got["allocations"]:
            w = ids[alloc["workload_id"]]
            assert (alloc["released_at"] is None) == (w["state"] == "running")


def test_the_commands_back_up_and_restore(
    tmp_path: Path, clock: ManualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'portal.db'}"
    populate(url, clock)
    file = tmp_path / "nightly.backup"
    assert cli.run(["backup", str(file), "--database-url", url]) == 0
    target = f"sqlite:///{tmp_path / 'new.db'}"
    assert cli.run(["restore", str(file), "--database-url", target]) == 0
    assert rows(target) == rows(url)
    assert "restored" in capsys.readouterr().out
    assert cli.run(["restore", str(file), "--database-url", target]) == 2  # holds workloads
    assert "--replace" in capsys.readouterr().err
    missing: Callable[[], object] = lambda: restore(target, tmp_path / "nope")  # noqa: E731
    with pytest.raises(InvalidRequest, match="an existing backup file"):
        missing()
