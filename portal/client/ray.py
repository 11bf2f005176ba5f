"""Ray clusters from Python: ``Portal().ray.up(...)`` returns the address for ``ray.init``.

::

    address = Portal().ray.up("team-a", workers=2, flavor="H100-80GB", max_workers=4)
    import ray
    ray.init(address=address)
    Portal().ray.scale(cluster_id, 4)   # +2 as a charged slice; waits with a reason if over quota
    Portal().ray.resume(cluster_id)     # after idle release: the previous size, through admission
    Portal().ray.down(cluster_id)       # every worker stopped, every GPU given back

On Kubernetes the heads want the cluster's token: ``Portal().ray.token(cluster_id).token``
as ``RAY_AUTH_TOKEN``, with ``RAY_AUTH_MODE=token``, in the environment before ``ray.init``.

The operations are built as the other client calls are (``portal.client.core``); ``up`` adds
waiting, which polls.
"""

from __future__ import annotations

import builtins
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from policies.errors import InvalidRequest
from portal.client import core, ray_jobs
from portal.client.core import API, Call, Op, _filters, _seg
from portal.errors import PortalError

if TYPE_CHECKING:
    from portal.api.jobs import JobCostOut, LogOut
    from portal.api.ray import RayCostOut, RayOut, RayTokenOut
    from portal.api.ray_jobs import RayJobOut
    from portal.api.schemas import DevicesIn
    from portal.client.sync import Portal


# ------------------------------------------------------------------ operations (no I/O)


def create(body: dict[str, Any]) -> Op[RayOut]:
    from portal.api.ray import RayOut

    # Not retried: a lost answer may have created the cluster.
    return (yield from core.one(Call("POST", f"{API}/ray", body=body), RayOut))


def get(cluster_id: str) -> Op[RayOut]:
    from portal.api.ray import RayOut

    call = Call("GET", f"{API}/ray/{_seg(cluster_id)}", idempotent=True)
    return (yield from core.one(call, RayOut))


def listed(page_size: int, tenant: str | None) -> Op[list[RayOut]]:
    from portal.api.ray import RayOut

    return (yield from core.every_page(f"{API}/ray", RayOut, page_size, _filters(tenant=tenant)))


def token(cluster_id: str) -> Op[RayTokenOut]:
    from portal.api.ray import RayTokenOut

    call = Call("GET", f"{API}/ray/{_seg(cluster_id)}/token", idempotent=True)
    return (yield from core.one(call, RayTokenOut))


def cost(cluster_id: str) -> Op[RayCostOut]:
    from portal.api.ray import RayCostOut

    call = Call("GET", f"{API}/ray/{_seg(cluster_id)}/cost", idempotent=True)
    return (yield from core.one(call, RayCostOut))


def costs(page_size: int, tenant: str | None, ended_since: datetime | None) -> Op[list[RayCostOut]]:
    from portal.api.ray import RayCostOut

    params = _filters(tenant=tenant, ended_since=ended_since)
    return (yield from core.every_page(f"{API}/ray/costs", RayCostOut, page_size, params))


def scale(cluster_id: str, workers: int) -> Op[RayOut]:
    from portal.api.ray import RayOut

    call = Call(
        "PATCH", f"{API}/ray/{_seg(cluster_id)}", body={"workers": workers}, idempotent=True
    )
    return (yield from core.one(call, RayOut))


def resume(cluster_id: str) -> Op[RayOut]:
    from portal.api.ray import RayOut

    # Not retried: a lost answer may have requested the slices.
    call = Call("POST", f"{API}/ray/{_seg(cluster_id)}/resume")
    return (yield from core.one(call, RayOut))


def delete(cluster_id: str) -> Op[RayOut]:
    from portal.api.ray import RayOut

    call = Call("DELETE", f"{API}/ray/{_seg(cluster_id)}", idempotent=True)
    return (yield from core.one(call, RayOut))


def body(
    tenant: str,
    *,
    workers: int,
    max_workers: int | None,
    devices: DevicesIn,
    name: str | None,
    head_cpus: int,
    worker_cpus: int,
    ray_version: str | None,
    idle_s: float | None,
    priority: int,
    idle_suspend: bool = False,
    autoscale: bool = False,
) -> dict[str, Any]:
    """The ``POST /ray`` body; the server checks every value and names the one wrong."""
    return {
        "tenant": tenant,
        "name": name or "ray",
        "head": {"cpus": head_cpus},
        "workers": {
            "devices": devices.model_dump(mode="json"),
            "min": workers,
            "max": max(1, workers) if max_workers is None else max_workers,
            "cpus": worker_cpus,
            "autoscale": autoscale,
        },
        "ray_version": ray_version,
        "idle_s": idle_s,
        "idle_suspend": idle_suspend,
        "priority": priority,
    }


# ------------------------------------------------------------------ the blocking API


class RayNotReady(PortalError):
    """``up`` gave up waiting: the cluster is still queued or starting (it keeps its place)."""

    code = "ray_not_ready"


class Ray:
    """``Portal().ray``: bring Ray clusters up, list, scale and take them down."""

    def __init__(self, portal: Portal) -> None:
        self._portal = portal

    def create(
        self,
        tenant: str,
        *,
        workers: int = 1,
        flavor: str | None = None,
        count: int = 1,
        milli: int = 0,
        gpu_memory_mib: int = 0,
        devices: DevicesIn | None = None,
        max_workers: int | None = None,
        name: str | None = None,
        head_cpus: int = 1,
        worker_cpus: int = 1,
        ray_version: str | None = None,
        idle_s: float | None = None,
        priority: int = 0,
        idle_suspend: bool = False,
        autoscale: bool = False,
    ) -> RayOut:
        """Ask for a cluster of ``workers`` workers (admitted with the head as one gang), each
        with ``count`` GPUs of ``flavor`` (or a MIG instance, a share, or any ``devices``),
        growing up to ``max_workers`` (default ``workers``). After ``idle_s`` seconds with
        nothing running, its workers are released (``idle_suspend``: the head too) until
        ``resume``. With ``autoscale``, GPU work Ray cannot schedule asks for more workers
        (up to ``max_workers``), each increase a slice of its own. Returns at once."""
        want = core.devices_for(
            flavor, count=count, milli=milli, gpu_memory_mib=gpu_memory_mib, devices=devices
        )
        sent = body(
            tenant,
            workers=workers,
            max_workers=max_workers,
            devices=want,
            name=name,
            head_cpus=head_cpus,
            worker_cpus=worker_cpus,
            ray_version=ray_version,
            idle_s=idle_s,
            priority=priority,
            idle_suspend=idle_suspend,
            autoscale=autoscale,
        )
        return self._portal._run(create(sent))

    def up(
        self,
        tenant: str,
        *,
        workers: int = 1,
        flavor: str | None = None,
        timeout_s: float | None = 600.0,
        poll_s: float = 2.0,
        **options: Any,
    ) -> str:
        """Create a cluster (``create``'s options) and wait until its head is up and every
        admitted worker has joined; returns the address for ``ray.init(address=...)``.

        Raises:
            RayNotReady: not usable within ``timeout_s`` (queued: see ``get(id).slices``).
        """
        info = self.create(tenant, workers=workers, flavor=flavor, **options)
        return self.wait(info.id, timeout_s=timeout_s, poll_s=poll_s)

    def wait(self, cluster_id: str, *, timeout_s: float | None = 600.0, poll_s: float = 2.0) -> str:
        """Poll until the cluster runs; returns its address."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            info = self.get(cluster_id)
            if info.state.value == "running" and info.address:
                return info.address
            if info.state.terminal:
                raise RayNotReady(f"Ray cluster {cluster_id} is {info.state.value}: {info.message}")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise RayNotReady(
                    f"Ray cluster {cluster_id} is not usable after {timeout_s:g} s: "
                    f"{info.state.value}, {info.message}"
                )
            time.sleep(poll_s if left is None else min(poll_s, left))

    def get(self, cluster_id: str) -> RayOut:
        return self._portal._run(get(cluster_id))

    def list(self, tenant: str | None = None) -> builtins.list[RayOut]:
        """Every cluster the token may read, in creation order."""
        return self._portal._run(listed(self._portal._page_size, tenant))

    def token(self, cluster_id: str) -> RayTokenOut:
        """The cluster's Ray token (its owner and the tenant's admins only). Where
        ``auth_mode`` is ``token``, set ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` to it
        in the environment before ``ray.init``."""
        return self._portal._run(token(cluster_id))

    def cost(self, cluster_id: str) -> RayCostOut:
        """The cluster's GPU-hours and money since it was created, slice by slice."""
        return self._portal._run(cost(cluster_id))

    def costs(
        self, tenant: str | None = None, *, ended_since: datetime | None = None
    ) -> builtins.list[RayCostOut]:
        """What ``cost`` answers, for every cluster the token may read in one paged read
        (stopped ones only if they ended at or after ``ended_since``, when given)."""
        return self._portal._run(costs(self._portal._page_size, tenant, ended_since))

    def scale(self, cluster_id: str, workers: int) -> RayOut:
        """Set the worker count: an increase is one new charged slice (it may wait with its
        reason), a decrease releases slices."""
        return self._portal._run(scale(cluster_id, workers))

    def resume(
        self, cluster_id: str, *, wait: bool = False, timeout_s: float | None = 600.0
    ) -> RayOut:
        """Ask for an idle or suspended cluster's previous size again, through admission (it
        may wait in the queue). ``wait``: until it runs again (a suspended cluster's head
        comes back at a new address: see the answer's ``address``).

        Raises:
            Conflict: the cluster is not idle or suspended.
        """
        info = self._portal._run(resume(cluster_id))
        if wait:
            self.wait(cluster_id, timeout_s=timeout_s)
            info = self.get(cluster_id)
        return info

    def down(self, cluster_id: str) -> RayOut:
        """Stop every node and release every slice (idempotent)."""
        return self._portal._run(delete(cluster_id))

    # -------------------------------------------------------------- jobs

    def submit(
        self,
        entrypoint: str,
        *,
        cluster_id: str | None = None,
        tenant: str | None = None,
        working_dir: str | None = None,
        env_vars: dict[str, str] | None = None,
        metadata: dict[str, str] | None = None,
        workers: int = 1,
        flavor: str | None = None,
        count: int = 1,
        devices: DevicesIn | None = None,
        priority: int = 0,
    ) -> RayJobOut:
        """Run ``entrypoint`` (a shell command line; ``RAY_ADDRESS`` is set, so ``ray.init()``
        joins the cluster) with ``working_dir`` and ``env_vars`` for it and its tasks.

        With ``cluster_id`` it runs on that cluster once it runs (an idle one is resumed).
        Without, it is a one-off job: a cluster of ``workers`` workers of ``flavor`` (or
        ``devices``) for ``tenant`` is admitted like any Ray cluster, and deleted when the
        job ends. Returns at once: see ``wait_job``.
        """
        cluster = None
        if cluster_id is None:
            if tenant is None:
                raise InvalidRequest("tenant", None, "the tenant of a one-off job, or cluster_id")
            want = core.devices_for(flavor, count=count, milli=0, gpu_memory_mib=0, devices=devices)
            cluster = body(
                tenant,
                workers=workers,
                max_workers=None,
                devices=want,
                name=None,
                head_cpus=1,
                worker_cpus=1,
                ray_version=None,
                idle_s=None,
                priority=priority,
            )
        sent = ray_jobs.body(
            entrypoint,
            working_dir=working_dir,
            env_vars=env_vars,
            metadata=metadata,
            cluster=cluster,
        )
        return self._portal._run(ray_jobs.submit(cluster_id, sent))

    def job(self, job_id: str) -> RayJobOut:
        return self._portal._run(ray_jobs.get(job_id))

    def jobs(
        self, tenant: str | None = None, cluster_id: str | None = None
    ) -> builtins.list[RayJobOut]:
        """Every Ray job the token may read (of one cluster), in submission order."""
        return self._portal._run(ray_jobs.listed(self._portal._page_size, tenant, cluster_id))

    def stop_job(self, job_id: str) -> RayJobOut:
        """Stop the driver; a one-off job's cluster is deleted with it (idempotent)."""
        return self._portal._run(ray_jobs.stop(job_id))

    def job_logs(self, job_id: str, *, attempt: int | None = None, offset: int = 0) -> LogOut:
        """The driver's output from ``offset`` (follow with the answer's ``next_offset``)."""
        return self._portal._run(ray_jobs.logs(job_id, attempt, offset))

    def job_cost(self, job_id: str) -> JobCostOut:
        """A one-off job's GPU-hours and money (its cluster's slices)."""
        return self._portal._run(ray_jobs.cost(job_id))

    def wait_job(
        self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 2.0
    ) -> RayJobOut:
        """Poll until the job ended (succeeded, failed or cancelled); returns it.

        Raises:
            RayNotReady: it had not ended within ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            info = self.job(job_id)
            if info.state.terminal:
                return info
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise RayNotReady(
                    f"Ray job {job_id} has not ended after {timeout_s:g} s: "
                    f"{info.state.value}, {info.message}"
                )
            time.sleep(poll_s if left is None else min(poll_s, left))
