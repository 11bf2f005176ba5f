"""Probes of ``benchmarks.jobs``' Kubernetes path: the portal's client, and where the binder's
time goes (both trees of a side-by-side comparison have these methods)."""

from __future__ import annotations

import threading
import time
from typing import Any


def portal_client(cluster: Any, connections: int) -> Any:
    """The portal's client, with a connection pool of ``connections`` (the
    library's default is 5 per core; a call finding it full opens a new TLS connection)."""
    from kubernetes import client

    configuration = cluster.configure(client.Configuration())
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


def time_binder(binder: Any) -> dict[str, Any]:
    """Where the binder's time goes, filled in as it runs: passes, seconds in its lists (the
    pending pods, the portal's pods), in deciding (lists included) and in whole passes, and the
    decisions carried out with the seconds each took (summed over its worker threads)."""
    times: dict[str, Any] = {
        "passes": 0,
        "pass_s": 0.0,
        "decide_s": 0.0,
        "list_s": 0.0,
        "acted": 0,
        "act_s": 0.0,
        "most_decisions_in_a_pass": 0,
    }
    lock = threading.Lock()

    def timed(name: str, key: str, count: str | None = None) -> None:
        call = getattr(binder, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                with lock:
                    times[key] += time.perf_counter() - began
                    if count:
                        times[count] += 1

        setattr(binder, name, wrapper)

    timed("pending", "list_s")
    timed("portal_pods", "list_s")
    timed("act", "act_s", "acted")
    timed("bind_pending", "pass_s", "passes")
    decide_all = binder.decide_all

    def decide_counted() -> Any:
        began = time.perf_counter()
        decisions = decide_all()
        with lock:
            times["decide_s"] += time.perf_counter() - began
            most = max(times["most_decisions_in_a_pass"], len(decisions))
            times["most_decisions_in_a_pass"] = most
        return decisions

    binder.decide_all = decide_counted
    return times
