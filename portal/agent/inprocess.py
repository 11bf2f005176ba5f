"""The node agent inside the portal service, for the local backend (one GPU server).

No HTTP and no token: each round's batches go straight to the service's ``Telemetry.ingest``,
the same path the API route takes. The service calls ``register`` when its inventory is
``nvml`` (a host without a driver gets one log line and no loop), and ``register_simulated``
for a simulated inventory when ``GPUPORTAL_SIMULATED_SAMPLES`` is on (the demo).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from policies.inventory import Node
from portal.agent.attribution import ProcessAttributor
from portal.agent.demo import DemoSource
from portal.agent.run import Agent, NvmlSource
from portal.inventory import nvml
from portal.telemetry.wire import IngestResult, SampleBatch

log = logging.getLogger(__name__)

LOOP_NAME = "agent"


class LoopRegistry(Protocol):
    """What ``portal.service.loops.Loops`` offers (kept structural: the agent does not import
    the service)."""

    def add(self, name: str, interval_s: float, work: Callable[[], None]) -> object: ...


class Ingest(Protocol):
    def ingest(self, batch: SampleBatch) -> IngestResult: ...


def register(
    loops: LoopRegistry,
    telemetry: Ingest,
    node_name: str | None = None,
    *,
    interval_s: float = 10.0,
    proc_root: Path = Path("/proc"),
) -> NvmlSource | None:
    """Add the ``agent`` loop sampling this host into ``telemetry``; returns its source (close
    it at shutdown), or ``None`` when the host has no NVIDIA driver."""
    source = NvmlSource(node_name, ProcessAttributor(proc_root))
    try:
        source.start()
    except nvml.NoDriver as e:
        log.warning("node agent not started: %s", e.message)
        return None

    def deliver(batch: SampleBatch) -> None:
        result = telemetry.ingest(batch)
        if result.rejected:
            log.warning(
                "%d of %d samples rejected: %s",
                result.rejected,
                len(batch.samples),
                "; ".join(r.reason for r in result.rejections[:3]),
            )

    agent = Agent(source, deliver, interval_s=interval_s)

    def one_round() -> None:
        agent.tick()

    loops.add(LOOP_NAME, interval_s, one_round)
    return source


def register_simulated(
    loops: LoopRegistry,
    telemetry: Ingest,
    nodes: Callable[[], list[Node]],
    *,
    interval_s: float = 10.0,
) -> None:
    """Add the ``agent`` loop feeding synthetic samples of the simulated ``nodes()`` (the
    demo's GPUs, named ``GPU-sim-<node>-<index>``) into ``telemetry``, so dashboards, alerts
    and cost efficiency have data on a machine without GPUs."""

    def one_round() -> None:
        rejected = 0
        for batch in DemoSource(nodes()).batches():
            rejected += telemetry.ingest(batch).rejected
        if rejected:
            log.warning("%d simulated samples rejected", rejected)

    loops.add(LOOP_NAME, interval_s, one_round)
