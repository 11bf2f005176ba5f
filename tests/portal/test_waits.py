"""One wording for a wait in the queue (``portal.waits``): the spawn page, the dashboards and
the CLI all say it so."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from portal.waits import (
    NO_ESTIMATE,
    duration,
    eta_words,
    likely,
    queue_line,
    wait_of,
    wait_words,
    why_and_when,
)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "under a minute"), (59.0, "under a minute"), (61.0, "2 min"), (3600.0, "1 h"),
     (3700.0, "1 h 2 min"), (None, "unknown"), (float("inf"), "unknown")],
)  # fmt: skip
def test_durations_in_words(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_no_estimate_is_said_as_such_never_as_a_time() -> None:
    assert NO_ESTIMATE == "waits for a release; no estimate"
    assert eta_words(None) == NO_ESTIMATE
    assert wait_words(None) == NO_ESTIMATE
    # 0 s is an estimate (it should start at the next decision), not the absence of one.
    assert eta_words(0.0) == "under a minute"
    assert wait_words(720.0) == "estimated wait 12 min"


def test_the_reason_and_the_wait_in_one_line() -> None:
    msg = "team-a quota for H100-80GB: 4/4 gpus in use, 1 requested (limit 4)"
    assert why_and_when(msg, 720.0) == f"{msg}; estimated wait 12 min"
    assert why_and_when(msg, None) == f"{msg}; waits for a release; no estimate"
    assert why_and_when("", None) == NO_ESTIMATE
    assert queue_line(3, "quota", msg, None) == f"#3 · quota: {msg}; {NO_ESTIMATE}"


def test_a_message_that_already_says_it_waits_for_a_release_is_not_told_twice() -> None:
    # The portal's idle-tenant message ends so (policies.quota).
    msg = (
        "4 gpus of H100-80GB stand free, but they are other tenants' guaranteed quota, which "
        "team-a may not borrow (tenants lend only within their cohort); it waits for a release"
    )
    assert why_and_when(msg, None) == f"{msg}; no estimate"
    assert why_and_when(msg, 60.0) == f"{msg}; estimated wait 1 min"


@dataclass
class _Wait:
    eta_s: float | None
    eta_low_s: float | None
    eta_high_s: float | None
    eta_reason: str


def test_an_interval_is_told_when_it_says_more_than_the_point() -> None:
    assert likely(480.0, 1200.0) == "8 min to 20 min"
    assert likely(10.0, 1200.0) == "up to 20 min"
    assert likely(700.0, 720.0) == ""  # both ends read "12 min"
    assert likely(None, 1200.0) == ""
    assert eta_words(720.0, 480.0, 1200.0) == "12 min (likely 8 min to 20 min)"
    assert wait_words(720.0, 480.0, 1200.0) == "estimated wait 12 min (likely 8 min to 20 min)"
    why = "3 workloads ahead of you; the next H100 frees in about 8 min when a job ends"
    w = _Wait(720.0, 480.0, 1200.0, why)
    assert wait_of(w) == f"estimated wait 12 min (likely 8 min to 20 min): {why}"
    msg = "capacity of H100-80GB: 8/8 in use"
    assert queue_line(3, "capacity", msg, w.eta_s, w) == (
        f"#3 · capacity: {msg}; estimated wait 12 min (likely 8 min to 20 min): {why}"
    )


def test_no_estimate_with_an_interval_record_is_still_no_estimate() -> None:
    w = _Wait(None, None, None, "waits for a release; no running workload has an end time")
    assert wait_of(w) == NO_ESTIMATE
    assert why_and_when("", None, w) == NO_ESTIMATE
