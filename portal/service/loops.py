"""Periodic work of the service, each loop in its own background thread.

A loop is a name, an interval and a callable without arguments. The service registers the
allocator tick and the inventory follower; other parts of the portal register theirs
(isolation reconcile, telemetry roll-ups, alert evaluation) on the same ``Loops`` before
``start``::

    loops.add("alerts", 15.0, evaluate_alerts)

Contract of the callable: it does one round of work and returns; it must be thread-safe
against the API's worker threads (the allocator is); an exception is logged with its
traceback and counted in ``errors`` and the loop carries on at its next interval — a failing
loop never stops the process. ``stop`` waits for a round in progress to finish, so a
shutdown never cuts a transaction in half.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from policies.errors import Conflict, InvalidRequest, Unavailable

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Loop:
    """One registered loop and what it has done so far."""

    name: str
    interval_s: float
    work: Callable[[], None]
    runs: int = 0
    errors: int = 0
    last_error: str | None = None
    last_duration_s: float = 0.0
    first_after_s: float = 0.0
    thread: threading.Thread | None = field(default=None, repr=False)


class LoopsCollector(Collector):
    """``gpuportal_loop_runs_total`` and ``gpuportal_loop_errors_total`` per loop, read at
    scrape time."""

    def __init__(self, loops: Loops) -> None:
        self._loops = loops

    def collect(self) -> Iterator[Metric]:
        runs = CounterMetricFamily("gpuportal_loop_runs", "Rounds run, per loop.", labels=["loop"])
        errors = CounterMetricFamily(
            "gpuportal_loop_errors", "Rounds that raised, per loop.", labels=["loop"]
        )
        for loop in self._loops:
            runs.add_metric([loop.name], loop.runs)
            errors.add_metric([loop.name], loop.errors)
        return iter((runs, errors))


class Loops:
    """A registry of loops: ``add`` them, ``start`` them all, ``stop`` them all."""

    def __init__(self) -> None:
        self._loops: dict[str, Loop] = {}
        self._stopping = threading.Event()
        self._started = False
        self._at_stop: list[Callable[[], None]] = []

    def add(
        self,
        name: str,
        interval_s: float,
        work: Callable[[], None],
        *,
        first_after_s: float | None = None,
    ) -> Loop:
        """Register ``work`` to run every ``interval_s`` seconds (measured from the end of one
        round to the start of the next), the first time ``first_after_s`` after ``start``
        (default: one interval; 0: at once).

        Raises:
            InvalidRequest: the interval is not positive, or the first delay is negative.
            Conflict: the name is taken, or the loops have started already.
        """
        if not interval_s > 0:
            raise InvalidRequest(f"interval of loop {name}", interval_s, "a number > 0 seconds")
        if first_after_s is not None and not first_after_s >= 0:
            raise InvalidRequest(
                f"first delay of loop {name}", first_after_s, "a number >= 0 seconds"
            )
        if name in self._loops:
            raise Conflict(f"a loop named {name} is registered already")
        if self._started:
            raise Conflict(f"loop {name} registered after the loops started: add it before")
        loop = Loop(name, interval_s, work)
        loop.first_after_s = interval_s if first_after_s is None else first_after_s
        self._loops[name] = loop
        return loop

    def at_stop(self, cleanup: Callable[[], None]) -> None:
        """Run ``cleanup`` once the loops have stopped (threads of their own that a loop's work
        started, such as watches, would otherwise outlive the service)."""
        self._at_stop.append(cleanup)

    def __getitem__(self, name: str) -> Loop:
        return self._loops[name]

    def __iter__(self) -> Iterator[Loop]:
        return iter(list(self._loops.values()))

    def start(self) -> None:
        """Start one daemon thread per loop; each first runs after its first delay (one
        interval unless ``add`` said otherwise)."""
        self._started = True
        for loop in self._loops.values():
            loop.thread = threading.Thread(
                target=self._run, args=(loop,), name=f"loop-{loop.name}", daemon=True
            )
            loop.thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask every loop to stop and wait (up to ``timeout_s`` in all) for rounds in progress."""
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        for loop in self._loops.values():
            if loop.thread is not None:
                loop.thread.join(max(0.0, deadline - time.monotonic()))
                if loop.thread.is_alive():
                    log.warning(
                        "loop %s did not stop in time",
                        loop.name,
                        extra={"fields": {"loop": loop.name}},
                    )
        for cleanup in self._at_stop:
            try:
                cleanup()
            except Exception:  # one failed cleanup must not skip the others
                log.exception("cleanup after the loops failed")

    @property
    def stopping(self) -> threading.Event:
        """Set once ``stop`` was called; long-running work may watch it."""
        return self._stopping

    def _run(self, loop: Loop) -> None:
        delay = loop.first_after_s
        while not self._stopping.wait(delay):
            delay = loop.interval_s
            began = time.monotonic()
            try:
                loop.work()
            except Unavailable as exc:
                # An outage (the database, the hub): one line a round, not a traceback.
                loop.errors += 1
                loop.last_error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "loop %s: %s; it runs again in %.3g s",
                    loop.name,
                    exc.message,
                    loop.interval_s,
                    extra={"fields": {"loop": loop.name, "errors": loop.errors}},
                )
            except Exception as exc:
                loop.errors += 1
                loop.last_error = f"{type(exc).__name__}: {exc}"
                log.exception(
                    "loop %s failed (%d errors so far); it runs again in %.3g s",
                    loop.name,
                    loop.errors,
                    loop.interval_s,
                    extra={"fields": {"loop": loop.name, "errors": loop.errors}},
                )
            finally:
                loop.runs += 1
                loop.last_duration_s = time.monotonic() - began
