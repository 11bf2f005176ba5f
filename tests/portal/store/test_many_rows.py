"""Rows of one table in one statement (pipelined PostgreSQL commits): what is stored is what
one row per statement stored, in order, and one bad row still refuses the whole change set."""

from __future__ import annotations

import pytest

from policies.errors import Conflict
from portal.store import db
from portal.store.records import ChangeSet
from portal.store.writer import Store
from tests.portal.store.builders import allocation, at, event, quota, tenant, workload


def test_an_insert_is_rewritten_for_n_rows_and_other_statements_are_not(store: Store) -> None:
    stmt = store._insert_event
    many = stmt.many_rows(3)
    if store.engine.dialect.name == "sqlite":  # positional: executemany is one C loop there
        assert many is None
        return
    assert many is not None
    sql, names = many
    assert sql.count("%s") == 3 * len(names) and "%(" not in sql
    assert set(names) == set(stmt.names)
    assert store._release.many_rows(2) is None  # an UPDATE keeps one row per statement


@pytest.fixture(params=[db.MAX_ROW_PARAMETERS, 20], ids=["one statement", "chunked"])
def max_parameters(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """As configured, and so small that 9 events take several statements."""
    monkeypatch.setattr(db, "MAX_ROW_PARAMETERS", request.param)
    return int(request.param)


def test_many_rows_of_each_table_are_stored_in_order(acme: Store, max_parameters: int) -> None:
    acme.commit(ChangeSet(tenants=[tenant("beta")]))
    events = [event(f"e{i}", minutes=i, data={"i": i, "text": f"x'{i}"}) for i in range(9)]
    acme.commit(
        ChangeSet(
            quotas=[quota("acme", "H100-80GB", limit=8)],
            workloads=[workload("w1"), workload("w2"), workload("w3", tenant="beta")],
            allocations=[
                allocation("a1", "w1", (0, 1)),
                allocation("a2", "w2", (2,)),
                allocation("a3", "w3", (3,)),
            ],
            events=events,
            usage_history={"acme": (2.5, at(1)), "beta": (1.0, at(2))},
        )
    )
    state = acme.load()
    assert sorted((a.id, a.gpus) for a in state.allocations) == [
        ("a1", (0, 1)),
        ("a2", (2,)),
        ("a3", (3,)),
    ]
    assert acme.events() == events
    assert state.usage_history == {"acme": (2.5, at(1)), "beta": (1.0, at(2))}
    # The upsert of many rows overwrites the stored ones, each with its own values.
    acme.commit(ChangeSet(usage_history={"acme": (3.0, at(3)), "beta": (4.0, at(4))}))
    assert acme.load().usage_history == {"acme": (3.0, at(3)), "beta": (4.0, at(4))}


def test_one_duplicate_row_among_many_refuses_the_change_set(acme: Store) -> None:
    acme.commit(
        ChangeSet(
            quotas=[quota("acme", "H100-80GB", limit=8)],
            workloads=[workload("w0")],
            allocations=[allocation("a0", "w0", (7,))],
        )
    )
    before = acme.load()
    with pytest.raises(Conflict, match="GPU 7 on node-7 is already held by allocation 'a0'"):
        acme.commit(
            ChangeSet(
                workloads=[workload("w1"), workload("w2")],
                allocations=[allocation("a1", "w1", (0,)), allocation("a2", "w2", (7,))],
                events=[event("a", workload_id="w1"), event("b", workload_id="w2")],
            )
        )
    assert acme.load() == before
    assert acme.events() == []
