"""One wording for a wait in the queue (``portal.waits``): the spawn page, the dashboards and
the CLI all say it so."""

from __future__ import annotations

import pytest

from portal.waits import NO_ESTIMATE, duration, eta_words, queue_line, wait_words, why_and_when


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
