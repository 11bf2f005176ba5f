"""Seed files: checked whole before anything applies; applying twice changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.errors import InvalidRequest
from portal.allocator import Allocator
from portal.service import seed
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx

GOOD = """
tenants:
  team-a:
    cohort: research
    weight: 2
    quotas:
      H100-80GB: {guaranteed: 2, limit: 4}
      H100-80GB/3g.40gb: {guaranteed: 0, limit: 7, budget_gpu_hours: 100}
  team-b: {}
"""


@pytest.fixture
def allocator(tmp_path: Path) -> Iterator[Allocator]:
    store = Store(f"sqlite:///{tmp_path / 'portal.db'}")
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([hgx("n1")])
    yield alloc
    store.close()


def test_applying_a_seed_twice_changes_nothing_the_second_time(
    allocator: Allocator, tmp_path: Path
) -> None:
    path = tmp_path / "seed.yaml"
    path.write_text(GOOD)
    tenants = seed.load(path)
    assert seed.apply(allocator, tenants) == 4  # two tenants, two quotas
    versions = [(t.name, t.version) for t in allocator.tenants()]
    quotas = allocator.quotas()
    assert seed.apply(allocator, seed.load(path)) == 0
    assert [(t.name, t.version) for t in allocator.tenants()] == versions
    assert allocator.quotas() == quotas
    a = next(t for t in allocator.tenants() if t.name == "team-a")
    assert (a.cohort, a.weight) == ("research", 2.0)
    assert {(q.flavor, q.guaranteed, q.limit, q.budget_gpu_hours) for q in quotas} == {
        ("H100-80GB", 2, 4, None),
        ("H100-80GB/3g.40gb", 0, 7, 100.0),
    }


def test_a_changed_value_is_applied_on_top_of_the_current_version(allocator: Allocator) -> None:
    seed.apply(
        allocator,
        seed.parse(
            {"tenants": {"t": {"quotas": {"H100-80GB": {"guaranteed": 1, "limit": 2}}}}}, "s"
        ),
    )
    allocator.set_quota("t", "H100-80GB", guaranteed=1, limit=3)  # an edit through the API
    changed = seed.apply(
        allocator,
        seed.parse(
            {"tenants": {"t": {"quotas": {"H100-80GB": {"guaranteed": 1, "limit": 5}}}}}, "s"
        ),
    )
    assert changed == 1
    (q,) = allocator.quotas("t")
    assert (q.limit, q.version) == (5, 3)


def _one_quota(limit: int, *, weight: float = 1.0) -> list[seed.SeedTenant]:
    doc = {"weight": weight, "quotas": {"H100-80GB": {"guaranteed": 0, "limit": limit}}}
    return seed.parse({"tenants": {"team-b": doc}}, "s")


def test_an_edit_made_since_survives_the_same_seed_at_a_restart(tmp_path: Path) -> None:
    # The case: team-b's H100 limit 1 -> 2 through the API, the service restarts and
    # applies its unchanged seed again.
    url = f"sqlite:///{tmp_path / 'portal.db'}"
    store = Store(url)
    first = Allocator(store, clock=ManualClock())
    first.start([hgx("n1")])
    assert seed.apply(first, _one_quota(1)) == 2
    first.set_quota("team-b", "H100-80GB", guaranteed=0, limit=2, expected_version=1)
    first.set_tenant("team-b", weight=3.0, expected_version=1)
    store.close()

    store = Store(url)
    restarted = Allocator(store, clock=ManualClock())
    restarted.start([hgx("n1")])
    try:
        assert seed.apply(restarted, _one_quota(1)) == 0
        (q,) = restarted.quotas("team-b")
        assert (q.limit, q.version) == (2, 2)
        (t,) = restarted.tenants()
        assert t.weight == 3.0
        # The file itself changing an entry still applies, to that entry alone.
        assert seed.apply(restarted, _one_quota(4)) == 1
        (q,) = restarted.quotas("team-b")
        assert q.limit == 4
        assert restarted.tenants()[0].weight == 3.0
    finally:
        store.close()


def test_a_seed_never_overwrites_what_existed_before_it_named_it(allocator: Allocator) -> None:
    allocator.set_tenant("team-b", weight=2.0)
    allocator.set_quota("team-b", "H100-80GB", guaranteed=0, limit=3)
    assert seed.apply(allocator, _one_quota(1)) == 0
    assert allocator.quotas("team-b")[0].limit == 3
    assert allocator.tenants()[0].weight == 2.0
    # Remembered now: a later change of the file's entry applies.
    assert seed.apply(allocator, _one_quota(5)) == 1
    assert allocator.quotas("team-b")[0].limit == 5


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        ({"tenant": {}}, "a mapping with one key, tenants"),
        ({"tenants": {"t": {"quota": {}}}}, "s: tenants.t"),
        ({"tenants": {"t": {"weight": 0}}}, "s: tenants.t.weight"),
        ({"tenants": {"t": {"pools": "p"}}}, "s: tenants.t.pools"),
        ({"tenants": {"t": {"quotas": {"H100-80GB": {"limit": 2}}}}}, "tenants.t.quotas.H100-80GB"),
        (
            {"tenants": {"t": {"quotas": {"H100-80GB": {"guaranteed": "1", "limit": 2}}}}},
            "tenants.t.quotas.H100-80GB.guaranteed",
        ),
        ({"tenants": {"t": {"quotas": {"": {"guaranteed": 1, "limit": 2}}}}}, "a flavor name"),
    ],
)
def test_a_malformed_seed_names_the_place_and_applies_nothing(
    allocator: Allocator, doc: object, names: str
) -> None:
    with pytest.raises(InvalidRequest, match=names.replace(".", r"\.")):
        seed.parse(doc, "s")
    assert allocator.tenants() == []


def test_a_missing_or_unparsable_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="seed file"):
        seed.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: [")
    with pytest.raises(InvalidRequest, match="valid YAML"):
        seed.load(bad)


def test_the_seed_sets_ceilings_and_over_commits_only_when_it_says_so(
    allocator: Allocator,
) -> None:
    # n1 has 8 H100s: 6 + 4 guaranteed is over-commit.
    doc = {
        "tenants": {
            "team-a": {"quotas": {"H100-80GB": {"guaranteed": 6, "limit": 8}}},
            "team-b": {"quotas": {"H100-80GB": {"guaranteed": 4, "limit": 8}}},
        }
    }
    with pytest.raises(InvalidRequest, match="add up to 10 on a capacity of 8"):
        seed.apply(allocator, seed.parse(doc, "seed"))
    b = doc["tenants"]["team-b"]["quotas"]["H100-80GB"]
    b.update({"overcommit": True, "ceiling_guaranteed": 5, "ceiling_limit": 8})
    seed.apply(allocator, seed.parse(doc, "seed"))
    q = {x.tenant: x for x in allocator.quotas()}
    assert (q["team-b"].guaranteed, q["team-b"].ceiling_guaranteed) == (4, 5)
    assert seed.apply(allocator, seed.parse(doc, "seed")) == 0
    with pytest.raises(InvalidRequest, match="overcommit"):
        seed.parse({"tenants": {"t": {"quotas": {"T4": {**b, "overcommit": "yes"}}}}}, "seed")
