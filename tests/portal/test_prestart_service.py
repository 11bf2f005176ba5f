"""Pre-started environments under ``gpuportal serve``: the settings, the per-option rates from
the demand forecast, the loop woken by a request that queues, and adoption by a spawn in one
decision; over a real allocator and store (a reporting store as serve has)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.errors import InvalidRequest
from policies.requests import WorkloadKind
from portal.allocator import Allocator
from portal.prestart.rates import option_rates
from portal.prestart.service import PrestartService, PrestartSettings, build_for_service
from portal.service.decisions import ReportingStore
from portal.settings import load_settings
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, wl
from tests.support.waiting import eventually

H100 = "H100-80GB"
ONE, TWO = "gpu:H100-80GB:1", "gpu:H100-80GB:2"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def alloc(tmp_path: Path, clock: ManualClock) -> Iterator[Allocator]:
    store = ReportingStore(f"sqlite:///{tmp_path / 'portal.db'}")
    a = Allocator(store, clock=clock)
    a.start([hgx("n1")])  # 8 GPUs
    a.set_tenant("team-a")
    a.set_quota("team-a", H100, guaranteed=4, limit=8)
    yield a
    store.close()


def service(
    alloc: Allocator, clock: ManualClock, budget: float = 4.0, interval_s: float = 5.0
) -> PrestartService:
    s = PrestartService(
        alloc,
        PrestartSettings(
            budget_gpus=budget, horizon_s=600, tenant="platform", interval_s=interval_s
        ),
        clock=clock,
    )
    s.setup()
    return s


def test_a_restart_keeps_an_admins_edit_of_the_platform_quota(
    alloc: Allocator, clock: ManualClock
) -> None:
    """The first start sets the budget as the limit; an admin lowers it; the next start (a
    new service over the same allocator state) keeps the admin's value, and the pool holds
    no more than it allows."""
    service(alloc, clock, budget=4.0)
    (q,) = alloc.quotas("platform")
    assert (q.guaranteed, q.limit) == (0, 4)
    alloc.set_quota("platform", H100, guaranteed=0, limit=1)
    again = service(alloc, clock, budget=4.0)
    (q,) = alloc.quotas("platform")
    assert (q.guaranteed, q.limit) == (0, 1)
    again.refresh()
    again.rates = {ONE: 6.0, TWO: 3.0}  # with the limit of 4: {ONE: 2, TWO: 1}
    again.round()
    assert {k: len(v) for k, v in again.pool.held().items()} == {ONE: 1}


def test_settings_off_by_default_and_bad_values_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().prestart_budget_gpus == 0
    for value, valid in (("-1", "greater than or equal to 0"), ("nan", "finite")):
        monkeypatch.setenv("GPUPORTAL_PRESTART_BUDGET_GPUS", value)
        with pytest.raises(InvalidRequest, match="GPUPORTAL_PRESTART_BUDGET_GPUS") as bad:
            load_settings()
        assert valid in str(bad.value)
    monkeypatch.delenv("GPUPORTAL_PRESTART_BUDGET_GPUS")
    with pytest.raises(InvalidRequest, match=r"prestart_tenant .*Platform_Team.*DNS"):
        load_settings(prestart_tenant="Platform_Team")
    with pytest.raises(InvalidRequest, match=r"prestart_horizon_s .*5.*60"):
        load_settings(prestart_horizon_s=5)


def test_off_builds_nothing_on_builds_the_tenant_with_the_budget_as_limit(
    alloc: Allocator,
) -> None:
    assert build_for_service(alloc, load_settings()) is None
    assert "platform" not in {t.name for t in alloc.tenants()}
    on = build_for_service(alloc, load_settings(prestart_budget_gpus=3.5))
    assert on is not None
    (q,) = alloc.quotas("platform")
    assert (q.flavor, q.guaranteed, q.limit) == (H100, 0, 3)


def test_rates_split_the_flavor_forecast_over_options_by_recent_spawns(
    alloc: Allocator, clock: ManualClock
) -> None:
    # Six hours of the same hour: 3 notebooks of 1 GPU, 1 of 2 GPUs, 2 one-GPU jobs, and the
    # platform's own placeholders (left out). The flavor's forecast is 6 arrivals an hour;
    # ONE's share 3/6, TWO's 1/6.
    alloc.set_tenant("platform")
    alloc.set_quota("platform", H100, guaranteed=0, limit=8)
    asks = [gpus(1)] * 3 + [gpus(2)] + [gpus(1)] * 2
    kinds = [WorkloadKind.NOTEBOOK] * 4 + [WorkloadKind.JOB] * 2
    for _hour in range(6):
        ids = [alloc.request(wl("team-a", d, kind=k)).id for d, k in zip(asks, kinds, strict=True)]
        ids += [alloc.request(wl("platform", gpus(1))).id for _ in range(5)]
        clock.advance(minutes=10)
        for wid in ids:
            alloc.release(wid)
        clock.advance(minutes=50)
    s = service(alloc, clock)
    s.refresh()
    specs = list(s.pool.options.values())
    assert {ONE, TWO} <= {o.key for o in specs}
    rates = option_rates(alloc.store, specs, clock(), exclude="platform")
    assert rates[ONE] == pytest.approx(3.0) and rates[TWO] == pytest.approx(1.0)
    assert all(v == 0 for k, v in rates.items() if k not in (ONE, TWO))
    assert s.rates == rates


def test_a_request_that_queues_wakes_the_loop_which_gives_the_devices_back(
    alloc: Allocator, clock: ManualClock
) -> None:
    s = service(alloc, clock, interval_s=60.0)  # the interval alone would not do it in time
    store = alloc.store
    assert isinstance(store, ReportingStore)
    store.listeners.append(s.on_decision)  # as serve wires it
    s.refresh()
    s.rates = {ONE: 6.0, TWO: 3.0}
    s.round()
    assert {k: len(v) for k, v in s.pool.held().items()} == {ONE: 2, TWO: 1}
    assert alloc.request(wl("team-a", gpus(4))).state is WorkloadState.RUNNING
    stopping = threading.Event()

    def loop() -> None:
        while not stopping.is_set():
            s.wait_then_round(stopping)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        waiting = alloc.request(wl("team-a", gpus(2), name="late"))
        assert waiting.state is WorkloadState.QUEUED  # the placeholders hold the rest
        eventually(
            lambda: alloc.status(waiting.id).state is WorkloadState.RUNNING or None,
            "the queued user placed on the placeholders' devices",
            timeout_s=10,
        )
    finally:
        stopping.set()
        thread.join(5)


def test_a_spawn_adopts_a_placeholder_in_one_decision(alloc: Allocator, clock: ManualClock) -> None:
    s = service(alloc, clock, budget=8.0)
    s.refresh()
    s.rates = {ONE: 6.0, TWO: 3.0}
    s.round()
    held = s.pool.held()  # ONE: 2 of 1 GPU, TWO: 1 of 2 GPUs
    assert alloc.request(wl("team-a", gpus(4))).state is WorkloadState.RUNNING  # node full now
    assert s.placeholder_for(ONE, gpus(2)) is None  # devices not the option's: adopts nothing
    # A spawn of an option with no placeholder is unaffected: it queues, none is taken.
    four = alloc.request(wl("team-a", gpus(4), name="carol"), adopt=s.placeholder_for("x", gpus(4)))
    assert four.state is WorkloadState.QUEUED
    assert s.pool.held() == held
    alloc.release(four.id)
    # A spawn of ONE runs at once, on the devices of ONE's oldest placeholder; TWO's stays.
    target = s.placeholder_for(ONE, gpus(1))
    assert target == held[ONE][0]
    devices = alloc.read(lambda st: {(a.node, a.gpus) for a in st.live[target].allocations})
    spawn = alloc.request(wl("team-a", gpus(1), name="alice"), adopt=target)
    assert spawn.state is WorkloadState.RUNNING
    assert {(a.node, a.gpus) for a in spawn.allocations} == devices
    ended = alloc.status(target)
    assert ended.state is WorkloadState.RELEASED and "adopted by alice" in ended.reason
    assert s.pool.held() == {ONE: held[ONE][1:], TWO: held[TWO]}
    # A retry of the spawn (its idempotency key) finds it and adopts no second placeholder.
    key = "spawn-alice-1"
    first = alloc.request(wl("team-a", gpus(1), name="dave"), idempotency_key=key,
                          adopt=s.placeholder_for(ONE, gpus(1)))  # fmt: skip
    again = alloc.request(wl("team-a", gpus(1), name="dave"), idempotency_key=key,
                          adopt=s.placeholder_for(TWO, gpus(2)))  # fmt: skip
    assert again.id == first.id and s.pool.held() == {TWO: held[TWO]}


def test_a_spawn_that_would_queue_anyway_leaves_the_placeholder(
    alloc: Allocator, clock: ManualClock
) -> None:
    s = service(alloc, clock, budget=8.0)
    s.refresh()
    s.rates = {ONE: 6.0}
    s.round()
    held = s.pool.held()
    assert alloc.request(wl("team-a", gpus(2))).state is WorkloadState.RUNNING
    alloc.set_quota("team-a", H100, guaranteed=2, limit=2)  # at its limit now
    spawn = alloc.request(wl("team-a", gpus(1), name="eve"), adopt=s.placeholder_for(ONE, gpus(1)))
    assert spawn.state is WorkloadState.QUEUED and spawn.reason == "quota"
    assert s.pool.held() == held
