"""``gpuportal agent``: discover, then sample and report every ``interval_s`` until stopped.

A DaemonSet on Kubernetes (one agent per GPU node, ``hostPID: true`` so ``/proc`` shows the
containers' processes, the node name from the downward API), a process next to the portal on
a single GPU server. Settings come from ``GPUPORTAL_AGENT_*`` variables; flags override them.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import httpx
from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from policies.errors import InvalidRequest, PortalError
from policies.inventory import Node
from portal.agent.attribution import PodLookup, ProcessAttributor
from portal.agent.demo import DemoSource
from portal.agent.reporter import Reporter
from portal.agent.sampler import NvmlSampler, live_pids
from portal.inventory import nvml
from portal.telemetry.wire import SampleBatch, Source

log = logging.getLogger(__name__)

FLUSH_LIMIT = 30
"""Most batches sent per round: after an outage the backlog drains over a few rounds."""


class AgentSettings(BaseSettings):
    """Settings of one node agent."""

    model_config = SettingsConfigDict(env_prefix="GPUPORTAL_AGENT_", frozen=True, extra="forbid")

    portal_url: str = Field(
        default="http://127.0.0.1:8090",
        description="Base URL of the portal API, with the service prefix if it has one.",
    )
    token: SecretStr | None = Field(
        default=None,
        description="API token with the telemetry:write scope; required unless --stdout.",
    )
    node_name: str | None = Field(
        default=None,
        description="This node's name (Kubernetes: from spec.nodeName). Default: host.",
    )
    interval_s: float = Field(default=10.0, gt=0, le=3600, description="Seconds between samples.")
    rediscover_s: float = Field(
        default=300.0, gt=0, description="Seconds between discoveries (MIG layouts change)."
    )
    buffer_batches: int = Field(
        default=360, ge=1, le=100_000, description="Batches kept while the portal is down."
    )
    timeout_s: float = Field(default=10.0, gt=0, le=300, description="HTTP timeout per request.")
    kubernetes: bool = Field(
        default=False,
        description="Write the topology annotation on the Node and attribute processes to pods.",
    )
    proc_root: Path = Field(default=Path("/proc"), description="Where the host's /proc is.")
    prometheus_url: str | None = Field(
        default=None,
        description=(
            "Read DCGM exporter metrics from this Prometheus instead of NVML (all nodes, or "
            "node_name's only when set)."
        ),
    )


def load_agent_settings(**overrides: Any) -> AgentSettings:
    """Settings from the environment, ``overrides`` (CLI flags, None = not given) winning."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return AgentSettings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "settings"
        where = f"{name} (command line)" if name in given else f"GPUPORTAL_AGENT_{name.upper()}"
        message = str(first["msg"]).removeprefix("Input should be ")
        raise InvalidRequest(f"setting {where}", repr(first.get("input")), message) from exc


class BatchSource(Protocol):
    def batches(self) -> list[SampleBatch]: ...


class NvmlSource:
    """This host's GPUs through NVML; rediscovers on a schedule and after NVML errors.

    ``on_discovered`` sees each discovered ``Node`` that differs from the last one it took
    (the annotation writer on Kubernetes); when it returns ``False`` it sees the node again at
    the next discovery.
    """

    def __init__(
        self,
        node_name: str | None,
        attribute: ProcessAttributor,
        *,
        rediscover_s: float = 300.0,
        on_discovered: Callable[[Node], object] = lambda node: None,
        clock: Callable[[], float] = time.monotonic,
        discover: Callable[[str | None], Node] = nvml.discover,
    ) -> None:
        self._name = node_name
        self._attribute = attribute
        self._rediscover_s = rediscover_s
        self._on_discovered = on_discovered
        self._clock = clock
        self._discover = discover
        self._sampler: NvmlSampler | None = None
        self._node: Node | None = None
        self._announced: Node | None = None
        self._discovered_at = 0.0

    @property
    def node(self) -> Node | None:
        return self._node

    def start(self) -> Node:
        """Discover and open NVML; raises ``nvml.NoDriver`` without a driver."""
        self.close()
        node = self._discover(self._name)
        if node != self._announced and self._on_discovered(node) is not False:
            self._announced = node
        self._node, self._discovered_at = node, self._clock()
        sampler = NvmlSampler(node, self._attribute)
        sampler.open()
        self._sampler = sampler
        return node

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None

    def batches(self) -> list[SampleBatch]:
        if self._sampler is None or self._clock() - self._discovered_at >= self._rediscover_s:
            self.start()
        assert self._sampler is not None and self._node is not None
        try:
            samples = self._sampler.sample()
        except nvml.NvmlError:
            self.close()  # rediscover next time: a GPU may have gone or changed
            raise
        self._attribute.forget_except(live_pids(samples))
        return [SampleBatch(node=self._node.name, source=Source.NVML, samples=samples)]


class Agent:
    """Samples ``source`` every ``interval_s`` and hands the batches to ``deliver``."""

    def __init__(
        self,
        source: BatchSource,
        deliver: Callable[[SampleBatch], None],
        flush: Callable[[], object] = lambda: None,
        *,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._deliver = deliver
        self._flush = flush
        self._interval = interval_s
        self._clock = clock

    def tick(self) -> int:
        """One round: sample, queue, send. Returns the number of samples taken."""
        try:
            batches = self._source.batches()
        except nvml.NoDriver:
            raise
        except PortalError as e:  # NVML or Prometheus failed this round
            log.error("sampling failed, retrying next round: %s", e.message)
            batches = []
        for batch in batches:
            self._deliver(batch)
        self._flush()
        return sum(len(b.samples) for b in batches)

    def run(self, stop: threading.Event) -> None:
        """Tick on a fixed schedule (not drifting with the time a tick takes) until ``stop``."""
        next_at = self._clock()
        while not stop.is_set():
            self.tick()
            next_at += self._interval
            now = self._clock()
            if next_at < now:  # a slow round: skip the missed slots rather than burst
                next_at = now + self._interval
            stop.wait(next_at - now)


def main(args: argparse.Namespace) -> int:
    """The ``gpuportal agent`` handler; raises ``PortalError`` (incl. ``NoDriver``) to the CLI."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = load_agent_settings(
        portal_url=args.portal_url,
        node_name=args.node_name,
        interval_s=args.interval_s,
        kubernetes=args.kubernetes,
        prometheus_url=args.prometheus,
    )
    if args.demo and settings.prometheus_url:
        raise InvalidRequest(
            "--demo with --prometheus", "both", "one source: NVML, demo or Prometheus"
        )
    if settings.token is None and not args.stdout:
        raise InvalidRequest(
            "GPUPORTAL_AGENT_TOKEN", "unset", "a portal API token (or --stdout to only print)"
        )
    source, close = _source(settings, demo=args.demo)
    stop = threading.Event()
    with httpx.Client(base_url=settings.portal_url, timeout=settings.timeout_s) as client:
        reporter = Reporter(
            client,
            settings.token.get_secret_value() if settings.token else "",
            max_batches=settings.buffer_batches,
        )
        agent = (
            Agent(source, _print, interval_s=settings.interval_s)
            if args.stdout
            else Agent(
                source,
                reporter.submit,
                partial(reporter.flush, FLUSH_LIMIT),
                interval_s=settings.interval_s,
            )
        )
        try:
            if args.once:
                agent.tick()
                return 0 if args.stdout or reporter.pending == 0 else 1
            _stop_on_signals(stop)
            agent.run(stop)
            if not args.stdout and not reporter.flush():  # one last try before exiting
                log.warning("exiting with %d batch(es) not delivered", reporter.pending)
        except KeyboardInterrupt:
            pass
        finally:
            close()
    return 0


def _ignore(node: Node) -> None:
    return None


def _print(batch: SampleBatch) -> None:
    print(batch.model_dump_json(exclude_none=True), flush=True)


def _source(settings: AgentSettings, *, demo: bool) -> tuple[BatchSource, Callable[[], None]]:
    if demo:
        from portal.inventory import simulated

        return DemoSource(simulated.load_demo()), lambda: None
    if settings.prometheus_url:
        from portal.telemetry.prometheus import PrometheusSource

        client = httpx.Client(base_url=settings.prometheus_url, timeout=settings.timeout_s)
        return PrometheusSource(client, hostname=settings.node_name), client.close
    pods: PodLookup | None = None
    on_discovered: Callable[[Node], object] = _ignore
    if settings.kubernetes:
        from kubernetes import config as k8s_config
        from kubernetes.client import CoreV1Api

        from portal.agent import kube

        if settings.node_name is None:
            raise InvalidRequest(
                "GPUPORTAL_AGENT_NODE_NAME",
                "unset",
                "the Node's name with --kubernetes (the downward API's spec.nodeName)",
            )
        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        core = CoreV1Api()
        pods = kube.NodePods(core, settings.node_name)
        on_discovered = partial(kube.write_annotation, core)
    source = NvmlSource(
        settings.node_name,
        ProcessAttributor(settings.proc_root, pods),
        rediscover_s=settings.rediscover_s,
        on_discovered=on_discovered,
    )
    try:
        node = source.start()
    except nvml.NoDriver as e:
        raise nvml.NoDriver(f"{e.message}; --demo samples simulated GPUs instead") from None
    print(
        f"gpuportal agent: {node.name}: {len(node.gpus)} GPU(s), reporting to "
        f"{settings.portal_url}",
        file=sys.stderr,
        flush=True,
    )
    return source, source.close


def _stop_on_signals(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
