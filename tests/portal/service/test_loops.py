"""The loop registry: work runs periodically, a failing round is counted and logged and the
loop carries on, stop waits for a round in progress."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from policies.errors import Conflict, InvalidRequest
from portal.service.loops import Loops, LoopsCollector


def wait_for(check: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached")


def test_a_failing_round_is_counted_and_logged_and_the_loop_keeps_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) % 2:
            raise RuntimeError("boom")

    loops = Loops()
    loop = loops.add("flaky", 0.01, flaky)
    with caplog.at_level(logging.ERROR, logger="portal.service.loops"):
        loops.start()
        wait_for(lambda: loop.runs >= 6)
        loops.stop()
    assert loop.errors >= 3
    assert loop.runs - loop.errors >= 3  # the rounds after a failure still ran
    assert loop.last_error == "RuntimeError: boom"
    assert any("loop flaky failed" in r.getMessage() for r in caplog.records)
    registry = CollectorRegistry()
    registry.register(LoopsCollector(loops))
    assert registry.get_sample_value("gpuportal_loop_errors_total", {"loop": "flaky"}) == (
        loop.errors
    )
    assert registry.get_sample_value("gpuportal_loop_runs_total", {"loop": "flaky"}) == loop.runs


def test_stop_waits_for_the_round_in_progress() -> None:
    entered = threading.Event()
    finished: list[bool] = []

    def slow() -> None:
        entered.set()
        time.sleep(0.3)
        finished.append(True)

    loops = Loops()
    loops.add("slow", 0.01, slow)
    loops.start()
    assert entered.wait(5)
    loops.stop()
    assert finished == [True]
    assert not any(lp.thread is not None and lp.thread.is_alive() for lp in loops)


def test_cleanups_run_after_every_loop_stopped_even_when_one_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    order: list[str] = []

    def round_() -> None:
        time.sleep(0.05)
        order.append("round")

    def broken() -> None:
        raise RuntimeError("broken cleanup")

    loops = Loops()
    loops.add("work", 0.01, round_, first_after_s=0)
    loops.at_stop(broken)
    loops.at_stop(lambda: order.append("closed"))
    loops.start()
    wait_for(lambda: "round" in order)
    with caplog.at_level(logging.ERROR):
        loops.stop()
    assert order[-1] == "closed" and order.count("closed") == 1
    assert "broken cleanup" in caplog.text


@pytest.mark.parametrize("interval", [0, -1.0, float("nan")])
def test_a_loop_needs_a_positive_interval(interval: float) -> None:
    with pytest.raises(InvalidRequest, match="interval of loop x"):
        Loops().add("x", interval, lambda: None)


def test_names_are_unique_and_loops_are_added_before_start() -> None:
    loops = Loops()
    loops.add("x", 1.0, lambda: None)
    with pytest.raises(Conflict, match="registered already"):
        loops.add("x", 1.0, lambda: None)
    loops.start()
    try:
        with pytest.raises(Conflict, match="after the loops started"):
            loops.add("y", 1.0, lambda: None)
    finally:
        loops.stop()


def test_a_loop_may_run_first_at_once_and_then_every_interval() -> None:
    ran: list[float] = []
    loops = Loops()
    began = time.monotonic()
    loops.add("now", 3600.0, lambda: ran.append(time.monotonic()), first_after_s=0)
    later = loops.add("later", 3600.0, lambda: None)
    loops.start()
    try:
        wait_for(lambda: len(ran) == 1)
        assert ran[0] - began < 2.0
        assert later.runs == 0  # the default still waits one interval
    finally:
        loops.stop()
    assert len(ran) == 1


@pytest.mark.parametrize("first", [-1.0, float("nan")])
def test_the_first_delay_must_not_be_negative(first: float) -> None:
    with pytest.raises(InvalidRequest, match="first delay of loop x"):
        Loops().add("x", 1.0, lambda: None, first_after_s=first)
