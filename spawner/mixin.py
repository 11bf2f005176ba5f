"""``GPUPortalMixin``: what every gpuportal spawner does with the portal, whatever runs the server.

Contract for backends (``GPULocalSpawner``, ``GPUKubeSpawner``)
-------------------------------------------------------------

Put the mixin first: ``class GPUKubeSpawner(GPUPortalMixin, KubeSpawner)``. The mixin

- builds the options form at request time (``get_options_form``) from the portal's offers for each
  of the user's tenants (hub groups the portal knows), and reads it back (``options_from_form``);
- checks ``user_options`` on every spawn, from the form or the REST API (``checked_choice``, run
  as the hub's ``apply_user_options`` right before ``start()``, or by ``start()`` itself when a
  deployment sets its own hook): only ``{"tenant", "option"}``, a tenant the user is in, an
  option the operator offers and the tenant may use; anything else fails the spawn with HTTP 400
  (403 for a forbidden tenant or option) and a message that says what is valid;
- in ``start()``: requests the devices on the user's behalf (the idempotency key is this server's
  spawn key, kept in the spawner state), waits in the portal's queue while reporting progress
  events with position, reason and ETA, gives up after ``max_queue_wait`` (withdrawing the
  request), sets ``self.allocation`` and only then calls the backend's ``start()`` (``super()``)
  under the backend's own ``start_timeout``;
- releases the allocation (or leaves the queue) exactly once when the server stops, fails to
  start, is found dead by a poll, or its spawn is cancelled: in ``run_post_stop_hook``, which the
  hub runs after every stop, and on cancellation of ``start()``;
- keeps ``workload_id``, the spawn key and the allocation in ``get_state``/``load_state``, so a
  restarted hub finds a running server's allocation and a re-spawn finds its queue place.

Backends read ``self.allocation`` (a ``GPUAllocation``, set before their ``start()`` runs and
kept while the server runs) to pin the server to its devices, and must not override ``start``,
``stop``, ``run_post_stop_hook``, ``get_state``, ``load_state``, ``clear_state`` or ``progress``
without calling ``super()``. ``progress()`` yields the queue events, then the backend's own.

JupyterHub interplay: while queued, ``pending`` is ``"queued"`` instead of ``"spawn"``, so waits
in the portal's queue do not count against ``JupyterHub.concurrent_spawn_limit`` (which would
otherwise block every other user's spawn); for the same reason the hub's ``start_timeout`` is
raised to ``max_queue_wait`` plus the backend's ``start_timeout`` for each spawn, and the
backend's own limit is applied to its ``start()`` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from jupyterhub.spawner import Spawner
from tornado import web
from traitlets import Float, List, Unicode, default

from policies.errors import Forbidden, InvalidRequest, NotFound, PortalError
from portal.api.schemas import WorkloadOut
from portal.errors import PortalUnreachable
from portal.store.records import WorkloadState
from portal.waits import duration
from spawner import options as forms
from spawner.portal_api import SpawnerPortal

STATE_KEY = "gpuportal"
QUEUED = "queued"


@dataclass(frozen=True, slots=True)
class GPUAllocation:
    """The devices a server runs on, as the portal allocated them (empty for CPU only).

    ``gpu_uuids`` are GPU (or MIG instance) UUIDs where the inventory knows them; ``milli`` is
    1000 per whole GPU, the share of one GPU otherwise; ``gpu_memory_mib`` bounds a share.
    """

    workload_id: str
    tenant: str
    option: str
    label: str
    flavor: str | None = None
    node: str = ""
    gpus: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    mig_profile: str | None = None
    milli: int = 0
    gpu_memory_mib: int = 0

    @classmethod
    def of(cls, workload: WorkloadOut, choice: forms.Choice) -> GPUAllocation:
        a = workload.allocations[0]
        return cls(
            workload_id=workload.id,
            tenant=workload.tenant,
            option=choice.offer.key,
            label=choice.offer.label,
            flavor=a.flavor or None,
            node=a.node,
            gpus=tuple(a.gpus),
            gpu_uuids=tuple(a.gpu_uuids),
            mig_profile=a.mig_profile,
            milli=a.milli,
            gpu_memory_mib=a.gpu_memory_mib,
        )

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> GPUAllocation:
        fields = {k: state[k] for k in cls.__dataclass_fields__ if k in state}
        for key in ("gpus", "gpu_uuids"):
            fields[key] = tuple(fields.get(key, ()))
        return cls(**fields)


class GPUPortalMixin(Spawner):  # type: ignore[misc]  # jupyterhub is untyped
    """A spawner whose servers run on devices the gpuportal allocator chose (see the module
    docstring for the contract with backends)."""

    portal_url = Unicode(
        "",
        config=True,
        help="""Base URL of the portal API (e.g. http://127.0.0.1:8010/services/gpuportal/).

        Default: the hub-managed service named `portal_service_name` in
        `c.JupyterHub.services` (its `url` plus `/services/<name>/`), else $GPUPORTAL_URL.""",
    )
    portal_api_token = Unicode(
        "",
        config=True,
        help="""Token the spawner sends to the portal; it needs the portal scopes
        workloads:write, workloads:read and queue:read for every tenant
        (`spawner.hubconfig.spawner_role`).

        Default: the `api_token` of the hub service named `spawner_service_name` in
        `c.JupyterHub.services`, else $GPUPORTAL_API_TOKEN.""",
    )
    portal_service_name = Unicode(
        "gpuportal",
        config=True,
        help="Name of the portal's hub-managed service, for the default `portal_url`.",
    )
    spawner_service_name = Unicode(
        "gpuportal-spawner",
        config=True,
        help="Name of the hub service whose token the spawner uses, for the default token.",
    )
    offered_options = List(
        Unicode(),
        default_value=[],
        config=True,
        help="""Option keys to offer, in this order (e.g. ["gpu:H100-80GB:1",
        "mig:A100-80GB:3g.40gb", "cpu"]); empty: everything the inventory supports.
        Keys not offered are refused, also through the REST API.""",
    )
    max_queue_wait = Float(
        3600.0,
        config=True,
        help="""Seconds a spawn may wait in the portal's queue before it is withdrawn with a
        message saying so. Separate from `start_timeout`, which bounds the server's own start
        once its devices are allocated.""",
    )
    queue_poll_interval = Float(
        2.0, config=True, help="Seconds between queue checks while a spawn waits."
    )
    portal_timeout = Float(
        10.0, config=True, help="Seconds to wait for one answer of the portal API."
    )

    # Not traits: per-spawn bookkeeping, persisted through get_state.
    allocation: GPUAllocation | None = None
    workload_id: str | None = None
    spawn_key: str | None = None
    spawn_for: str | None = None  # "<tenant>/<option key>" the spawn key was made for
    _queued = False
    _applied: tuple[dict[str, Any], forms.Choice] | None = None  # by apply_user_options
    _events_changed: asyncio.Event | None = None
    _backend_start_timeout: float | None = None
    _raised_start_timeout: int | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._events: list[dict[str, Any]] = []

    @default("options_from_form")
    def _default_options_from_form(self) -> Callable[..., Any]:
        return _options_from_form

    @default("apply_user_options")
    def _default_apply_user_options(self) -> Callable[..., Any]:
        return _apply_user_options

    # ------------------------------------------------------------------ portal access

    def portal(self) -> SpawnerPortal:
        """A client for one conversation with the portal (close it after use)."""
        url, token = self.portal_url, self.portal_api_token
        service = self._hub_service(self.portal_service_name)
        if not url and service.get("url"):
            url = f"{str(service['url']).rstrip('/')}/services/{self.portal_service_name}/"
        token = token or str(self._hub_service(self.spawner_service_name).get("api_token") or "")
        token = token or os.environ.get("GPUPORTAL_API_TOKEN", "")
        return SpawnerPortal(url or None, token or None, timeout=self.portal_timeout, retries=2)

    def _hub_service(self, name: str) -> dict[str, Any]:
        """The entry of ``c.JupyterHub.services`` called ``name`` ({} if none)."""
        for svc in self.config.JupyterHub.get("services", []) or []:
            if isinstance(svc, dict) and svc.get("name") == name:
                return svc
        return {}

    def user_groups(self) -> list[str]:
        """The user's hub groups, sorted: the candidate tenants."""
        return sorted(g.name for g in self.user.groups)

    async def tenant_offers(self) -> list[forms.TenantOffers]:
        """Offers for each of the user's groups the portal knows as a tenant."""
        async with self.portal() as portal:
            found = await asyncio.gather(
                *(self._offers_or_none(portal, g) for g in self.user_groups())
            )
        return [t for t in found if t is not None]

    async def _offers_or_none(self, portal: SpawnerPortal, group: str) -> forms.TenantOffers | None:
        try:
            got = await portal.offers(group)
        except NotFound:
            return None  # a hub group that is not a portal tenant
        return forms.TenantOffers(group, forms.filter_offers(got, self.offered_options))

    # ------------------------------------------------------------------ the form

    async def get_options_form(self) -> str:
        """The form, built now from the live offers (see ``spawner.options``)."""
        try:
            tenants = await self.tenant_offers()
        except PortalError as exc:
            raise _http_error(exc) from exc
        # The hub keeps the previous spawn's user_options: preselect what was picked then.
        return forms.render_form(tenants, last=self.user_options or {})

    async def checked_choice(self, user_options: Mapping[str, Any]) -> forms.Choice:
        """``user_options`` checked against the live offers; raises ``web.HTTPError`` 400
        (invalid) or 403 (forbidden) with the reason, or 503 if the portal does not answer."""
        try:
            quick = await self._quick_choice(user_options)
            if quick is not None:
                return quick
            tenants = await self.tenant_offers()
            return forms.choose(
                user_options,
                [t.tenant for t in tenants],
                {t.tenant: t.offers for t in tenants},
                user=self.user.name,
            )
        except PortalError as exc:
            raise _http_error(exc) from exc

    async def _quick_choice(self, user_options: Mapping[str, Any]) -> forms.Choice | None:
        """The common case on the spawn path, decided with one offer: well-formed options
        naming one of the user's groups (or the only one) and an option the operator offers.
        None when anything is off: the full check then says what and why."""
        groups = self.user_groups()
        tenant, key = user_options.get("tenant") or "", user_options.get("option")
        if not tenant and len(groups) == 1:
            tenant = groups[0]
        offered = not self.offered_options or key in self.offered_options
        if set(user_options) - set(forms.USER_OPTION_KEYS) or tenant not in groups:
            return None
        if not isinstance(key, str) or not offered:
            return None
        async with self.portal() as portal:
            try:
                got = await portal.offers(tenant, [key])
            except NotFound:
                return None
        picked = {"tenant": tenant, "option": key}
        try:
            return forms.choose(picked, [tenant], {tenant: got}, user=self.user.name)
        except PortalError:
            return None

    # ------------------------------------------------------------------ lifecycle

    @property
    def pending(self) -> str | None:
        # While waiting in the portal's queue the spawn is not consuming the hub: report it as
        # "queued" so concurrent_spawn_limit (which counts "spawn") does not block others.
        got: str | None = super().pending
        if got == "spawn" and self._queued:
            return QUEUED
        return got

    async def run_pre_spawn_hook(self) -> None:
        # The hub bounds start() by start_timeout, read right after this hook: make room for
        # the queue wait, and keep the configured value (or the one an operator's
        # pre_spawn_hook just set) for the backend's own start.
        got = super().run_pre_spawn_hook()
        if asyncio.iscoroutine(got) or isinstance(got, asyncio.Future):
            await got
        current = float(getattr(self, "start_timeout", 60))
        if self._raised_start_timeout is None or current != self._raised_start_timeout:
            self._backend_start_timeout = current
        backend = self._backend_start_timeout or current
        self._raised_start_timeout = int(self.max_queue_wait + backend)
        setattr(self, "start_timeout", self._raised_start_timeout)  # noqa: B010
        self._events = []
        self._events_changed = asyncio.Event()

    async def start(self) -> Any:
        applied = self._applied
        self._applied = None
        if applied is not None and applied[0] == dict(self.user_options):
            choice = applied[1]
        else:  # an operator's own apply_user_options hook ran instead of ours
            choice = await self.checked_choice(self.user_options)
        if choice.offer.devices.kind is None:
            self.allocation = GPUAllocation("", choice.tenant, choice.offer.key, choice.offer.label)
            self._emit(20, f"{choice.offer.label}: no GPU needed")
        else:
            try:
                workload = await self._allocate(choice)
            except asyncio.CancelledError:
                await self._release("spawn cancelled")
                raise
            self.allocation = GPUAllocation.of(workload, choice)
            self._emit(40, f"Allocated {self.allocation.label}: {_where(self.allocation)}")
        self._save_state()
        timeout = self._backend_start_timeout or float(self.start_timeout)
        return await asyncio.wait_for(super().start(), timeout=timeout)

    async def _allocate(self, choice: forms.Choice) -> WorkloadOut:
        """Request the devices and wait until they are allocated, reporting the queue."""
        wanted = f"{choice.tenant}/{choice.offer.key}"
        if self.spawn_key is not None and self.spawn_for != wanted:
            # A spawn interrupted (hub restart) left a request for something else: withdraw it.
            await self._release(f"replaced by a request for {wanted}")
            if self.spawn_key is not None:
                raise web.HTTPError(
                    503, "The GPU portal did not withdraw this server's earlier request; retry"
                )
        if self.spawn_key is None:
            self.spawn_key = f"{self.user.name}/{self.name or 'default'}/{uuid.uuid4().hex}"
            self.spawn_for = wanted
        started = time.monotonic()
        last = ""
        try:
            async with self.portal() as portal:
                workload = await portal.request_for(
                    self.user.name,
                    choice.tenant,
                    choice.offer.devices,
                    name=f"{self.user.name}/{self.name or 'default'}",
                    idempotency_key=self.spawn_key,
                    option=choice.offer.key,
                )
                self.workload_id = workload.id
                self._save_state()
                while workload.state is WorkloadState.QUEUED:
                    self._queued = True
                    said = forms.queued_message(
                        choice.tenant,
                        choice.offer.label,
                        workload.tenant_position,
                        workload.position,
                        workload.message,
                        workload.eta_s,
                        workload,
                    )
                    if said != last:
                        self._emit(10, said)
                        last = said
                    if time.monotonic() - started > self.max_queue_wait:
                        await portal.cancel(workload.id)
                        self._forget()
                        raise web.HTTPError(
                            429,
                            f"Gave up after waiting {_seconds(self.max_queue_wait)} "
                            f"(max_queue_wait) in {choice.tenant}'s queue for "
                            f"{choice.offer.label}; last: {said}. The request was withdrawn: "
                            "try again later or pick an option available now.",
                        )
                    await asyncio.sleep(self.queue_poll_interval)
                    workload = await portal.status(workload.id)
        except PortalError as exc:
            raise _http_error(exc) from exc
        finally:
            self._queued = False
        if workload.state is not WorkloadState.RUNNING or not workload.allocations:
            self._forget()
            raise web.HTTPError(
                409,
                f"The portal ended the request for {choice.offer.label} "
                f"({workload.state.value}: {workload.reason or workload.message})",
            )
        return workload

    async def stop(self, now: bool = False) -> Any:
        """The backend's stop; the allocation is released after it, in the post-stop hook."""
        return await super().stop(now=now)

    async def poll(self) -> int | None:
        """The backend's poll, unchanged (no side effects: a dead server is released when the
        hub stops it, in the post-stop hook)."""
        status: int | None = await super().poll()
        return status

    async def run_post_stop_hook(self) -> None:
        # The hub runs this after every stop: a normal stop, a failed start, a server a poll
        # found dead, an interrupted spawn. Release there, once.
        await self._release("server stopped")
        got = super().run_post_stop_hook()
        if asyncio.iscoroutine(got) or isinstance(got, asyncio.Future):
            await got

    async def _release(self, why: str) -> None:
        workload_id = self.workload_id
        if workload_id is None:
            self._forget()
            return
        try:
            async with self.portal() as portal:
                await portal.release(workload_id)
        except NotFound:
            pass  # already gone: nothing to release
        except PortalError:
            # Keep the id: the next stop retries, and the portal's reconciler releases
            # allocations of servers the hub no longer runs.
            self.log.exception("Could not release GPU workload %s (%s)", workload_id, why)
            return
        self.log.info("Released GPU workload %s of %s (%s)", workload_id, self._log_name, why)
        self._forget()

    def _forget(self) -> None:
        self.workload_id = None
        self.spawn_key = None
        self.spawn_for = None
        self.allocation = None

    # ------------------------------------------------------------------ progress

    def _emit(self, progress: int, message: str) -> None:
        self._events.append({"progress": progress, "message": message})
        self.log.info("%s: %s", self._log_name, message)
        if self._events_changed is not None:
            self._events_changed.set()

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """The queue's events (replayed from the start of this spawn), then the backend's."""
        seen = 0
        while True:
            events = self._events
            while seen < len(events):
                yield events[seen]
                seen += 1
            if self.allocation is not None or not self._spawn_pending:
                break
            changed = self._events_changed
            if changed is None:
                break
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=self.queue_poll_interval)
        async for event in super().progress():
            yield event

    # ------------------------------------------------------------------ state

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        ours: dict[str, Any] = {}
        if self.workload_id:
            ours["workload_id"] = self.workload_id
        if self.spawn_key:
            ours["spawn_key"] = self.spawn_key
            ours["spawn_for"] = self.spawn_for
        if self.allocation is not None:
            ours["allocation"] = self.allocation.to_state()
        if ours:
            state[STATE_KEY] = ours
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        ours = state.get(STATE_KEY) or {}
        self.workload_id = ours.get("workload_id")
        self.spawn_key = ours.get("spawn_key")
        self.spawn_for = ours.get("spawn_for")
        got = ours.get("allocation")
        self.allocation = GPUAllocation.from_state(got) if got else None

    def clear_state(self) -> None:
        super().clear_state()
        # A workload still held here failed to release: keep its id so the next stop retries.
        if self.workload_id is None:
            self._forget()

    def _save_state(self) -> None:
        """Persist our state now, mid-spawn: a hub restarted while queued keeps the spawn key
        (and so the queue place) and a started server's allocation."""
        orm = self.orm_spawner
        if orm is None or self.db is None:
            return
        orm.state = self.get_state()
        self.db.commit()


def _http_error(exc: PortalError) -> web.HTTPError:
    """The hub's error for a portal error: 400 invalid, 403 forbidden, else 503 (the portal
    refused or did not answer; nothing the user chose is to blame)."""
    if isinstance(exc, InvalidRequest):
        return web.HTTPError(400, str(exc))
    if isinstance(exc, Forbidden):
        return web.HTTPError(403, str(exc))
    if isinstance(exc, PortalUnreachable):
        return web.HTTPError(503, f"The GPU portal did not answer: {exc}")
    return web.HTTPError(503, f"The GPU portal refused the request: {exc}")


def _seconds(limit: float) -> str:
    return f"{limit:g} s" if limit < 60 else duration(limit)


def _where(a: GPUAllocation) -> str:
    devices = ", ".join(a.gpu_uuids) or ", ".join(map(str, a.gpus)) or "no GPU"
    return f"node {a.node}, {devices}" if a.node else devices


async def _options_from_form(
    form_data: Mapping[str, Sequence[str]], spawner: GPUPortalMixin
) -> dict[str, str]:
    """``options_from_form`` of gpuportal spawners: read the form, then check it at once so a
    bad choice re-renders the form with the reason."""
    chosen = forms.options_from_form(form_data)
    await spawner.checked_choice(chosen)
    return chosen


async def _apply_user_options(spawner: GPUPortalMixin, user_options: Mapping[str, Any]) -> None:
    """``apply_user_options`` of gpuportal spawners: the hub runs it on every spawn, just
    before ``start()``; without one it logs "Received unhandled user_options" each time. The
    options are checked here (a refusal fails the spawn with its reason) and ``start()`` uses
    the choice."""
    spawner._applied = (dict(user_options), await spawner.checked_choice(user_options))


def allocation_env(a: GPUAllocation) -> dict[str, str]:
    """``GPUPORTAL_*`` variables describing an allocation, for the server's environment."""
    env = {
        "GPUPORTAL_TENANT": a.tenant,
        "GPUPORTAL_OPTION": a.option,
        "GPUPORTAL_OPTION_LABEL": a.label,
    }
    if a.workload_id:
        env |= {
            "GPUPORTAL_WORKLOAD_ID": a.workload_id,
            "GPUPORTAL_FLAVOR": a.flavor or "",
            "GPUPORTAL_NODE": a.node,
            "GPUPORTAL_GPUS": ",".join(map(str, a.gpus)),
            "GPUPORTAL_GPU_UUIDS": ",".join(a.gpu_uuids),
            "GPUPORTAL_GPU_MILLI": str(a.milli),
        }
    if a.mig_profile:
        env["GPUPORTAL_MIG_PROFILE"] = a.mig_profile
    if a.gpu_memory_mib:
        env["GPUPORTAL_GPU_MEMORY_MIB"] = str(a.gpu_memory_mib)
    return env
