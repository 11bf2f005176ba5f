"""The writer guard of a store: one writer per database, and a writer that lost its guard
cannot commit (real SQLite files and the PostgreSQL fixture)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from policies.errors import Unavailable
from portal.store import guard
from portal.store.guard import LOCK_CLASS, LOCK_OBJECT, AdvisoryLockGuard, WriterTaken
from portal.store.records import ChangeSet
from portal.store.writer import Store
from tests.portal.store import builders as b


def tenant_change(name: str) -> ChangeSet:
    changes = ChangeSet()
    changes.tenants.append(b.tenant(name))
    return changes


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"not {what} within {timeout_s} s")


def kill_guard_connection(url: str) -> None:
    """End the guard's backend, as a server restart or a dropped connection would, and wait
    until it is gone (it holds the lock until it has exited, not only been signalled)."""
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_locks WHERE locktype = 'advisory' "
            "AND classid = %s AND objid = %s AND objsubid = 2",
            (LOCK_CLASS, LOCK_OBJECT),
        ).fetchall()
    assert killed == [(True,)]


def test_a_second_guarded_store_is_refused_and_writes_nothing(db_url: str) -> None:
    with Store(db_url, writer_guard=True) as first:
        with pytest.raises(WriterTaken, match="another gpuportal serve is the writer"):
            Store(db_url, writer_guard=True)
        first.commit(tenant_change("acme"))
    with Store(db_url, writer_guard=True) as second:  # closing the first freed the guard
        assert [t.name for t in second.load().tenants] == ["acme"]


@pytest.mark.postgres
def test_a_writer_that_lost_its_lock_cannot_commit_and_regains_it_by_itself(
    postgres_url: str,
) -> None:
    with Store(postgres_url, writer_guard=True) as store:
        assert isinstance(store.guard, AdvisoryLockGuard)
        kill_guard_connection(postgres_url)
        with pytest.raises(Unavailable) as lost:
            store.commit(tenant_change("during"))  # the fence, or the monitor, refuses it
        assert lost.value.retry_after_s
        wait_for(lambda: store.writer_problem() is None, 10, "regained")
        store.commit(tenant_change("after"))
        assert [t.name for t in store.load().tenants] == ["after"]


@pytest.mark.postgres
def test_a_writer_whose_database_another_wrote_to_stops_for_good(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rounds slow enough that the other writer surely comes in between.
    monkeypatch.setattr(guard, "MONITOR_INTERVAL_S", 3.0)
    with Store(postgres_url, writer_guard=True) as store:
        assert isinstance(store.guard, AdvisoryLockGuard)
        fenced: list[str] = []
        store.guard.on_fenced = fenced.append
        kill_guard_connection(postgres_url)
        # Another writer takes the guard in the gap, writes, and goes away.
        with Store(postgres_url, writer_guard=True) as other:
            other.commit(tenant_change("other"))
        wait_for(lambda: bool(fenced), 15, "fenced")
        assert "another writer" in fenced[0] and "restart" in fenced[0]
        with pytest.raises(Unavailable, match="may not write"):
            store.commit(tenant_change("stale"))
    with Store(postgres_url) as check:
        assert [t.name for t in check.load().tenants] == ["other"]


def test_sqlite_guard_file_names_the_holder(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    with Store(url, writer_guard=True):
        holder = (tmp_path / "p.db-writer.lock").read_text()
        assert "pid" in holder and "since" in holder
        with pytest.raises(WriterTaken, match="since"):
            Store(url, writer_guard=True)
