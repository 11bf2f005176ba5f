"""``gpuportal serve``: the portal service process.

Start-up, in order: read where to listen and who may call (fail fast, before touching
anything); take the inventory's snapshot; open (and migrate) the store; start the allocator on
the snapshot (memory rebuilt from the database); apply the seed file; build the API; start the
loops; serve.

Shutdown on SIGTERM or SIGINT: uvicorn stops accepting connections and waits (up to
``shutdown_timeout_s``) for requests in flight — each ends with its transaction committed or
rolled back — then the loops stop after their round in progress, the inventory follower
stops, and the store closes. The process exits 0.

Other parts of the portal add their periodic work in ``register_loops``, one line each.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp

from policies.errors import InvalidRequest
from policies.inventory import Node
from policies.isolation import IsolationSettings
from policies.placement.scorers import policy as named_policy
from portal.agent import inprocess
from portal.alerting import wiring as alerting
from portal.alerting.service import BudgetSource
from portal.allocator import Allocator
from portal.api import cost as cost_api
from portal.api import create_app
from portal.api.auth import Authenticator
from portal.api.metrics import ServiceMetrics
from portal.errors import Unavailable
from portal.inference import service as inference_service
from portal.isolation import loop as isolation_loop
from portal.isolation.config import load_isolation_settings
from portal.jobs import service as job_service
from portal.kube import service as kube_loops
from portal.prestart import service as prestart_service
from portal.ray import service as ray_service
from portal.service import hubsync, logs, seed, startup, tokens
from portal.service.decisions import ReportingStore
from portal.service.inventory import Follower, source_factory
from portal.service.leader import Leadership, lead_or_stand_by
from portal.service.loops import Loops, LoopsCollector
from portal.settings import ENV_PREFIX, Settings
from portal.store.guard import AdvisoryLockGuard, WriterTaken
from portal.telemetry.service import Telemetry

log = logging.getLogger("portal.service")
COST_WARM_INTERVAL_S = 600.0

DEFAULT_IP = "127.0.0.1"
DEFAULT_PORT = 8090


@dataclass(frozen=True, slots=True)
class Plan:
    """Where the service listens and who may call it, from settings and the hub's environment
    (``JUPYTERHUB_SERVICE_URL``, ``JUPYTERHUB_SERVICE_PREFIX``, ``JUPYTERHUB_API_*``)."""

    ip: str
    port: int
    prefix: str
    authenticator: Authenticator


def plan(settings: Settings, environ: Mapping[str, str]) -> Plan:
    """Resolve the listening address, URL prefix and authenticator; settings win over the
    hub's environment.

    Raises:
        InvalidRequest: a malformed service URL or prefix, or no way to authenticate.
    """
    ip, port = DEFAULT_IP, DEFAULT_PORT
    service_url = environ.get("JUPYTERHUB_SERVICE_URL")
    if service_url:
        parts = urlsplit(service_url)
        try:
            port = parts.port or 80
        except ValueError:  # a port out of range or not a number
            port = 0
        if not parts.hostname or not port:
            raise InvalidRequest("JUPYTERHUB_SERVICE_URL", repr(service_url), "http://HOST:PORT")
        ip = parts.hostname
    prefix = settings.service_prefix or environ.get("JUPYTERHUB_SERVICE_PREFIX") or "/"
    if not prefix.startswith("/") or "//" in prefix:
        raise InvalidRequest(
            "setting GPUPORTAL_SERVICE_PREFIX", repr(prefix), "an absolute URL path like /x/y/"
        )
    hub = tokens.hub_api_url(settings.hub_api_url, environ)
    return Plan(
        ip=settings.service_ip or ip,
        port=settings.service_port or port,
        prefix="/" + prefix.strip("/") + "/" if prefix.strip("/") else "/",
        authenticator=tokens.build(settings.tokens_file, hub),
    )


def under_prefix(app: FastAPI, prefix: str) -> ASGIApp:
    """``app`` answering under ``prefix``: the hub's proxy forwards full paths
    (``/services/gpuportal/api/v1/...``) without stripping its prefix. Mounting sets the ASGI
    ``root_path``, so the OpenAPI document and its docs page name the prefixed URLs."""
    if prefix == "/":
        return app
    return Starlette(routes=[Mount(prefix.rstrip("/"), app=app)])


def register_loops(
    loops: Loops,
    allocator: Allocator,
    settings: Settings,
    isolation: IsolationSettings,
    alerts: alerting.AlertingSettings | None = None,
    budgets: BudgetSource | None = None,
) -> None:
    """The service's periodic work. Add yours here: ``loops.add(name, interval_s, work)``."""
    # Release cycles retry only a few queued workloads (the allocator's partial cycle); the
    # tick schedules the whole queue, ends preemption grace periods and refreshes ETAs.
    loops.add("allocator-tick", settings.tick_interval_s, allocator.tick)
    isolation_loop.register_for_service(loops, allocator, settings, isolation)
    kube_loops.register_for_service(loops, allocator, settings, isolation)
    alerting.register_for_service(loops, allocator, alerts, budgets=budgets)
    hubsync.register_for_service(
        loops,
        allocator,
        settings.hub_reconcile_interval_s,
        os.environ,
        min_age_s=settings.hub_reconcile_min_age_s,
    )
    _register_agent(loops, allocator, settings)


def _register_agent(loops: Loops, allocator: Allocator, settings: Settings) -> None:
    """On one GPU server the node agent runs inside the service: NVML samples of this host,
    or synthetic ones of a simulated inventory when asked for."""
    if settings.inventory == "nvml":
        inprocess.register(loops, Telemetry(allocator))
    elif settings.simulated_samples and settings.inventory != "kubernetes":
        inprocess.register_simulated(
            loops, Telemetry(allocator), lambda: allocator.inspect(lambda c: [s.node for s in c])
        )


def serve(settings: Settings, *, seed_file: Path | None = None) -> int:
    """Run the service until SIGTERM or SIGINT; returns the exit code (0 after a clean stop).

    Raises:
        PortalError: a setting, the seed file, the inventory or the database is unusable
            (nothing is served).
    """
    logs.configure(settings.log_format, settings.log_level)
    signals = StopSignals()
    signals.install()
    where = plan(settings, os.environ)
    seeds = seed.load(seed_file) if seed_file is not None else None
    # Read once, before anything starts (a bad file stops the service here), for the isolation
    # loop and the pod binder alike.
    isolation = load_isolation_settings(settings.isolation_file)
    alerts = alerting.load_alerting_settings()  # the rules' settings too: a bad one stops here
    leadership: Leadership | None = None
    if settings.leader_election == "lease":
        # Stand by (/ready 503) until this replica holds the Lease; losing it later stops
        # the service, which then exits 1 for the platform to restart it as a standby.
        leadership = lead_or_stand_by(
            settings, where.ip, where.port, where.prefix, lambda: signals.requested,
            lambda _why: signals.stop(),
        )  # fmt: skip
        if leadership is None:
            log.info("stopped while standing by")
            return 0
    follower = Follower(
        source_factory(settings.inventory),
        f"inventory {settings.inventory!r} (GPUPORTAL_INVENTORY)",
    )
    try:
        # The inventory first: a cluster that cannot be listed fails before any migration.
        nodes = follower.start()
        store = open_store(
            settings.database_url,
            wait_s=settings.lease_duration_s if leadership is not None else 0.0,
        )
        loops = Loops()
        try:
            code = _run(
                settings, isolation, alerts, where, seeds, store, nodes, follower, loops, signals
            )
        finally:
            loops.stop(settings.shutdown_timeout_s)
            follower.stop()
            store.close()
            log.info("stopped")
    finally:
        follower.stop()
        if leadership is not None:
            leadership.stop()
    if leadership is not None and leadership.lost is not None:
        return 1  # memory is not trusted past the Lease: restart as a standby
    return code


def _run(
    settings: Settings,
    isolation: IsolationSettings,
    alerts: alerting.AlertingSettings,
    where: Plan,
    seeds: list[seed.SeedTenant] | None,
    store: ReportingStore,
    nodes: list[Node],
    follower: Follower,
    loops: Loops,
    signals: StopSignals,
) -> int:
    if isinstance(store.guard, AdvisoryLockGuard):
        # Another writer wrote while this one was cut off: its memory is stale; stop, so the
        # platform restarts it and it rebuilds from the database.
        store.guard.on_fenced = lambda _reason: signals.stop()
    allocator = Allocator(store, policy=named_policy(settings.placement_policy))
    started_at = datetime.now(UTC)
    report = allocator.start(nodes)
    startup.raise_alerts(store, started_at)
    log.info(
        "allocator started on %d node(s); %d workload(s) lost with their nodes",
        len(nodes),
        len(report.node_lost),
        extra={"fields": {"nodes": len(nodes), "database": _safe_url(store)}},
    )
    if seeds is not None:
        seed.apply(allocator, seeds)
    metrics = ServiceMetrics(allocator)
    store.listeners.append(lambda outcome, _event: metrics.decided(outcome))
    job_controller = job_service.build_for_service(allocator, settings, isolation)
    service_controller = inference_service.build_for_service(allocator, settings, isolation)
    ray_controller = ray_service.build_for_service(allocator, settings)
    ray_jobs = ray_service.build_jobs_for_service(ray_controller, settings, isolation)
    app = create_app(
        allocator,
        where.authenticator,
        metrics=metrics,
        job_controller=job_controller,
        service_controller=service_controller,
        ray_controller=ray_controller,
        ray_job_controller=ray_jobs,
        ray_tokens=ray_service.ray_tokens(settings) if settings.inventory == "kubernetes" else None,
    )
    # Pre-started environments (off unless given a budget): the API answers with their plan
    # and a spawn adopts one; a request that queues wakes their loop at once.
    prestart = prestart_service.build_for_service(allocator, settings)
    app.state.prestart = prestart
    if prestart is not None:
        store.listeners.append(prestart.on_decision)
        prestart_service.register(loops, prestart)
    accounting = cost_api.configure(app, settings)
    # Price the month at once, then keep it priced: no viewer pays for a cold month.
    loops.add("cost-warm", COST_WARM_INTERVAL_S, accounting.warm, first_after_s=0)
    app.state.loops = loops
    metrics.registry.register(LoopsCollector(loops))
    # Money budgets (the pricing file's) feed the budget_burn rule.
    register_loops(loops, allocator, settings, isolation, alerts, accounting.budget_samples)
    job_service.register_for_service(loops, job_controller)
    inference_service.register_for_service(loops, service_controller)
    ray_service.register_for_service(loops, ray_controller, ray_jobs, settings, isolation)
    # Once every setting was read and accepted (a bad one stops the service with one line).
    given = settings_report(settings, alerts)
    log.info(
        "settings given: %s",
        ", ".join(f"{k}={v}" for k, v in given.items()) or "none (defaults)",
        extra={"fields": {"settings": given}},
    )
    follower.follow(allocator)
    # What is loaded by now (modules, the inventory, allocator state) lives as long as the
    # process: kept out of the collector's generations, full collections stop walking it
    # (at 10,000 GPUs each walk cost requests ~0.2 s).
    gc.collect()
    gc.freeze()
    loops.start()
    server = uvicorn.Server(
        uvicorn.Config(
            under_prefix(app, where.prefix),
            host=where.ip,
            port=where.port,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=math.ceil(settings.shutdown_timeout_s),
        )
    )
    if signals.requested:
        log.info("stop requested while starting: not serving")
        return 0
    signals.server = server
    log.info(
        "serving on http://%s:%d%s",
        where.ip,
        where.port,
        where.prefix,
        extra={"fields": {"ip": where.ip, "port": where.port, "prefix": where.prefix}},
    )
    server.run()
    signals.requested = True  # uvicorn re-raises the signal it handled: nothing left to do
    if not server.started:
        return 1  # uvicorn logged why (e.g. the port is taken)
    log.info("requests finished; stopping loops and closing the store")
    return 0


class StopSignals:
    """SIGTERM and SIGINT for the whole life of the process.

    While starting, a signal only marks the stop as requested: the step in progress finishes
    (each commits whole) and the service stops before serving. While uvicorn serves it handles
    the signals itself (graceful shutdown) and afterwards re-raises them to the handlers that
    were there before it — these — so the loops and the store still close cleanly and the exit
    code is 0 rather than death by the signal.
    """

    def __init__(self) -> None:
        self.requested = False
        self.server: uvicorn.Server | None = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._handle)

    def _handle(self, sig: int, _frame: FrameType | None) -> None:
        if not self.requested:
            log.info("%s: stopping", signal.Signals(sig).name)
        self.stop()

    def stop(self) -> None:
        """Stop as a signal would (from any thread)."""
        self.requested = True
        if self.server is not None:
            self.server.should_exit = True


_MASKED = ("url", "secret", "password")


def settings_report(*models: Settings | alerting.AlertingSettings) -> dict[str, str]:
    """The settings given to this process (environment or flags) with the values in effect, by
    variable name; values that may hold credentials (URLs, secrets) show as ``(set)``."""
    report = {}
    for model in models:
        for name in sorted(model.model_fields_set):
            value = getattr(model, name)
            hidden = any(m in name for m in _MASKED) or name.endswith(("_token", "_key"))
            shown = "(set)" if hidden else _plain(value)
            report[f"{ENV_PREFIX}{name.upper()}"] = shown
    return dict(sorted(report.items()))


def _plain(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def open_store(url: str, *, wait_s: float = 0.0) -> ReportingStore:
    """Connect to the database (creating a SQLite file's directory) and migrate it.
    ``wait_s``: how long to retry while another process holds the writer guard (a newly
    elected leader waits out its predecessor's exit).

    Raises:
        Unavailable: the database does not accept connections or cannot be migrated.
        WriterTaken: another serve is this database's writer.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                # The writer guard: a second serve on this database refuses (WriterTaken).
                return ReportingStore(url, writer_guard=True)
            except WriterTaken:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
    except SQLAlchemyError as exc:
        shown = parsed.render_as_string(hide_password=True)
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise Unavailable(f"database {shown} (GPUPORTAL_DATABASE_URL) unusable: {reason}") from exc


def _safe_url(store: ReportingStore) -> str:
    return store.engine.url.render_as_string(hide_password=True)
